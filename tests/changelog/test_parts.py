"""A record appended in parts (`Changelog.append_parts`): the bytes `append` writes, with no join."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.changelog import Changelog, writer
from csnd.changelog import record as rec
from tests.changelog.helpers import (
    FakeClock,
    TwoWayRecords,
    append_both_ways,
    cut,
    segment_files,
    two_way_records,
)


def _parts(data: bytes, cuts: list[int]) -> list[bytes]:
    return cut(data, cuts) or [b""]


def _opts() -> dict[str, object]:
    return {"segment_bytes": 1500, "index_interval": 200, "clock": FakeClock(), "monotonic": FakeClock()}


def test_the_head_of_parts_is_the_head_encode_writes() -> None:
    parts = [b'{"csn": 7, ', b"", b'"changes": []}']
    head, n = rec.encode_parts_head(7, 1_700_000_000_000_000, parts, 0x1234_5678)
    assert n == sum(map(len, parts))
    assert head + b"".join(parts) == rec.encode(7, 1_700_000_000_000_000, b"".join(parts), 0x1234_5678)


@given(two_way_records, st.integers(1, 4), st.sampled_from([0, writer.PARTS_MIN_BYTES]))
def test_records_appended_in_parts_write_the_bytes_append_writes(
    tmp_path_factory: pytest.TempPathFactory,
    records: TwoWayRecords,
    sync_every: int,
    min_bytes: int,
) -> None:
    # (min_bytes 0: every record in parts takes the writev path, whatever its size; the default
    # joins these small ones: both must be `append`'s bytes, segments rolled and indexed alike)
    plain, parted = (str(tmp_path_factory.mktemp(n)) for n in ("plain", "parted"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer, "PARTS_MIN_BYTES", min_bytes)
        with Changelog(plain, **_opts()) as a, Changelog(parted, **_opts()) as b:  # type: ignore[arg-type]
            append_both_ways(
                a, b, records, sync_every, lambda log, csn, p, cuts: log.append_parts(csn, _parts(p, cuts))
            )
    assert segment_files(parted) == segment_files(plain)


def test_a_large_record_in_parts_is_written_without_a_join_and_read_whole(tmp_path: Path) -> None:
    big = [b'{"csn": 2, "changes": [', b"x" * (writer.PARTS_MIN_BYTES * 3), b'], "snapshot": {}}']
    plain, parted = tmp_path / "plain", tmp_path / "parted"
    with Changelog(str(plain), **_opts()) as a, Changelog(str(parted), **_opts()) as b:  # type: ignore[arg-type]
        for log in (a, b):
            log.append(1, b'{"csn": 1}')
        a.append(2, b"".join(big))
        b.append_parts(2, big)
        for log in (a, b):
            log.append(3, b'{"csn": 3}')
            log.sync()
        assert list(b.read(0)) == list(a.read(0))
    assert segment_files(str(parted)) == segment_files(str(plain))


def test_a_record_in_parts_is_visible_only_after_a_sync(tmp_path: Path) -> None:
    big = [b"a" * writer.PARTS_MIN_BYTES, b"b" * writer.PARTS_MIN_BYTES]
    with Changelog(str(tmp_path)) as log:
        log.append(1, b'{"csn": 1}')
        log.sync()
        log.append_parts(2, big)
        assert (log.visible_csn, log.durable_csn) == (1, 1)
        assert [c for c, _ in log.read(0)] == [1]
        log.sync()
        assert (log.visible_csn, log.durable_csn) == (2, 2)
        assert list(log.read(1)) == [(2, b"".join(big))]


def test_a_record_in_parts_cut_by_a_crash_is_a_torn_tail_cut_at_the_next_open(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path))
    log.append(1, b'{"csn": 1}')
    log.sync()
    log.append_parts(2, [b"head ", b"half of a large chunk " * 10_000, b" tail"])
    # kill -9 in the middle of the writev: only part of the record reached the file
    seg = next(p for p in tmp_path.iterdir() if p.suffix == ".log")
    os.truncate(seg, seg.stat().st_size - 100_000)
    for fd in (log._writer.fd, log._writer.index_fd, log._lock_fd):
        os.close(fd)
    with Changelog(str(tmp_path)) as again:
        assert list(again.read(0)) == [(1, b'{"csn": 1}')]
        again.append_parts(2, [b'{"csn": 2, ', b"y" * writer.PARTS_MIN_BYTES, b"}"])
        again.sync()
        assert [c for c, _ in again.read(0)] == [1, 2]


def test_a_bad_record_in_parts_is_refused_as_append_refuses_it(tmp_path: Path) -> None:
    big = [b"z" * writer.PARTS_MIN_BYTES]
    with Changelog(str(tmp_path)) as log:
        log.append_parts(5, big)
        with pytest.raises(ValueError, match="csn 5 after csn 5: not increasing"):
            log.append_parts(5, big)
        with pytest.raises(ValueError, match="csn 4 after csn 5: not increasing"):
            log.append(4, b"{}")
        log.sync()
        assert [c for c, _ in log.read(0)] == [5]
