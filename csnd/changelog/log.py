"""`Changelog`: append, group-commit, read from any CSN, retention; one writer thread, many readers.

    writer thread                       reader threads
    append(csn, line) ─► pending ─┐     read(after_csn) ─► snapshot of the durable view
    append ...                    │       bisect segment first CSNs ─► bisect its index
    sync() ─► write ─► fsync ─────┴─►     ─► pread chunks, CRC every record, stop at durable end
             (dir fsync if a segment     wait_durable(csn, timeout) wakes on each sync
              was created) ─► durable_csn, notify

Appends are buffered in memory (written early once FLUSH_BYTES pile up, but
never visible) and one sync() writes and fsyncs them all: group commit, so
the fsync rate, not the record rate, is what the disk pays for.  Readers see
a view of the segments that sync() and retention replace under the lock;
what is in the view is durable, and a record past it is never read.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from csnd.changelog import record as rec
from csnd.changelog import retention
from csnd.changelog import segment as sg
from csnd.changelog.clock import CLOCK_NAME, SteadyWall
from csnd.changelog.guard import WriteGuard
from csnd.changelog.lock import LOCK_NAME, take_lock
from csnd.changelog.opening import make_adopted_durable, open_segments
from csnd.changelog.recent import RecentCsns
from csnd.changelog.relations import RelationStore
from csnd.changelog.sync import Fsyncer, SyncPoint
from csnd.changelog.tail import DurableTail
from csnd.core.durable import sync_directory
from csnd.core.errors import (
    ChangelogCorrupt,
    ConfigError,
    CsnOutOfRange,
    IndexMismatch,
)
from csnd.core.hostid import host_id

# A new segment starts once the active one has grown past this.  Larger:
# fewer files and directory fsyncs; smaller: retention frees space in finer
# steps and the last segment (read whole on open, to find a torn tail) is
# quicker to check after a crash.
DEFAULT_SEGMENT_BYTES: Final = 64 << 20

# One index entry per this many bytes of segment.  A read from a CSN scans at
# most this much before its first record; the index costs 16 bytes per entry
# (0.4% of the segment at 4 KiB).
DEFAULT_INDEX_INTERVAL: Final = 4 << 10

# Appends pile up in memory until sync(), or until this much is pending, when
# they are written (still invisible) so that memory stays bounded between syncs.
FLUSH_BYTES: Final = 1 << 20

# How many of the newest durable CSNs are kept for counting a consumer's lag
# (count_after): 8 bytes each.  A count up to this many costs one bisection.
RECENT_CSNS: Final = 10_000

# The newest durable records' payloads kept in memory, for readers that keep up
# (`DurableTail`): served from there, a record costs no read and no CRC check.
TAIL_BYTES: Final = 16 << 20


@dataclass
class _OpenRecord:
    """A record being appended in pieces: where its head goes, and its payload's length and CRC so far."""

    csn: int
    time_us: int
    segment: sg.Segment
    offset: int  # of its head in the segment
    length: int = 0
    crc: int = 0


