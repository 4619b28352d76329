"""Large records: appended in pieces as they are produced, read back in pieces, never held whole.

The oracle is the ordinary path: a log whose large records were streamed
(`start_record`, `write_record`, `end_record`) must be byte for byte the
log `append` writes from the same records at the same clock.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.changelog import Changelog, RecordPieces
from csnd.changelog import record as rec
from csnd.core.errors import ChangelogCorrupt
from tests.changelog.helpers import (
    FakeClock,
    TwoWayRecords,
    append_both_ways,
    cut,
    segment_files,
    two_way_records,
)


@given(st.binary(max_size=300), st.binary(max_size=3000))
def test_crc32_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    assert rec.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@given(
    st.integers(1, rec.MAX_U64),
    st.integers(0, rec.MAX_U64),
    st.binary(max_size=500),
    st.integers(0, 2**32 - 1),
)
def test_a_head_written_after_its_payload_is_the_head_encode_writes(
    csn: int, t: int, payload: bytes, prev: int
) -> None:
    head = rec.encode_head(csn, t, len(payload), zlib.crc32(payload), prev)
    assert head + payload == rec.encode(csn, t, payload, prev)


def _in_pieces(log: Changelog, csn: int, payload: bytes, cuts: list[int]) -> None:
    log.start_record(csn)
    for piece in cut(payload, cuts):
        log.write_record(piece)
    log.end_record()


@given(two_way_records, st.integers(1, 4))
def test_streamed_records_write_the_bytes_append_writes(
    tmp_path_factory: pytest.TempPathFactory, records: TwoWayRecords, sync_every: int
) -> None:
    plain, streamed = (str(tmp_path_factory.mktemp(n)) for n in ("plain", "streamed"))
    opts = {"segment_bytes": 1500, "index_interval": 200, "clock": FakeClock(), "monotonic": FakeClock()}
    with Changelog(plain, **opts) as a, Changelog(streamed, **opts) as b:  # type: ignore[arg-type]
        append_both_ways(a, b, records, sync_every, _in_pieces)
    assert segment_files(streamed) == segment_files(plain)


def test_a_large_record_is_read_in_pieces_and_whole(tmp_path: Path) -> None:
    big = b'{"csn": 2, "pad": "' + b"y" * 50_000 + b'"}'
    with Changelog(str(tmp_path)) as log:
        log.append(1, b'{"csn": 1}')
        log.start_record(2)
        for i in range(0, len(big), 4096):
            log.write_record(big[i : i + 4096])
        log.end_record()
        log.append(3, b'{"csn": 3}')
        log.sync()
        got = []
        for csn, payload in log.read_pieced(0, whole_up_to=1000):
            if isinstance(payload, RecordPieces):
                pieces = list(payload.pieces(7000))
                assert max(map(len, pieces)) == 7000
                got.append((csn, b"".join(pieces)))
            else:
                got.append((csn, payload))
        assert got == [(1, b'{"csn": 1}'), (2, big), (3, b'{"csn": 3}')]
        assert list(log.read(1, 2)) == [(2, big)]  # (read() hands every record whole)


def test_a_damaged_large_record_fails_before_its_first_piece(tmp_path: Path) -> None:
    big = b"z" * 20_000
    with Changelog(str(tmp_path)) as log:
        log.append(1, big)
        log.sync()
        seg = next(p for p in tmp_path.iterdir() if p.suffix == ".log")
        data = bytearray(seg.read_bytes())
        data[rec.SEGMENT_HEAD + rec.FRAME_HEAD + 15_000] ^= 1
        seg.write_bytes(bytes(data))
        records = log.read_pieced(0, whole_up_to=1000)
        _, payload = next(records)  # (valid while the reader stays on it)
        assert isinstance(payload, RecordPieces)
        handed: list[bytes] = []
        with pytest.raises(ChangelogCorrupt, match="bad record crc") as e:
            handed.extend(payload.pieces(1000))
        assert handed == []
        assert e.value.offset == rec.SEGMENT_HEAD


def test_a_record_cut_by_a_crash_is_a_torn_tail_cut_at_the_next_open(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path))
    log.append(1, b'{"csn": 1}')
    log.sync()
    log.start_record(2)
    log.write_record(b"half of a large transaction " * 1000)
    log.sync()  # (the sync thread may fsync the half: it must not be taken for a record)
    assert log.durable_csn == 1
    # kill -9 here: the files are left as they are (the lock goes with the process)
    for fd in (log._writer.fd, log._writer.index_fd, log._lock_fd):
        os.close(fd)
    with Changelog(str(tmp_path)) as again:
        assert list(again.read(0)) == [(1, b'{"csn": 1}')]
        again.append(2, b'{"csn": 2}')
        again.sync()
        assert [c for c, _ in again.read(0)] == [1, 2]


def test_an_abandoned_record_leaves_nothing_behind(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.append(1, b'{"csn": 1}')
        log.start_record(2)
        log.write_record(b"x" * 10_000)
        with pytest.raises(ValueError, match="csn 2 is still open"):
            log.append(3, b"{}")
        log.abort_record()
        log.append(2, b'{"csn": 2}')
        log.sync()
        log._check()
        assert list(log.read(0)) == [(1, b'{"csn": 1}'), (2, b'{"csn": 2}')]


def test_an_abandoned_first_record_of_a_segment_takes_its_segment_with_it(tmp_path: Path) -> None:
    # (more of this in tests/changelog/test_integrity.py: first segment ever, a sync in between)
    with Changelog(str(tmp_path), segment_bytes=100) as log:
        log.append(1, b"a" * 200)
        log.sync()
        log.start_record(2)  # (a new segment, named after csn 2)
        log.abort_record()
        log.append(3, b"{}")
        assert log.sync() == 3
    with Changelog(str(tmp_path), segment_bytes=100) as again:
        assert [c for c, _ in again.read(0)] == [1, 3]
