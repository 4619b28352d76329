"""The segment writer: records framed, placed in segments, written, and noted for the next sync (one thread).

    append_many(csns, lines) ─► encode_frames (C) ─► pending ──┐ FLUSH_BYTES, or begin_sync
                                                               ▼
                       flush ─► segment_for(csn): the last segment, or roll to a new one
                             ─► place: as many frames as fit, the sparse index after them
                             ─► write: one os.write of the chunk, one of its index entries
                                        └─► the segment marked dirty: the next SyncPoint covers it
    append_parts(csn, parts) ─► its head, the CRC taken part by part ─► flush, segment_for, its
                                index entry ─► one writev of the head and the parts (no join)

The records' bytes are the C encoder's; the writer decides only where they
go.  Appends pile up in memory and are written in one chunk per segment,
so a group commit costs a write per segment and an fsync, not a write per
record.  A segment is rolled only once the one before it is durable to its
last byte (see `_roll`), so a power loss can tear only the newest segment.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Final

from csnd.changelog import record as rec
from csnd.changelog import segment as sg
from csnd.changelog.sync import SyncPoint
from csnd.core.durable import sync_directory

# Appends pile up in memory until sync(), or until this much is pending, when
# they are written (still invisible) so that memory stays bounded between syncs.
FLUSH_BYTES: Final = 1 << 20
# A record given in parts (`append_parts`) below this size is joined and appended as any
# other: a copy costs less than a write of its own.
PARTS_MIN_BYTES: Final = 64 << 10


class SegmentWriter:
    """Appends framed records to the newest segment, rolling to a new one once it is full."""

    def __init__(
        self,
        directory: str,
        segments: list[sg.Segment],
        *,
        segment_bytes: int,
        interval: int,
        clock: Callable[[], float],
        guard: Callable[[Callable[[], None]], None],
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.interval = interval
        self._clock = clock
        self._guard = guard
        self.segments = segments  # oldest first, the one appended to last
        self.fd = -1  # the active segment, appended to
        self.index_fd = -1  # its index file
        self.closed = False
        self.pending: list[bytes] = []
        self._pending_meta: list[tuple[int, int]] = []  # (csn, time_us)
        self._pending_bytes = 0
        self.dirty: list[sg.Segment] = []  # written to since the last begin_sync
        self.sealed_fds: list[int] = []  # rolled-over segments, closed once fsynced
        self._dir_dirty = False
        # The csn of a record being appended in pieces (csnd.changelog.pieces): nothing else until it ends.
        self.open_csn: int | None = None
        last = segments[-1] if segments else None
        self.appended_csn = last.last_csn if last else 0
        self.link = last.link if last else 0  # the crc of the last record appended: what the next names
        self.unsynced_csns: list[int] = []  # appended since the last begin_sync
        self.unsynced_lines: list[bytes | None] = []  # their payloads (None: appended in pieces)

    def open_active(self, seg: sg.Segment) -> None:
        self.fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
        self.index_fd = os.open(seg.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def check_open(self) -> None:
        """Raise unless a record may be appended now: the changelog is open and no record is open in pieces."""
        if self.closed:
            raise ValueError("append to a closed changelog")
        if self.open_csn is not None:
            raise ValueError(f"changelog record of csn {self.open_csn} is still open")

    def check_next(self, csn: int) -> None:
        """`check_open`, and `csn` may follow what is appended (csns only increase)."""
        self.check_open()
        if not 0 < csn <= rec.MAX_U64 or csn <= self.appended_csn:
            raise ValueError(f"changelog append of csn {csn} after csn {self.appended_csn}: not increasing")

    def append_many(self, csns: Sequence[int], lines: Sequence[bytes]) -> None:
        """Buffer transactions' lines, in CSN order, with one time of appending; a bad one raises after those before it."""
        self.check_open()
        t = int(self._clock() * 1_000_000)
        last = self.appended_csn
        # One compiled call encodes the run; it stops before a record that may not follow.
        frames = rec.encode_frames(csns, lines, t, last, rec.MAX_PAYLOAD, self.link)
        n = len(frames)
        if n:
            self.link = rec.frame_crc(frames[-1])
            self.pending += frames
            self._pending_meta += zip(csns[:n], itertools.repeat(t))
            self.unsynced_csns += csns[:n]
            self.unsynced_lines += lines[:n]
            self._pending_bytes += sum(map(len, frames))
            self.appended_csn = last = csns[n - 1]
        if n < len(csns):
            csn = csns[n]
            if not 0 < csn <= rec.MAX_U64 or csn <= last:
                raise ValueError(f"changelog append of csn {csn} after csn {last}: not increasing")
            raise ValueError(
                f"changelog record of csn {csn} is {len(lines[n])} bytes, over {rec.MAX_PAYLOAD}"
            )
        if self._pending_bytes >= FLUSH_BYTES:
            self._guard(self.flush)

    def append_parts(self, csn: int, parts: Sequence[bytes]) -> None:
        """Buffer one transaction's line given as `parts` (the line is their concatenation), as `append_many`.

        A large one is not joined nor framed by copying: its head is made
        with the CRC taken part by part, and the head and the parts go to the
        segment in one writev, after what is pending (a snapshot chunk is
        megabytes, and the join and the frame were two copies of it).  The
        bytes, the index entry and the rules are `append_many`'s: invisible
        until a sync, and a crash in the middle of the write leaves a torn
        tail that the next open cuts.
        """
        length = sum(map(len, parts))
        if length < PARTS_MIN_BYTES:
            self.append_many((csn,), (b"".join(parts),))
            return
        self.check_next(csn)
        if length > rec.MAX_PAYLOAD:
            raise ValueError(f"changelog record of csn {csn} is {length} bytes, over {rec.MAX_PAYLOAD}")
        t = int(self._clock() * 1_000_000)
        head, _ = rec.encode_parts_head(csn, t, parts, self.link)

        def step() -> None:
            self.flush()  # (what is pending goes first: it comes before this record)
            seg = self.segment_for(csn)
            offset, first_new = seg.written, len(seg.index_csns)
            if not seg.index_offs or offset - seg.index_offs[-1] >= self.interval:  # (as `_place`)
                seg.index_csns.append(csn)
                seg.index_offs.append(offset)
            seg.written = offset + rec.FRAME_HEAD + length
            seg.w_last_csn, seg.w_last_time = csn, t
            self.write(seg, [head, *parts], first_new, vectored=True)

        self._guard(step)
        self.link = rec.frame_crc(head)
        self.appended_csn = csn
        self.unsynced_csns.append(csn)
        self.unsynced_lines.append(None)  # (not kept whole for the tail: readers read it from its segment)

    def begin_sync(self) -> SyncPoint | None:
        """Writes what is pending and notes what an fsync now covers; None when nothing is new."""
        self._guard(self.flush)
        dirty, self.dirty = self.dirty, []
        if not dirty:
            return None
        point = SyncPoint(
            sealed_fds=self.sealed_fds,
            fd=self.fd,
            directory_of=self.segments[-1].path if self._dir_dirty else None,
            segments=[
                (seg, seg.written, seg.w_last_csn, seg.w_last_time, len(seg.index_csns)) for seg in dirty
            ],
            csns=self.unsynced_csns,
            lines=self.unsynced_lines,
        )
        self.sealed_fds, self._dir_dirty, self.unsynced_csns = [], False, []
        self.unsynced_lines = []
        return point

    def flush(self) -> None:
        """Write the pending records, each into the segment it falls in."""
        if not self.pending:
            return
        frames, meta = self.pending, self._pending_meta
        self.pending, self._pending_meta, self._pending_bytes = [], [], 0
        starts = list(itertools.accumulate(map(len, frames), initial=0))  # (where each starts among them)
        placed = 0
        while placed < len(frames):
            placed = self._place(self.segment_for(meta[placed][0]), frames, meta, starts, placed)

    def segment_for(self, csn: int) -> sg.Segment:
        """The segment the record of `csn` goes into: the last, or a new one (its header written) once it is full."""
        seg = self.segments[-1] if self.segments else None
        # (a segment of an older format version is not appended to: its records are framed otherwise)
        if seg is None or (
            (seg.written >= self.segment_bytes or seg.frames is not rec.CURRENT) and seg.w_last_csn
        ):
            seg = self._roll(csn)
            self.write(seg, [rec.encode_header(rec.SegmentHeader(seg.seq, seg.first_csn, seg.prev_csn))], 0)
        return seg

    def _place(
        self, seg: sg.Segment, frames: list[bytes], meta: list[tuple[int, int]], starts: list[int], first: int
    ) -> int:
        """Write `frames[first:]` into `seg` up to the first that would start past its size; the index after it.

        `starts[k]` is where frame k starts among the frames (`starts[-1]` where
        they end).  The first always goes in (`segment_for` chose the segment
        for it), and each after it that starts below `segment_bytes`: a segment
        passes its size by one record at most.  The index takes each record
        `interval` bytes or more after the last indexed one (`record.sparse`),
        found by bisecting: a step per index entry, not per record (one-row
        transactions: a loop per record was a twentieth of `csnd serve`).
        """
        shift = seg.written - starts[first]  # (frame k starts at starts[k] + shift in the segment)
        end = bisect_left(starts, self.segment_bytes - shift, first + 1, len(frames))
        new_entries = len(seg.index_csns)
        index_csns, index_offs = seg.index_csns, seg.index_offs
        k = first
        if not index_offs:
            index_csns.append(meta[k][0])
            index_offs.append(starts[k] + shift)
            k += 1
        while (k := bisect_left(starts, index_offs[-1] + self.interval - shift, k, end)) < end:
            index_csns.append(meta[k][0])
            index_offs.append(starts[k] + shift)
            k += 1
        seg.written = starts[end] + shift
        seg.w_last_csn, seg.w_last_time = meta[end - 1]
        self.write(seg, frames[first:end], new_entries)
        return end

    def write(
        self, seg: sg.Segment, chunk: list[bytes], first_new_entry: int, *, vectored: bool = False
    ) -> None:
        """Append `chunk` to the active segment and its index entries from `first_new_entry` on; mark it dirty.

        `vectored`: with writev, not joined (a few large parts; many small ones are joined).
        """
        path = seg.path
        try:
            if vectored:
                _writev_all(self.fd, chunk)
            else:
                view = memoryview(b"".join(chunk))
                while view:
                    view = view[os.write(self.fd, view) :]
            entries = rec.encode_index_entries(
                seg.index_csns[first_new_entry:], seg.index_offs[first_new_entry:]
            )
            if entries:
                path = seg.index_path
                os.write(self.index_fd, entries)
        except OSError as e:  # (os.write names no file: the error line does)
            raise OSError(e.errno, e.strerror, path) from e
        if seg not in self.dirty:
            self.dirty.append(seg)

    def _roll(self, first_csn: int) -> sg.Segment:
        """Start a new segment for `first_csn`, once the old one is durable to its last byte.

        The fsync comes before the new file exists, so a power loss can tear
        only the newest segment, whose torn tail the next open cuts.  Left to
        the next sync(), the old segment's unsynced tail could be lost while
        the new segment's first records reached the disk: a sealed segment
        cut short, which no open can tell from damage.  It costs one fsync
        per segment, of what the last sync did not cover.
        """
        prev = self.segments[-1] if self.segments else None
        if prev is not None:
            os.fsync(self.fd)
        seq = prev.seq + 1 if prev else 1
        seg = sg.Segment(self.directory, rec.SegmentHeader(seq, first_csn, prev.w_last_csn if prev else 0))
        fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        index_fd = os.open(seg.index_path, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o644)
        os.write(index_fd, rec.INDEX_MAGIC)
        if prev is not None:
            self.sealed_fds.append(self.fd)
            os.close(self.index_fd)
        self.fd, self.index_fd = fd, index_fd
        self.segments.append(seg)  # its header goes out with its first chunk
        self._dir_dirty = True
        return seg

    def unroll(self, seg: sg.Segment) -> None:
        """Remove the newest segment, which holds no record, and append to the one before it again.

        Its fd is not closed here but left to the next sync, as a rolled-over
        segment's is: a sync running now may be fsyncing it.  The directory is
        fsynced at once: a segment that came back after a crash would share
        its sequence number with the next one made.
        """
        self.segments.pop()
        self.sealed_fds.append(self.fd)
        os.close(self.index_fd)
        self.fd = self.index_fd = -1
        if seg in self.dirty:
            self.dirty.remove(seg)
        os.unlink(seg.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.index_path)
        sync_directory(seg.path)
        if self.segments:
            self.open_active(self.segments[-1])

    def remove_all(self) -> None:
        """Close every file and remove every segment and its index (the changelog is being cleared)."""
        self.close_files()
        for seg in self.segments:
            os.unlink(seg.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(seg.index_path)

    def reset(self) -> None:
        """No segment, nothing appended: as a new changelog's writer (after `remove_all`)."""
        self.segments, self.dirty, self._dir_dirty = [], [], False
        self.appended_csn = self.link = 0
        self.unsynced_csns, self.unsynced_lines = [], []

    def close_files(self) -> None:
        for fd in [*self.sealed_fds, self.fd, self.index_fd]:
            if fd >= 0:
                os.close(fd)
        self.sealed_fds, self.fd, self.index_fd = [], -1, -1

    def _check(self) -> None:
        segs = self.segments
        for seg in segs:
            seg._check()
        for a, b in itertools.pairwise(segs):
            assert b.seq == a.seq + 1 and b.prev_csn == a.w_last_csn and b.first_csn > a.w_last_csn
            assert a.end == a.written or a in self.dirty
        assert self.appended_csn == (
            self._pending_meta[-1][0] if self._pending_meta else segs[-1].w_last_csn if segs else 0
        )
        assert self._pending_bytes == sum(len(f) for f in self.pending)
        assert self.unsynced_csns == sorted(self.unsynced_csns)


def _writev_all(fd: int, parts: Sequence[bytes]) -> None:
    """Write all of `parts`, in order, with writev: again from where a short write stopped."""
    views = [memoryview(p) for p in parts if p]
    while views:
        n = os.writev(fd, views)
        while views and n >= len(views[0]):
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]
