"""One segment file and its index: open and repair, verify, read records.

The I/O edge of the changelog: it reads files and hands their bytes to the
pure functions of `record.py`, and turns what they find into a repair (a
torn tail of the last segment, cut and logged) or a ChangelogCorrupt
(anything else).  Every segment is checked whole when the changelog opens
(each record's CRC, its link to the one before, CSN order), so damage a
scan can find stops the service before it serves anything; reads check each
record again as they go, for damage that comes later.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from bisect import bisect_right
from collections.abc import Iterator
from typing import Final

from csnd.changelog import record as rec
from csnd.changelog.crc import crc32
from csnd.core.errors import ChangelogCorrupt, IndexMismatch

log = logging.getLogger("csnd.changelog")

# Readers read a segment in chunks of this size: large enough that a read
# call carries many records (pread and the Python call cost per chunk are
# amortised), small enough that a reader of the tail holds little memory.
READ_CHUNK: Final = 1 << 20


class Segment:
    """A segment's identity, its sparse index, and how far it is written and durable.

    `written`, `w_last_csn`, `w_last_time` belong to the writer thread;
    `end`, `last_csn`, `last_time`, `durable_n` (the durable prefix of the
    index lists) change only under the changelog's lock, and readers copy
    them under it.  A rebuilt index replaces both lists at once.
    """

    __slots__ = (
        "durable_n",
        "end",
        "first_csn",
        "frames",
        "index_csns",
        "index_offs",
        "last_csn",
        "last_time",
        "link",
        "name",
        "opened_csns",
        "path",
        "prev_csn",
        "seq",
        "w_last_csn",
        "w_last_time",
        "written",
    )

    def __init__(self, directory: str, header: rec.SegmentHeader) -> None:
        self.name = rec.segment_name(header.seq, header.first_csn)
        self.path = os.path.join(directory, self.name)
        self.seq = header.seq
        self.first_csn = header.first_csn
        self.prev_csn = header.prev_csn
        self.frames = rec.FRAMES[header.version]
        self.link = 0  # the crc of its last record, as found at open (what the next record names)
        self.end = self.written = rec.SEGMENT_HEAD
        self.last_csn = self.w_last_csn = 0
        self.last_time = self.w_last_time = 0
        self.index_csns: list[int] = []
        self.index_offs: list[int] = []
        self.durable_n = 0
        self.opened_csns: list[
            int
        ] = []  # every record from the scan at open on (until the changelog takes them)

    @property
    def index_path(self) -> str:
        return self.path[: -len(".log")] + ".idx"

    def set_scanned(self, s: rec.Scan, index: tuple[list[int], list[int]]) -> None:
        """Take a whole scan of the file (opened state): everything in it is durable."""
        self.end = self.written = s.end
        self.last_csn = self.w_last_csn = s.csns[-1]
        self.last_time = self.w_last_time = s.times[-1]
        self.index_csns, self.index_offs = index
        self.durable_n = len(self.index_csns)
        self.opened_csns = s.csns
        self.link = s.crc

    @property
    def header(self) -> rec.SegmentHeader:
        return rec.SegmentHeader(self.seq, self.first_csn, self.prev_csn, self.frames.version)

    def _check(self) -> None:
        assert rec.SEGMENT_HEAD <= self.end <= self.written
        assert self.prev_csn < self.first_csn <= self.w_last_csn or self.written == rec.SEGMENT_HEAD
        assert (self.last_csn <= self.w_last_csn and self.last_time <= self.w_last_time) or not self.last_csn
        assert len(self.index_csns) == len(self.index_offs) and self.durable_n <= len(self.index_csns)
        if self.index_csns:
            assert self.index_csns[0] == self.first_csn and self.index_offs[0] == rec.SEGMENT_HEAD
            assert all(a < b for a, b in zip(self.index_csns, self.index_csns[1:], strict=False))
            assert all(a < b for a, b in zip(self.index_offs, self.index_offs[1:], strict=False))
            assert self.index_offs[-1] < self.written and self.index_csns[-1] <= self.w_last_csn


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_index(seg: Segment) -> None:
    """Write the index file anew (temp + rename: a reader never sees half of it).

    Not fsynced: the index is a hint rebuilt from the segment whenever it is
    missing or does not fit, so a crash costs a rebuild, never a record.
    For the same reason a write that fails (a full disk) is a warning, not
    an error: the index in memory is whole, and the next open rebuilds the
    file.
    """
    tmp = seg.index_path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(rec.encode_index(seg.index_csns, seg.index_offs))
        os.replace(tmp, seg.index_path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        code = errno.errorcode.get(e.errno or 0)
        log.warning(
            "changelog: cannot write the index of %s: %s%s; it is rebuilt from the segment at the next open",
            seg.path,
            e.strerror or e,
            f" ({code})" if code else "",
        )


def _mismatch(path: str, offset: int, csn: int) -> IndexMismatch:
    return IndexMismatch(f"no record of csn {csn} where the index puts it", path=path, offset=offset)


def _corrupt(path: str, offset: int, what: str) -> ChangelogCorrupt:
    return ChangelogCorrupt(
        f"{what}; the changelog is damaged before its tail and nothing after this point is served: "
        "restore the changelog directory from a copy, or truncate this file at this offset "
        "(dropping every later segment) if its records need not be kept",
        path=path,
        offset=offset,
    )


def _check_header(path: str, buf: bytes, seq: int, first_csn: int) -> rec.SegmentHeader:
    h = rec.decode_header(buf)
    if isinstance(h, str):
        raise _corrupt(path, 0, h)
    if (h.seq, h.first_csn) != (seq, first_csn):
        raise _corrupt(path, 0, f"header says sequence {h.seq} and first csn {h.first_csn}, unlike its name")
    if h.prev_csn >= h.first_csn:
        raise _corrupt(path, 0, f"header's previous csn {h.prev_csn} is not before its first {h.first_csn}")
    return h


def open_last(
    directory: str, name: str, seq: int, first_csn: int, interval: int, prev_crc: int | None = None
) -> Segment | None:
    """Open the newest segment, cutting a torn tail off (logged); None if nothing whole was left in it.

    Torn means: the bytes after the last whole record hold no intact record
    further on -- a write cut short by a crash, a record whose CRC fails at
    the very end, zeroes of a preallocated or half-flushed page.  A damaged
    record *followed* by an intact one is not a torn write of an append-only
    file, nor is an intact record that does not follow the one before it:
    both are corruption, and raised.  `prev_crc`: the crc of the last
    record of the segment before, when there is one.
    """
    path = os.path.join(directory, name)
    buf = _read_file(path)
    h = rec.decode_header(buf)
    if isinstance(h, str):
        # A header is written before any record and synced with the first
        # one: a torn header means the segment was being created at the crash.
        start = rec.SEGMENT_HEAD if len(buf) >= rec.SEGMENT_HEAD else 0
        if any(rec.find_record(buf, start, 0, f) is not None for f in rec.FRAMES.values()):
            raise _corrupt(path, 0, h)
        _remove(path, f"{h}, no whole record in it", len(buf))
        return None
    h = _check_header(path, buf, seq, first_csn)
    s = rec.scan(buf, rec.SEGMENT_HEAD, h.prev_csn, rec.FRAMES[h.version], prev_crc)
    if s.damage is not None and s.later is not None:
        raise _corrupt(path, s.end, f"{s.damage}, with an intact record after it at byte offset {s.later}")
    if s.misplaced:  # (a torn write leaves no whole record behind it, let alone one out of order)
        raise _corrupt(path, s.end, f"{s.damage}: an intact record out of place")
    if s.csns and s.csns[0] != h.first_csn:
        raise _corrupt(path, rec.SEGMENT_HEAD, f"first record has csn {s.csns[0]}, the name says {first_csn}")
    if not s.csns:
        _remove(path, f"{s.damage or 'empty'}, no whole record in it", len(buf))
        return None
    if s.end < len(buf):
        log.warning(
            "changelog: cut the torn tail of %s at byte offset %d: %d bytes removed (%s)",
            path,
            s.end,
            len(buf) - s.end,
            s.damage,
        )
        fd = os.open(path, os.O_WRONLY)
        try:
            os.ftruncate(fd, s.end)
            os.fsync(fd)
        finally:
            os.close(fd)
    seg = Segment(directory, h)
    seg.set_scanned(s, rec.sparse(s.csns, s.offsets, interval))
    write_index(seg)
    return seg


def _remove(path: str, why: str, size: int) -> None:
    log.warning(
        "changelog: removed the torn segment %s at byte offset 0: %d bytes removed (%s)", path, size, why
    )
    os.unlink(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path[: -len(".log")] + ".idx")


def open_sealed(
    directory: str, name: str, seq: int, first_csn: int, interval: int, prev_crc: int | None = None
) -> Segment:
    """Open a segment that is not the newest: every record verified, its index checked against them.

    Each record's CRC, its link to the one before (`prev_crc`: the last
    record of the segment before, when there is one) and CSN order: any
    damage is a ChangelogCorrupt here, before the service serves a record
    or calls itself ready, rather than for the first consumer who reads that
    far.  It costs a read of the whole changelog at open (the page cache
    usually holds the newest of it).  An index file that is missing or does
    not match the records is written anew (with a warning).
    """
    path = os.path.join(directory, name)
    buf = _read_file(path)
    h = _check_header(path, buf, seq, first_csn)
    seg = Segment(directory, h)
    s, index = scan_sealed(path, h, interval, prev_crc, buf)
    seg.set_scanned(s, index)
    seg.opened_csns = []  # (only the newest segment's are kept, for counting lag)
    stored = None
    with contextlib.suppress(FileNotFoundError):
        stored = rec.decode_index(_read_file(seg.index_path), first_csn, s.end)
    if stored != index:
        what = "missing or damaged" if stored is None else "its entries do not match the segment"
        log.warning("changelog: rebuilding the index of %s: %s", path, what)
        write_index(seg)
    return seg


def scan_sealed(
    path: str, h: rec.SegmentHeader, interval: int, prev_crc: int | None = None, buf: bytes | None = None
) -> tuple[rec.Scan, tuple[list[int], list[int]]]:
    """Every record of a sealed segment, verified; any damage is corruption."""
    if buf is None:
        buf = _read_file(path)
    s = rec.scan(buf, rec.SEGMENT_HEAD, h.prev_csn, rec.FRAMES[h.version], prev_crc)
    if s.damage is not None:
        raise _corrupt(path, s.end, f"{s.damage} in a segment that is not the newest")
    if not s.csns or s.csns[0] != h.first_csn:
        raise _corrupt(path, rec.SEGMENT_HEAD, f"segment does not start with its first csn {h.first_csn}")
    return s, rec.sparse(s.csns, s.offsets, interval)


def seek(csns: list[int], offs: list[int], n: int, after_csn: int) -> tuple[int, int]:
    """(offset, csn) of the last indexed record with csn <= after_csn (the first one if none)."""
    k = max(bisect_right(csns, after_csn, 0, n) - 1, 0)
    return offs[k], csns[k]


class RecordPieces:
    """A record too large to read whole (`Changelog.read_pieced`): its payload, read in pieces on demand.

    `pieces()` reads the payload twice: once to check its CRC, so damage is
    a ChangelogCorrupt before a byte of it is handed on (a consumer never
    gets half a transaction that turns out wrong), then again to hand it out
    piece by piece; from the page cache the second read is cheap beside
    what the consumer does with a gigabyte.  It reads through the segment
    reader's open file, so it is valid until that reader moves on to the
    next record (retention may unlink the file meanwhile: the open file
    still reads).
    """

    __slots__ = ("_fd", "_frames", "_head", "_offset", "csn", "length", "path", "record_offset")

    def __init__(
        self, fd: int, path: str, record_offset: int, head: rec.RecordHead, frames: rec.Frames = rec.CURRENT
    ) -> None:
        self._fd = fd
        self.path = path
        self.record_offset = record_offset
        self._frames = frames
        self._offset = record_offset + frames.head
        self._head = head
        self.length, self.csn = head.length, head.csn

    def pieces(self, size: int = READ_CHUNK) -> Iterator[bytes]:
        """The payload in pieces of at most `size` bytes (after its CRC is found right)."""
        crc = 0
        for piece in self._read(size):
            crc = crc32(piece, crc)
        if not self._frames.crc_matches(self._head, crc):
            raise _corrupt(
                self.path, self.record_offset, "bad record crc inside the durable part of the changelog"
            )
        yield from self._read(size)

    def read(self) -> bytes:
        """The payload whole (for a consumer that needs it so: a table filter)."""
        return b"".join(self.pieces())

    def _read(self, size: int) -> Iterator[bytes]:
        off, end = self._offset, self._offset + self.length
        while off < end:
            piece = os.pread(self._fd, min(size, end - off), off)
            if not piece:
                raise _corrupt(self.path, off, "record cut short inside the durable part of the changelog")
            off += len(piece)
            yield piece


def read_records(
    path: str,
    start: int,
    end: int,
    expect_csn: int,
    after_csn: int,
    until_csn: int | None,
    whole_up_to: int | None = None,
    frames: rec.Frames = rec.CURRENT,
) -> Iterator[tuple[int, bytes | RecordPieces]]:
    """Records of `path` in [start, end) with after_csn < csn (<= until_csn), each CRC- and link-checked.

    The record at `start` must be `expect_csn` (what the index said), else
    IndexMismatch before anything is yielded.  Raises FileNotFoundError if
    retention removed the file first; damage inside `end` (which is durable,
    so whole) is ChangelogCorrupt.  A record whose payload is longer than
    `whole_up_to` comes as RecordPieces (its CRC checked when it is read).
    A record whose csn does not follow the one before it, or that does not
    name the one before it as its predecessor (format version 2), is
    corruption too: open checked every record, so this is damage done since.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        off = start
        frame_at, head_at, ok, no_link = frames.frame_at, frames.head_at, rec.OK, rec.NO_LINK
        head = frames.head
        first, prev, link = True, 0, no_link
        while off < end:
            buf = os.pread(fd, min(READ_CHUNK, end - off), off)
            pos, size = 0, len(buf)
            while pos < size:
                status, csn, _, rend, crc, named = frame_at(buf, pos)
                # A large record is handed on unread, its CRC checked as it is read.
                found = (
                    head_at(buf, pos)
                    if whole_up_to is not None and rend - pos - head > whole_up_to and rend <= end - off
                    else None
                )
                if found is None and status != ok:
                    if status == rec.SHORT and pos > 0:
                        break  # the record goes on past this chunk: read again from it
                    if status == rec.SHORT and size < rend <= end - off:
                        buf = os.pread(fd, rend, off)  # one record larger than a chunk
                        if len(buf) == rend:
                            size = len(buf)
                            continue
                        status = rec.SHORT
                    if first:
                        raise _mismatch(path, off + pos, expect_csn)
                    what = "bad record" if status == rec.BAD else "record cut short"
                    raise _corrupt(path, off + pos, f"{what} inside the durable part of the changelog")
                if first:
                    if csn != expect_csn:
                        raise _mismatch(path, off + pos, expect_csn)
                    first = False
                elif csn <= prev:
                    raise _corrupt(
                        path, off + pos, f"record of csn {csn} follows csn {prev}: records out of order"
                    )
                elif named != link:
                    raise _corrupt(
                        path,
                        off + pos,
                        f"record of csn {csn} does not follow the record before it (its chained crc names "
                        "another): a record before it is missing, repeated or moved",
                    )
                prev = csn
                if named != no_link:
                    link = crc
                if csn > after_csn:
                    if until_csn is not None and csn > until_csn:
                        return
                    yield (
                        csn,
                        buf[pos + head : rend]
                        if found is None
                        else RecordPieces(fd, path, off + pos, found, frames),
                    )
                pos = rend
            if pos == 0:
                raise _corrupt(path, off, "record cut short inside the durable part of the changelog")
            off += pos
    finally:
        os.close(fd)
