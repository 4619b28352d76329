"""Changelog crash safety: a torn tail is cut (at every byte), damage before the tail is an error."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.changelog import record as rec
from csnd.core.errors import ChangelogCorrupt
from tests.changelog.helpers import (
    Records,
    expected,
    payload,
    record_lists,
    record_offsets,
    segments,
    write_log,
)

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
SEG = 400  # small segments: several per log, and a short last one to cut at every byte


def _copy_with_last(src: str, dst: str, last: str, data: bytes) -> None:
    os.makedirs(dst)
    for n in os.listdir(src):
        if n != last and n != "LOCK":
            shutil.copyfile(os.path.join(src, n), os.path.join(dst, n))
    with open(os.path.join(dst, last), "wb") as f:
        f.write(data)


@SETTINGS
@given(records=record_lists(min_size=1, max_size=12))
def test_cut_at_every_byte_of_the_last_segment(
    tmp_path_factory: pytest.TempPathFactory, records: Records
) -> None:
    """Every cut reopens to exactly the longest whole prefix, and the log takes appends after it."""
    src = str(tmp_path_factory.mktemp("whole"))
    write_log(src, records, segment_bytes=SEG).close()
    last = segments(src)[-1]
    with open(os.path.join(src, last), "rb") as f:
        data = f.read()
    where = record_offsets(src, records)
    # Thousands of small directories: in memory where there is a tmpfs (the
    # disk's journal made each unlink and truncate cost milliseconds).
    base = tempfile.mkdtemp(dir=SHM) if SHM else str(tmp_path_factory.mktemp("cuts"))
    for cut in range(len(data) + 1):
        d = os.path.join(base, str(cut))
        _copy_with_last(src, d, last, data[:cut])
        survivors = [
            (c, p)
            for c, p in records
            if where[c][0].endswith(last) is False or where[c][1] + rec.FRAME_HEAD + len(p) <= cut
        ]
        with Changelog(d, segment_bytes=SEG) as log:
            log._check()
            assert list(log.read(0)) == survivors, cut
            assert log.durable_csn == (survivors[-1][0] if survivors else 0)
            new = (records[-1][0] + 1, b"after the cut")
            log.append(*new)
            log.sync()
            log._check()
        with Changelog(d, segment_bytes=SEG) as log:
            assert list(log.read(0)) == [*survivors, new], cut
        shutil.rmtree(d)
    shutil.rmtree(base)


def test_torn_tail_is_cut_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    records = [(c, payload(c)) for c in range(1, 20)]
    write_log(str(tmp_path), records).close()
    (name,) = segments(str(tmp_path))
    path = os.path.join(str(tmp_path), name)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 5)
    with caplog.at_level(logging.WARNING, logger="csnd.changelog"), Changelog(str(tmp_path)) as log:
        assert list(log.read(0)) == records[:-1]
    last_off = record_offsets(str(tmp_path), records)[19][1]
    (msg,) = [r.getMessage() for r in caplog.records]
    assert path in msg and f"byte offset {last_off}" in msg and f"{size - 5 - last_off} bytes removed" in msg
    assert os.path.getsize(path) == last_off


@pytest.mark.parametrize("tail", ["zeros", "bad_crc_last", "garbage"])
def test_tails_that_are_torn_writes(tmp_path: Path, tail: str) -> None:
    """Zero-filled preallocation, a last record whose CRC fails, garbage after the last record: all cut."""
    records = [(c, payload(c)) for c in range(1, 20)]
    write_log(str(tmp_path), records).close()
    path = os.path.join(str(tmp_path), segments(str(tmp_path))[-1])
    with open(path, "r+b") as f:
        if tail == "zeros":
            f.seek(0, 2)
            f.write(bytes(64 << 10))
            keep = records
        elif tail == "bad_crc_last":
            f.seek(-3, 2)
            f.write(b"\x00\x01\x02")
            keep = records[:-1]
        else:
            f.seek(0, 2)
            f.write(os.urandom(3000).replace(rec.MARK, b"xxxx"))
            keep = records
    with Changelog(str(tmp_path)) as log:
        assert list(log.read(0)) == keep
        log._check()


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def _open_and_read_all(d: str) -> None:
    with Changelog(d, segment_bytes=SEG) as log:
        for _ in log.read(0):
            pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=record_lists(min_size=2, max_size=20), data=st.data())
def test_flipped_byte_before_the_tail_is_corruption(
    tmp_path_factory: pytest.TempPathFactory, records: Records, data: st.DataObject
) -> None:
    """A byte flipped in any record but the very last (or in any header): ChangelogCorrupt naming file and offset."""
    d = str(tmp_path_factory.mktemp("flip"))
    write_log(d, records, segment_bytes=SEG).close()
    where = record_offsets(d, records)
    victim = data.draw(st.sampled_from([c for c, _ in records[:-1]] + [0]), label="record (0: a header)")
    if victim:
        path, off = where[victim]
        length = rec.FRAME_HEAD + len(dict(records)[victim])
    else:
        path = os.path.join(d, data.draw(st.sampled_from(segments(d)), label="segment"))
        off, length = 0, rec.SEGMENT_HEAD
    _flip(path, off + data.draw(st.integers(0, length - 1), label="byte"))
    with pytest.raises(ChangelogCorrupt) as e:
        _open_and_read_all(d)
    assert (e.value.path, e.value.offset) == (path, off)
    assert f"{path}:" in str(e.value) and f"byte offset {off}" in str(e.value)


def test_damaged_record_followed_by_intact_ones_in_the_last_segment(tmp_path: Path) -> None:
    records = [(c, payload(c)) for c in range(1, 30)]
    write_log(str(tmp_path), records).close()
    path, off = record_offsets(str(tmp_path), records)[10]
    _flip(path, off + rec.FRAME_HEAD + 3)
    with pytest.raises(ChangelogCorrupt, match="bad record crc, with an intact record after it") as e:
        Changelog(str(tmp_path))
    assert (e.value.path, e.value.offset) == (path, off)
    assert os.path.getsize(path) > off  # nothing was cut
    with pytest.raises(ChangelogCorrupt):  # and the lock was released on the way out
        Changelog(str(tmp_path))


def test_sealed_segment_cut_short_or_missing(tmp_path: Path) -> None:
    records = [(c, payload(c)) for c in range(1, 120)]
    write_log(str(tmp_path), records, segment_bytes=2000).close()
    names = segments(str(tmp_path))
    assert len(names) >= 3
    mid = os.path.join(str(tmp_path), names[1])
    size = os.path.getsize(mid)
    with open(mid, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(ChangelogCorrupt, match="not the newest") as e:
        Changelog(str(tmp_path), segment_bytes=2000)
    assert e.value.path == mid
    os.unlink(mid)
    with pytest.raises(ChangelogCorrupt, match="missing") as e:
        Changelog(str(tmp_path), segment_bytes=2000)
    assert e.value.path == os.path.join(str(tmp_path), names[2])


def test_torn_segment_header_removes_the_new_segment(tmp_path: Path) -> None:
    """A crash while a new segment was being created leaves a torn header: that segment goes, the log reopens."""
    records = [(c, b"r" * 100) for c in range(1, 40)]
    write_log(str(tmp_path), records, segment_bytes=1000).close()
    names = segments(str(tmp_path))
    last = os.path.join(str(tmp_path), names[-1])
    with open(last, "r+b") as f:
        f.truncate(20)
    first_of_last = rec.parse_segment_name(names[-1])[1]  # type: ignore[index]
    with Changelog(str(tmp_path), segment_bytes=1000) as log:
        assert list(log.read(0)) == expected(records, 0, first_of_last - 1)
        assert not os.path.exists(last) and not os.path.exists(last[:-4] + ".idx")
        log.append(1000, b"next")
        log.sync()
        log._check()
        assert list(log.read(first_of_last - 2))[-1] == (1000, b"next")


def test_scan_pure_over_every_cut() -> None:
    """The pure scan alone: every cut of a buffer of records stops at the last whole one, with no later record."""
    frames = rec.encode_frames_py(range(1, 8), [payload(c) for c in range(1, 8)], 10, 0, rec.MAX_PAYLOAD, 0)
    buf = b"".join(frames)
    ends = [sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))]
    for cut in range(len(buf) + 1):
        s = rec.scan(buf[:cut], 0, 0)
        whole = [e for e in ends if e <= cut]
        assert s.end == (whole[-1] if whole else 0) and len(s.csns) == len(whole)
        assert (s.damage is None) == (s.end == cut) and s.later is None