class Changelog:
    """The durable, CSN-ordered log of transactions in a directory of segment files."""

    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        retention_bytes: int | None = None,
        retention_hours: float | None = None,
        retention_hold_bytes: int | None = None,
        retention_hold_hours: float | None = None,
        clock: Callable[[], float] = time.time,
        index_interval: int = DEFAULT_INDEX_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
        recent_csns: int = RECENT_CSNS,
        tail_bytes: int = TAIL_BYTES,
    ) -> None:
        if segment_bytes <= 0 or index_interval <= 0:
            raise ConfigError("changelog segment size and index interval must be positive")
        self.directory = os.path.abspath(directory)
        self.segment_bytes = segment_bytes
        self.retention_bytes = retention_bytes
        self.retention_hours = retention_hours
        # How far past those consumers' holds may keep records (None: a multiple of them; retention.py).
        self.retention_hold_bytes = retention_hold_bytes
        self.retention_hold_hours = retention_hold_hours
        self._retention_limits()  # (a hold limit below its retention limit is refused here)
        self._clock = SteadyWall(clock, monotonic)
        self._interval = index_interval
        self._cond = threading.Condition(threading.Lock())
        self._rebuild_lock = threading.Lock()  # one reader at a time rebuilds a sealed segment's index
        self._closed = False
        self._guard = WriteGuard(self.directory, lambda: self._durable_csn)
        self._lock_fd = take_lock(self.directory)
        try:
            # The relation versions of its transactions (docs/design.md section 7), under the same lock.
            self.relations = RelationStore(self.directory, guard=self._guard)
            self._segments = open_segments(self.directory, self._interval)
            if self._segments:
                self._open_active(self._segments[-1])
                make_adopted_durable(self._segments, self._fd, self._guard)
        except BaseException:
            for fd in (self._fd, self._index_fd, self._lock_fd):
                if fd >= 0:
                    os.close(fd)
            raise
        # Writer state (writer thread only).
        self._pending: list[bytes] = []
        self._pending_meta: list[tuple[int, int]] = []  # (csn, time_us)
        self._pending_bytes = 0
        self._dirty: list[sg.Segment] = []
        self._sealed_fds: list[int] = []  # rolled-over segments, closed once fsynced
        self._dir_dirty = False
        self._open: _OpenRecord | None = None  # a record being appended in pieces
        last = self._segments[-1] if self._segments else None
        self._appended_csn = last.last_csn if last else 0
        # (the steady clock goes on from the last process's on this boot: csnd.changelog.clock)
        newest_us = max((s.last_time for s in self._segments), default=0)
        self._clock.resume(os.path.join(self.directory, CLOCK_NAME), host_id(), newest_us)
        self._link = last.link if last else 0  # the crc of the last record appended: what the next names
        self._fsyncer = Fsyncer(self._guard)
        # Reader view (replaced under the lock).
        self._view: tuple[sg.Segment, ...] = tuple(self._segments)
        self._durable_csn = self._appended_csn
        # The newest durable CSNs, for consumers' lag (count_after), from the newest segment's scan on.
        self._unsynced_csns: list[int] = []  # appended since the last begin_sync
        self._unsynced_lines: list[bytes | None] = []  # their payloads (None: appended in pieces)
        self._tail = DurableTail(tail_bytes, self._durable_csn)
        seed = last.opened_csns if last else []
        self._recent = RecentCsns(recent_csns, seed[0] - 1 if seed else 0, seed)
        self._reader_limit: int | None = None  # readers see no record past it (hold_readers)
        for seg in self._segments:
            seg.opened_csns = []

    _fd = -1  # the active segment, appended to
    _index_fd = -1  # its index file

    def _open_active(self, seg: sg.Segment) -> None:
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
        self._index_fd = os.open(seg.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    # -- writing (one writer thread) ----------------------------------------------

    def append(self, csn: int, line: bytes) -> None:
        """Buffer one transaction's line; invisible and not durable until sync()."""
        self.append_many((csn,), (line,))

    def append_many(self, csns: Sequence[int], lines: Sequence[bytes]) -> None:
        """Buffer transactions' lines, in CSN order, with one time of appending; as `append` each.

        A bad one raises, with the ones before it appended.
        """
        if self._closed:
            raise ValueError("append to a closed changelog")
        if self._open is not None:
            raise ValueError(f"changelog record of csn {self._open.csn} is still open")
        t = int(self._clock() * 1_000_000)
        last = self._appended_csn
        # One compiled call encodes the run; it stops before a record that may not follow.
        frames = rec.encode_frames(csns, lines, t, last, rec.MAX_PAYLOAD, self._link)
        n = len(frames)
        if n:
            self._link = rec.frame_crc(frames[-1])
            self._pending += frames
            self._pending_meta += zip(csns[:n], itertools.repeat(t))
            self._unsynced_csns += csns[:n]
            self._unsynced_lines += lines[:n]
            self._pending_bytes += sum(map(len, frames))
            self._appended_csn = last = csns[n - 1]
        if n < len(csns):
            csn = csns[n]
            if not 0 < csn <= rec.MAX_U64 or csn <= last:
                raise ValueError(f"changelog append of csn {csn} after csn {last}: not increasing")
            raise ValueError(
                f"changelog record of csn {csn} is {len(lines[n])} bytes, over {rec.MAX_PAYLOAD}"
            )
        if self._pending_bytes >= FLUSH_BYTES:
            self._guard(self._flush)

    # A transaction too large to hold whole is appended as it is produced:
    # start_record, write_record for each piece, end_record.  Its payload goes
    # straight to the segment behind a head of zeroes, which end_record
    # overwrites with the real head once the length and CRC are known; until
    # then the record is neither visible nor counted in what a sync covers,
    # and a crash in the middle leaves a torn tail that the next open cuts.

    def start_record(self, csn: int) -> None:
        """Begin the record of `csn`, its payload to come in pieces; no append until end_record."""
        if self._closed:
            raise ValueError("append to a closed changelog")
        if self._open is not None:
            raise ValueError(f"changelog record of csn {self._open.csn} is still open")
        if not 0 < csn <= rec.MAX_U64 or csn <= self._appended_csn:
            raise ValueError(f"changelog append of csn {csn} after csn {self._appended_csn}: not increasing")
        t = int(self._clock() * 1_000_000)

        def step() -> None:
            self._flush()  # (what is pending goes first: it comes before this record)
            seg = self._segment_for(csn)
            self._write(seg, [bytes(rec.FRAME_HEAD)], len(seg.index_csns))
            self._open = _OpenRecord(csn, t, seg, seg.written)

        self._guard(step)

    def write_record(self, piece: bytes) -> None:
        """Append a piece of the open record's payload (written at once, not yet visible)."""
        r = self._open
        if r is None:
            raise ValueError("no changelog record is open")
        if r.length + len(piece) > rec.MAX_PAYLOAD:
            raise ValueError(f"changelog record of csn {r.csn} is over {rec.MAX_PAYLOAD} bytes")

        def step() -> None:
            view = memoryview(piece)
            try:
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as e:
                raise OSError(e.errno, e.strerror, r.segment.path) from e

        self._guard(step)
        r.crc = zlib.crc32(piece, r.crc)
        r.length += len(piece)

    def end_record(self) -> None:
        """Write the open record's head: it is appended, as `append` would have (visible after a sync)."""
        r = self._open
        if r is None:
            raise ValueError("no changelog record is open")
        seg = r.segment
        head = rec.encode_head(r.csn, r.time_us, r.length, r.crc, self._link)

        def step() -> None:
            fd = os.open(seg.path, os.O_WRONLY)  # (pwrite on an O_APPEND file appends, on Linux)
            try:
                os.pwrite(fd, head, r.offset)
            finally:
                os.close(fd)
            first_new = len(seg.index_csns)
            if not seg.index_offs or r.offset - seg.index_offs[-1] >= self._interval:
                seg.index_csns.append(r.csn)
                seg.index_offs.append(r.offset)
            seg.written = r.offset + rec.FRAME_HEAD + r.length
            seg.w_last_csn, seg.w_last_time = r.csn, r.time_us
            self._write(seg, [], first_new)  # (its index entry, and the segment marked for the next sync)

        self._guard(step)
        self._open = None
        self._appended_csn = r.csn
        self._link = rec.frame_crc(head)
        self._unsynced_csns.append(r.csn)
        self._unsynced_lines.append(None)

    def abort_record(self) -> None:
        """Drop the open record (its transaction was given up): cut its bytes off the segment."""
        r = self._open
        if r is None:
            return
        self._open = None
        if r.segment.w_last_csn:
            self._guard(lambda: os.ftruncate(self._fd, r.offset))
        else:
            # The segment was started for this record, and is named after its csn: no other
            # record may be its first.  It goes, and the one before it is appended to again.
            self._guard(lambda: self._unroll(r.segment))

    def _unroll(self, seg: sg.Segment) -> None:
        """Remove the newest segment, which holds no record, and append to the one before it again.

        Its fd is not closed here but left to the next sync, as a rolled-over
        segment's is: a sync running now may be fsyncing it.  The directory is
        fsynced at once: a segment that came back after a crash would share
        its sequence number with the next one made.
        """
        self._segments.pop()
        self._sealed_fds.append(self._fd)
        os.close(self._index_fd)
        self._fd = self._index_fd = -1
        if seg in self._dirty:
            self._dirty.remove(seg)
        os.unlink(seg.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.index_path)
        sync_directory(seg.path)
        if self._segments:
            self._open_active(self._segments[-1])

    def sync(self) -> int:
        """Write what is pending, fsync it (and the directory for a new segment); returns durable_csn."""
        if self._closed:
            raise ValueError("sync of a closed changelog")
        point = self.begin_sync()
        if point is None:
            return self._durable_csn
        self.fsync(point)
        return self.finish_sync(point)

    # sync() in three steps, for a group commit that keeps appending while it
    # waits for the disk: begin_sync and finish_sync are quick and run where
    # append does (under the caller's lock, when append runs in another
    # thread); fsync, the slow part, runs without it.  One sync at a time.

    def begin_sync(self) -> SyncPoint | None:
        """Writes what is pending and notes what an fsync now covers; None when nothing is new."""
        self._guard(self._flush)
        dirty, self._dirty = self._dirty, []
        if not dirty:
            return None
        point = SyncPoint(
            sealed_fds=self._sealed_fds,
            fd=self._fd,
            directory_of=self._segments[-1].path if self._dir_dirty else None,
            segments=[
                (seg, seg.written, seg.w_last_csn, seg.w_last_time, len(seg.index_csns)) for seg in dirty
            ],
            csns=self._unsynced_csns,
            lines=self._unsynced_lines,
        )
        self._sealed_fds, self._dir_dirty, self._unsynced_csns = [], False, []
        self._unsynced_lines = []
        return point

    def fsync(self, point: SyncPoint) -> None:
        """Makes what `point` covers durable (the segments appended to, then a new one's directory)."""
        self._fsyncer.fsync(point)

    # The fsyncs of sync(), for Status: how many, their total and the last's seconds.

    @property
    def fsyncs(self) -> int:
        return self._fsyncer.fsyncs

    @property
    def fsync_seconds_total(self) -> float:
        return self._fsyncer.fsync_seconds_total

    @property
    def last_fsync_seconds(self) -> float:
        return self._fsyncer.last_fsync_seconds

    def finish_sync(self, point: SyncPoint) -> int:
        """Shows readers what `point` covered; returns the new durable_csn."""
        with self._cond:
            for seg, written, last_csn, last_time, index_n in point.segments:
                seg.end = written
                seg.last_csn, seg.last_time = last_csn, last_time
                seg.durable_n = index_n
            self._view = tuple(s for s in self._segments if s.last_csn)
            if self._view:  # (empty while the first record ever is still being written in pieces)
                self._durable_csn = self._view[-1].last_csn
            self._recent.extend(point.csns)
            self._tail.extend(point.csns, point.lines)
            self._cond.notify_all()
        return self._durable_csn

    def _flush(self) -> None:
        """Write the pending records, each into the segment it falls in."""
        if not self._pending:
            return
        frames, meta = self._pending, self._pending_meta
        self._pending, self._pending_meta, self._pending_bytes = [], [], 0
        starts = list(itertools.accumulate(map(len, frames), initial=0))  # (where each starts among them)
        placed = 0
        while placed < len(frames):
            placed = self._place(self._segment_for(meta[placed][0]), frames, meta, starts, placed)

    def _segment_for(self, csn: int) -> sg.Segment:
        """The segment the record of `csn` goes into: the last, or a new one (its header written) once it is full."""
        seg = self._segments[-1] if self._segments else None
        # (a segment of an older format version is not appended to: its records are framed otherwise)
        if seg is None or (
            (seg.written >= self.segment_bytes or seg.frames is not rec.CURRENT) and seg.w_last_csn
        ):
            seg = self._roll(csn)
            self._write(seg, [rec.encode_header(rec.SegmentHeader(seg.seq, seg.first_csn, seg.prev_csn))], 0)
        return seg

    def _place(
        self, seg: sg.Segment, frames: list[bytes], meta: list[tuple[int, int]], starts: list[int], first: int
    ) -> int:
        """Write `frames[first:]` into `seg` up to the first that would start past its size; the index after it.

        `starts[k]` is where frame k starts among the frames (`starts[-1]` where
        they end).  The first always goes in (`_segment_for` chose the segment
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
        while (k := bisect_left(starts, index_offs[-1] + self._interval - shift, k, end)) < end:
            index_csns.append(meta[k][0])
            index_offs.append(starts[k] + shift)
            k += 1
        seg.written = starts[end] + shift
        seg.w_last_csn, seg.w_last_time = meta[end - 1]
        self._write(seg, frames[first:end], new_entries)
        return end

    def _write(self, seg: sg.Segment, chunk: list[bytes], first_new_entry: int) -> None:
        data = b"".join(chunk)
        view = memoryview(data)
        path = seg.path
        try:
            while view:
                view = view[os.write(self._fd, view) :]
            entries = rec.encode_index_entries(
                seg.index_csns[first_new_entry:], seg.index_offs[first_new_entry:]
            )
            if entries:
                path = seg.index_path
                os.write(self._index_fd, entries)
        except OSError as e:  # (os.write names no file: the error line does)
            raise OSError(e.errno, e.strerror, path) from e
        if seg not in self._dirty:
            self._dirty.append(seg)

    def _roll(self, first_csn: int) -> sg.Segment:
        """Start a new segment for `first_csn`, once the old one is durable to its last byte.

        The fsync comes before the new file exists, so a power loss can tear
        only the newest segment, whose torn tail the next open cuts.  Left to
        the next sync(), the old segment's unsynced tail could be lost while
        the new segment's first records reached the disk: a sealed segment
        cut short, which no open can tell from damage.  It costs one fsync
        per segment, of what the last sync did not cover.
        """
        prev = self._segments[-1] if self._segments else None
        if prev is not None:
            os.fsync(self._fd)
        seq = prev.seq + 1 if prev else 1
        seg = sg.Segment(self.directory, rec.SegmentHeader(seq, first_csn, prev.w_last_csn if prev else 0))
        fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        index_fd = os.open(seg.index_path, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o644)
        os.write(index_fd, rec.INDEX_MAGIC)
        if prev is not None:
            self._sealed_fds.append(self._fd)
            os.close(self._index_fd)
        self._fd, self._index_fd = fd, index_fd
        self._segments.append(seg)  # its header goes out with its first chunk
        self._dir_dirty = True
        return seg

    # -- reading (any thread) --------------------------------------------------

    @property
    def durable_csn(self) -> int:
        return self._durable_csn

    @property
    def visible_csn(self) -> int:
        """The newest record readers are shown: durable_csn, unless readers are held back."""
        limit = self._reader_limit
        return self._durable_csn if limit is None else min(limit, self._durable_csn)

    def hold_readers(self, at: int | None = None) -> None:
        """Readers see nothing past csn `at` (default: what is durable now) until `release_readers`.

        For an initial snapshot: its records are shown only once the
        completion record is durable, so one cut short by a crash was never
        read by anyone and can be taken again from scratch (docs/design.md section 5).
        """
        with self._cond:
            self._reader_limit = self._durable_csn if at is None else at

    def release_readers(self) -> None:
        with self._cond:
            self._reader_limit = None
            self._cond.notify_all()

    def clear(self) -> None:
        """Remove every record and relation version: the directory is as a new changelog's.

        Only for records no reader was ever shown (an initial snapshot cut
        short, held back by `hold_readers`), before anything reads or appends.
        """
        if self._open is not None or self._pending:
            raise ValueError("clear of a changelog with a record being appended")

        def step() -> None:
            for fd in [*self._sealed_fds, self._fd, self._index_fd]:
                if fd >= 0:
                    os.close(fd)
            self._sealed_fds, self._fd, self._index_fd = [], -1, -1
            for seg in self._segments:
                os.unlink(seg.path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seg.index_path)
            sync_directory(os.path.join(self.directory, LOCK_NAME))
            self.relations.clear()

        self._guard(step)
        with self._cond:
            self._segments, self._dirty, self._dir_dirty = [], [], False
            self._view = ()
            self._durable_csn = self._appended_csn = self._link = 0
            self._unsynced_csns, self._unsynced_lines = [], []
            self._recent = RecentCsns(self._recent.keep)
            self._tail.clear()

    @property
    def newest_csn(self) -> int:
        return self._durable_csn

    @property
    def oldest_csn(self) -> int:
        view = self._view
        return view[0].first_csn if view else 0

    @property
    def oldest_after_csn(self) -> int:
        """Where a read of the oldest retained starts: the csn before it (0 when retention dropped nothing)."""
        view = self._view
        return view[0].prev_csn if view else self._durable_csn

    @property
    def size_bytes(self) -> int:
        with self._cond:
            return sum(s.end for s in self._view)

    @property
    def segment_count(self) -> int:
        return len(self._view)

    def count_after(self, csn: int, cap: int) -> tuple[int, bool]:
        """Durable records after `csn`, counted up to `cap`: (count, whether it is only a lower bound).

        The newest RECENT_CSNS are counted by bisection; only a count
        reaching further back, below what they cover and under the cap,
        reads the records in between (their heads, not their payloads).
        """
        with self._cond:
            durable = self.visible_csn
            recent = self._recent
            n = recent.count_after(csn)
            floor, kept = recent.floor, len(recent.csns)
            held = self._reader_limit is not None
        if csn >= durable:
            return 0, False
        if held:  # (an initial snapshot being taken: rare and short, so counted by reading)
            counted = sum(1 for _ in itertools.islice(self.read_pieced(csn, whole_up_to=0), cap))
            return counted, counted >= cap
        if n is not None:
            return min(n, cap), n >= cap
        if kept >= cap:
            return cap, True
        counted = kept
        try:
            for _ in self.read_pieced(csn, floor, whole_up_to=0):
                counted += 1
                if counted >= cap:
                    return cap, True
        except CsnOutOfRange:  # (behind retention: at least everything retained)
            return max(counted, self.count_after(0, cap)[0]), True
        return counted, False

    def wait_durable(
        self, after_csn: int, timeout: float, interrupted: Callable[[], bool] | None = None
    ) -> bool:
        """Block until visible_csn > after_csn (True), or `timeout` seconds pass or the log closes (False).

        `interrupted`, when given, also ends the wait once it is true, as
        soon as whoever made it true calls `wake_waiters`.
        """

        def done() -> bool:
            return self.visible_csn > after_csn or self._closed or (interrupted is not None and interrupted())

        with self._cond:
            return self._cond.wait_for(done, timeout) and self.visible_csn > after_csn

    def wake_waiters(self) -> None:
        """Makes every `wait_durable` look at its `interrupted` again."""
        with self._cond:
            self._cond.notify_all()

    def read(self, after_csn: int, until_csn: int | None = None) -> Iterator[tuple[int, bytes]]:
        """The durable records with after_csn < csn (<= until_csn), in order; seeks, never scans from the start.

        Raises CsnOutOfRange at once when retention dropped records after
        `after_csn` (0 means: from the oldest retained).  The iterator stops
        at the durable end as it was when read() was called.  Every record
        is read whole: a reader that must stay bounded takes `read_pieced`.
        """
        return _whole_records(self.read_pieced(after_csn, until_csn))

    def read_pieced(
        self,
        after_csn: int,
        until_csn: int | None = None,
        whole_up_to: int | None = None,
        *,
        strict: bool = False,
    ) -> Iterator[tuple[int, bytes | sg.RecordPieces]]:
        """As `read`, but a record longer than `whole_up_to` bytes comes as RecordPieces, unread.

        Its pieces are valid until the iterator moves on (see RecordPieces).
        `strict`: 0 is csn 0 like any other, not "the oldest retained" (a
        consumer's mark: records after 0 that retention dropped are a gap).
        """
        with self._cond:
            view = self._view
            limit = self._reader_limit
            if limit is not None:  # (held back: nothing past the limit is shown)
                until_csn = limit if until_csn is None else min(until_csn, limit)
                if after_csn >= limit:
                    return iter(())
            _check_retained(view, after_csn, strict)
            tail = self._tail.after(after_csn, until_csn, whole_up_to)
            if tail is not None:  # (all of it in memory: as the segments hold it, unread)
                return zip(tail[0], tail[1], strict=True)
            bounds = [(s.end, s.durable_n) for s in view]
        return self._iterate(view, bounds, after_csn, until_csn, whole_up_to)

    def check_retained(self, after_csn: int, *, strict: bool = False) -> None:
        """CsnOutOfRange, as `read` raises it, when retention dropped records after `after_csn`."""
        _check_retained(self._view, after_csn, strict)

    def _iterate(
        self,
        view: tuple[sg.Segment, ...],
        bounds: list[tuple[int, int]],
        after_csn: int,
        until_csn: int | None,
        whole_up_to: int | None,
    ) -> Iterator[tuple[int, bytes | sg.RecordPieces]]:
        i = max(bisect_right([s.first_csn for s in view], after_csn) - 1, 0)
        for seg, (end, n) in zip(view[i:], bounds[i:], strict=True):
            if until_csn is not None and seg.first_csn > until_csn:
                return
            if seg.last_csn <= after_csn:
                continue
            for attempt in (0, 1):
                with self._cond:
                    csns, offs = seg.index_csns, seg.index_offs
                start, expect = sg.seek(csns, offs, n, after_csn)
                try:
                    yield from sg.read_records(
                        seg.path, start, end, expect, after_csn, until_csn, whole_up_to, seg.frames
                    )
                    break
                except FileNotFoundError:
                    raise CsnOutOfRange(
                        f"changelog: {seg.path} was dropped by retention while it was read "
                        f"(reading after csn {after_csn}); the oldest retained csn is now {self.oldest_csn}",
                        csn=after_csn,
                        oldest_csn=self.oldest_csn,
                    ) from None
                except IndexMismatch:
                    if attempt or seg is self._segments[-1] or start == rec.SEGMENT_HEAD:
                        raise ChangelogCorrupt(
                            f"no record of csn {expect} where the index puts it", path=seg.path, offset=start
                        ) from None
                    self._rebuild_index(seg)
                    n = len(seg.index_csns)
                except ChangelogCorrupt:
                    if seg is not self._segments[-1]:
                        # (damaged since open: said in the words open, and `csnd changelog --check`, use)
                        sg.scan_sealed(seg.path, seg.header, self._interval)
                    raise

    def _rebuild_index(self, seg: sg.Segment) -> None:
        """A sealed segment's index pointed at the wrong bytes: scan the segment and write it anew."""
        with self._rebuild_lock:
            sg.log.warning(
                "changelog: rebuilding the index of %s: an entry does not point at its record", seg.path
            )
            _, (csns, offs) = sg.scan_sealed(seg.path, seg.header, self._interval)
            with self._cond:
                seg.index_csns, seg.index_offs, seg.durable_n = csns, offs, len(csns)
            sg.write_index(seg)

    # -- retention (writer thread) ------------------------------------------------

    # What consumers still need holds retention (csnd.changelog.retention):
    # each holder is asked at every pass, so a mark that moved is seen there.
    _holders: tuple[Callable[[], Mapping[str, int]], ...] = ()
    # holder -> bytes retention would have dropped but keeps for it, as of the last pass
    retention_held: Mapping[str, int] = MappingProxyType({})

    def add_retention_holder(self, holds: Callable[[], Mapping[str, int]]) -> None:
        """`holds()` names holders and the csn each has read through: retention keeps what is after it.

        Called on the thread that applies retention; it must be quick and not block on the changelog.
        """
        self._holders = (*self._holders, holds)

    def remove_retention_holder(self, holds: Callable[[], Mapping[str, int]]) -> None:
        self._holders = tuple(h for h in self._holders if h != holds)

    def _retention_limits(self) -> retention.Limits:
        try:
            return retention.hold_limits(
                self.retention_bytes,
                self.retention_hours,
                self.retention_hold_bytes,
                self.retention_hold_hours,
            )
        except ValueError as e:
            raise ConfigError(f"changelog {self.directory}: {e}") from None

    def apply_retention(self) -> int:
        """Drop whole old segments past the size or age limit (never the active one); returns bytes freed.

        Segments a holder still needs stay, up to the hold limits; past
        them they go with a warning naming every holder passed (its next
        read is OUT_OF_RANGE, never moved silently).
        """
        if self.retention_bytes is None and self.retention_hours is None:
            return 0
        holds: dict[str, int] = {}
        for holder in self._holders:
            holds.update(holder())
        segs = self._segments
        infos = [retention.SegmentInfo(s.last_csn, s.written, s.last_time, s.end == s.written) for s in segs]
        limits = self._retention_limits()
        p = retention.plan(infos, limits, int(self._clock() * 1_000_000), holds)
        self.retention_held = MappingProxyType(dict(p.held))
        drop = p.drop
        if not drop:
            return 0
        gone, keep = self._segments[:drop], self._segments[drop:]
        for who, csn in sorted(p.passed.items()):
            sg.log.warning(
                "changelog: retention dropped the records through csn %d that %s had not read (it is at "
                "csn %d): the changelog was past its hold limits (retention_hold_bytes %s, retention_hold_hours "
                "%s); its next read is refused as out of range (the oldest retained csn is now %d)",
                gone[-1].last_csn,
                who,
                csn,
                limits.hold_bytes,
                None if limits.hold_age_us is None else f"{limits.hold_age_us / 3.6e9:g}",
                keep[0].first_csn,
            )
        with self._cond:
            self._segments = keep
            self._view = tuple(s for s in keep if s.last_csn)
            # (a lag counts retained records only: one behind the dropped ones is a lower bound)
            self._recent.drop_through(max(s.last_csn for s in gone))
            self._tail.drop_through(max(s.last_csn for s in gone))

        def unlink() -> None:
            for seg in gone:
                os.unlink(seg.path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seg.index_path)
            sync_directory(keep[0].path)

        self._guard(unlink)
        return sum(seg.written for seg in gone)

    # -- closing and checking ----------------------------------------------------

    def close(self) -> None:
        """Sync what is pending (unless a write failed), release the files and the lock."""
        if self._closed:
            return
        try:
            if self._guard.failed is None:
                self.abort_record()
            if self._guard.failed is None and (self._pending or self._dirty):
                self.sync()
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self.relations.close()
            for fd in [*self._sealed_fds, self._fd, self._index_fd, self._lock_fd]:
                if fd >= 0:
                    os.close(fd)
            self._sealed_fds = []

    def __enter__(self) -> Changelog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        segs = self._segments
        for seg in segs:
            seg._check()
        for a, b in itertools.pairwise(segs):
            assert b.seq == a.seq + 1 and b.prev_csn == a.w_last_csn and b.first_csn > a.w_last_csn
            assert a.end == a.written or a in self._dirty
        view = self._view
        assert list(view) == [s for s in segs if s.last_csn][: len(view)]
        assert self._durable_csn == (view[-1].last_csn if view else 0) or (not view and not self._durable_csn)
        assert self._appended_csn >= self._durable_csn
        assert self._appended_csn == (
            self._pending_meta[-1][0] if self._pending_meta else segs[-1].w_last_csn if segs else 0
        )
        assert self._pending_bytes == sum(len(f) for f in self._pending)
        self._recent._check()
        assert self._unsynced_csns == sorted(self._unsynced_csns)
        assert not self._recent.csns or self._recent.csns[-1] == self._durable_csn


def _check_retained(view: tuple[sg.Segment, ...], after_csn: int, strict: bool = False) -> None:
    if view and (after_csn or strict) and after_csn < view[0].prev_csn:
        raise CsnOutOfRange(
            f"changelog: records after csn {after_csn} were dropped by retention; "
            f"the oldest retained csn is {view[0].first_csn}; read after csn {view[0].prev_csn} or later, "
            "or from 0 for the oldest retained",
            csn=after_csn,
            oldest_csn=view[0].first_csn,
        )


def _whole_records(records: Iterator[tuple[int, bytes | sg.RecordPieces]]) -> Iterator[tuple[int, bytes]]:
    for csn, payload in records:
        yield csn, payload if isinstance(payload, bytes) else payload.read()
