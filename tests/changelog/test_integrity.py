"""Damage the changelog can find is found before anything is served, and its rarer write paths hold.

Opening checks every record of every segment (CRC, chain, CSN order), so a
byte flipped or a record cut out of a sealed segment is a ChangelogCorrupt
at open, never a service that calls itself ready and fails a consumer later.
Segments of format version 1 (no chained CRC) still read.  A large record
given up at the start of a segment, or written while a sync runs into an
empty changelog, leaves a changelog that appends on; a full disk under the
index or the relation store is the changelog's one error line (or, for the
index, which is only a hint, a warning).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd.changelog import Changelog
from csnd.changelog import record as rec
from csnd.core.errors import ChangelogCorrupt, OutputError
from tests.changelog.helpers import payload, record_offsets, segments, write_log
from tests.fixtures.disks import tmpfs

SEG = 400
INTERVAL = 64
RECORDS = [(c, payload(c)) for c in range(1, 41)]


def _sealed_log(d: str) -> tuple[str, dict[int, tuple[str, int]]]:
    """A log of several segments; the path of its first (sealed) one and where each record is."""
    write_log(d, RECORDS, segment_bytes=SEG, index_interval=INTERVAL).close()
    assert len(segments(d)) >= 3
    return os.path.join(d, segments(d)[0]), record_offsets(d, RECORDS)


def _in_first(where: dict[int, tuple[str, int]], first: str) -> list[int]:
    return [c for c, (p, _) in where.items() if p == first]


def test_a_flipped_byte_in_a_sealed_segment_is_found_at_open(tmp_path: Path) -> None:
    d = str(tmp_path)
    first, where = _sealed_log(d)
    # (before the segment's last index entry: not in the stretch after it that open used to check)
    victim = _in_first(where, first)[1]
    off = where[victim][1]
    data = bytearray(Path(first).read_bytes())
    data[off + rec.FRAME_HEAD + 2] ^= 0x01
    Path(first).write_bytes(bytes(data))
    with pytest.raises(ChangelogCorrupt, match="bad record crc") as caught:
        Changelog(d, segment_bytes=SEG, index_interval=INTERVAL)
    assert (caught.value.path, caught.value.offset) == (first, off)


def test_a_record_cut_out_of_a_sealed_segment_is_found_at_open(tmp_path: Path) -> None:
    d = str(tmp_path)
    first, where = _sealed_log(d)
    victim = _in_first(where, first)[1]
    a = where[victim][1]
    b = a + rec.FRAME_HEAD + len(payload(victim))
    data = Path(first).read_bytes()
    Path(first).write_bytes(data[:a] + data[b:])
    Path(first[: -len(".log")] + ".idx").unlink()  # (as a copy without its hint would be)
    with pytest.raises(ChangelogCorrupt, match="does not follow the record before it") as caught:
        Changelog(d, segment_bytes=SEG, index_interval=INTERVAL)
    assert (caught.value.path, caught.value.offset) == (first, a)


def _write_v1_segment(path: str, seq: int, prev_csn: int, records: list[tuple[int, bytes]]) -> None:
    header = rec.SegmentHeader(seq, records[0][0], prev_csn, version=1)
    body = b"".join(rec.encode_v1(c, 7, p) for c, p in records)
    Path(path).write_bytes(rec.encode_header(header) + body)


def test_a_version_1_changelog_reads_and_appends_go_on_in_a_new_segment(tmp_path: Path) -> None:
    d = str(tmp_path)
    old = [(c, payload(c)) for c in range(1, 6)]
    _write_v1_segment(os.path.join(d, rec.segment_name(1, 1)), 1, 0, old[:3])
    _write_v1_segment(os.path.join(d, rec.segment_name(2, 4)), 2, 3, old[3:])
    with Changelog(d, tail_bytes=0) as log:
        assert list(log.read(0)) == old
        assert list(log.read(2)) == old[2:]
        log.append(6, payload(6))
        log.sync()
        log._check()
    assert segments(d)[-1] == rec.segment_name(3, 6)  # (a version-1 segment gets no version-2 record)
    with Changelog(d, tail_bytes=0) as again:
        assert list(again.read(0)) == [*old, (6, payload(6))]
    with open(os.path.join(d, rec.segment_name(3, 6)), "rb") as f:
        assert rec.decode_header(f.read(rec.SEGMENT_HEAD)) == rec.SegmentHeader(3, 6, 5, version=2)


def test_a_damaged_version_1_segment_is_found_at_open(tmp_path: Path) -> None:
    d = str(tmp_path)
    old = [(c, payload(c)) for c in range(1, 6)]
    first = os.path.join(d, rec.segment_name(1, 1))
    _write_v1_segment(first, 1, 0, old[:3])
    _write_v1_segment(os.path.join(d, rec.segment_name(2, 4)), 2, 3, old[3:])
    data = bytearray(Path(first).read_bytes())
    data[rec.SEGMENT_HEAD + rec.FRAME_HEAD_V1 + 1] ^= 0x20  # (the first record's payload)
    Path(first).write_bytes(bytes(data))
    with pytest.raises(ChangelogCorrupt, match="bad record crc") as caught:
        Changelog(d)
    assert caught.value.offset == rec.SEGMENT_HEAD


def test_the_first_record_of_an_empty_changelog_in_pieces_lives_through_a_sync(tmp_path: Path) -> None:
    big = b'{"csn": 1, "pad": "' + b"x" * 100_000 + b'"}'
    with Changelog(str(tmp_path)) as log:
        log.start_record(1)
        log.write_record(big[:50_000])
        assert log.sync() == 0  # (a sync while it is written: nothing durable yet)
        log.write_record(big[50_000:])
        log.end_record()
        assert log.sync() == 1
        log._check()
    with Changelog(str(tmp_path)) as again:
        assert list(again.read(0)) == [(1, big)]


@pytest.mark.parametrize("synced_between", [False, True])
@pytest.mark.parametrize("first_ever", [False, True])
def test_a_record_given_up_at_a_segment_start_lets_appends_go_on(
    tmp_path: Path, first_ever: bool, synced_between: bool
) -> None:
    d = str(tmp_path)
    before = [] if first_ever else [(1, b"a" * 200)]
    with Changelog(d, segment_bytes=100) as log:
        for csn, line in before:
            log.append(csn, line)
        log.sync()
        log.start_record(2)  # (a new segment, named after csn 2)
        log.write_record(b"half of it")
        if synced_between:
            log.sync()
        log.abort_record()
        log._check()
        log.append(3, b'{"csn": 3}')
        assert log.sync() == 3
        log._check()
        assert list(log.read(0)) == [*before, (3, b'{"csn": 3}')]
    assert rec.segment_name(len(before) + 1, 2) not in os.listdir(d)
    with Changelog(d, segment_bytes=100) as again:
        assert list(again.read(0)) == [*before, (3, b'{"csn": 3}')]
        again.append(4, b"{}")
        again.sync()
        again._check()


@pytest.fixture
def small_disk() -> Iterator[str]:
    """A 1 MiB tmpfs of its own (we run as root; unmounted in teardown)."""
    with tmpfs("1m") as mnt:
        yield mnt


def _fill(directory: str) -> None:
    """Write a file until the disk is full."""
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
    with pytest.raises(OSError) as full, open(os.path.join(directory, "filler"), "ab", buffering=0) as f:
        f.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC


def test_an_index_that_cannot_be_written_on_a_full_disk_is_a_warning(
    small_disk: str, caplog: pytest.LogCaptureFixture
) -> None:
    d = os.path.join(small_disk, "log")
    write_log(d, RECORDS, segment_bytes=SEG, index_interval=INTERVAL).close()
    for name in segments(d):
        os.unlink(os.path.join(d, name[: -len(".log")] + ".idx"))
    _fill(small_disk)
    with (
        caplog.at_level(logging.WARNING, "csnd.changelog"),
        Changelog(d, segment_bytes=SEG, tail_bytes=0) as log,
    ):
        assert list(log.read(0)) == RECORDS
    assert "cannot write the index" in caplog.text and "ENOSPC" in caplog.text
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_a_relation_version_that_cannot_be_written_is_the_changelog_error_line(small_disk: str) -> None:
    d = os.path.join(small_disk, "log")
    with Changelog(d) as log:
        log.append(1, b'{"csn": 1}')
        log.sync()
        _fill(small_disk)
        body = '"schema": "public", "table": "t", "columns": [["id", "int4"]]'
        with pytest.raises(OutputError) as caught:
            log.relations.add(2, "dn1", body)
        assert str(caught.value) == (
            f"changelog {d}: cannot write {d}/relations.jsonl: No space left on device (ENOSPC); "
            f"nothing after csn 1 is durable or confirmed to a slot; free space in {d} (or give it more) "
            "and restart the service: the changelog reopens at its last durable record and the sources "
            "re-send the rest"
        )
        with pytest.raises(OutputError):  # (the record it is for must not go in without it)
            log.append(2, b'{"csn": 2}')
            log.sync()
