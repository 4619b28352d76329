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

`Changelog` is the one class callers hold; each of its jobs is a part of
its own (the package docstring lists them), as etcd's WAL keeps its
encoder, decoder and file pipeline apart: the segment writer, the records
in pieces, the sync, the reader view, retention, the lock and the guard.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

from csnd.changelog import retention
from csnd.changelog import segment as sg
from csnd.changelog.clock import CLOCK_NAME, SteadyWall
from csnd.changelog.guard import WriteGuard
from csnd.changelog.lock import LOCK_NAME, take_lock
from csnd.changelog.opening import make_adopted_durable, open_segments
from csnd.changelog.pieces import PiecedRecords
from csnd.changelog.relations import RelationStore
from csnd.changelog.retainer import Retainer
from csnd.changelog.sync import Fsyncer, SyncPoint
from csnd.changelog.view import ReaderView, check_retained, whole_records
from csnd.changelog.writer import SegmentWriter
from csnd.core.durable import sync_directory
from csnd.core.errors import ConfigError
from csnd.core.hostid import host_id

# A new segment starts once the active one has grown past this.  Larger:
# fewer files and directory fsyncs; smaller: retention frees space in finer
# steps and the last segment (read whole on open, to find a torn tail) is
# quicker to check after a crash.
# (CSND_SEGMENT_BYTES: the fault suite's clock class makes it small, so that a run of
# seconds has whole segments retention could drop.)
DEFAULT_SEGMENT_BYTES: Final = int(os.environ.get("CSND_SEGMENT_BYTES", str(64 << 20)))

# One index entry per this many bytes of segment.  A read from a CSN scans at
# most this much before its first record; the index costs 16 bytes per entry
# (0.4% of the segment at 4 KiB).
DEFAULT_INDEX_INTERVAL: Final = 4 << 10

# How many of the newest durable CSNs are kept for counting a consumer's lag
# (count_after): 8 bytes each.  A count up to this many costs one bisection.
RECENT_CSNS: Final = 10_000

# The newest durable records' payloads kept in memory, for readers that keep up
# (`DurableTail`): served from there, a record costs no read and no CRC check.
TAIL_BYTES: Final = 16 << 20


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
        self._closed = False
        self._guard = WriteGuard(self.directory, lambda: self._view.durable_csn)
        self._lock_fd = take_lock(self.directory)
        writer: SegmentWriter | None = None
        try:
            # The relation versions of its transactions (docs/design.md section 7), under the same lock.
            self.relations = RelationStore(self.directory, guard=self._guard)
            segments = open_segments(self.directory, index_interval)
            writer = SegmentWriter(
                self.directory,
                segments,
                segment_bytes=segment_bytes,
                interval=index_interval,
                clock=self._clock,
                guard=self._guard,
            )
            w = writer
            self._view = ReaderView(
                segments,
                writer.appended_csn,
                interval=index_interval,
                recent_csns=recent_csns,
                tail_bytes=tail_bytes,
                newest_segment=lambda: w.segments[-1],
            )
            if segments:
                writer.open_active(segments[-1])
                make_adopted_durable(segments, writer.fd, self._guard)
        except BaseException:
            for fd in (writer.fd, writer.index_fd) if writer is not None else ():
                if fd >= 0:
                    os.close(fd)
            os.close(self._lock_fd)
            raise
        self._writer = writer
        # (the steady clock goes on from the last process's on this boot: csnd.changelog.clock)
        newest_us = max((s.last_time for s in segments), default=0)
        self._clock.resume(os.path.join(self.directory, CLOCK_NAME), host_id(), newest_us)
        self._pieces = PiecedRecords(writer, clock=self._clock, guard=self._guard)
        self._fsyncer = Fsyncer(self._guard)
        self._retainer = Retainer(
            writer, self._view, limits=self._retention_limits, clock=self._clock, guard=self._guard
        )
        for seg in segments:
            seg.opened_csns = []

    # -- writing (one writer thread) ----------------------------------------------

    def append(self, csn: int, line: bytes) -> None:
        """Buffer one transaction's line; invisible and not durable until sync()."""
        self._writer.append_many((csn,), (line,))

    def append_many(self, csns: Sequence[int], lines: Sequence[bytes]) -> None:
        """Buffer transactions' lines, in CSN order, with one time of appending; as `append` each.

        A bad one raises, with the ones before it appended.
        """
        self._writer.append_many(csns, lines)

    def append_parts(self, csn: int, parts: Sequence[bytes]) -> None:
        """`append(csn, b"".join(parts))`, the same bytes, without joining a large line (`SegmentWriter.append_parts`)."""
        self._writer.append_parts(csn, parts)

    # A transaction too large to hold whole is appended as it is produced
    # (csnd.changelog.pieces): start_record, write_record for each piece,
    # end_record.  Until then it is neither visible nor counted in a sync.

    def start_record(self, csn: int) -> None:
        """Begin the record of `csn`, its payload to come in pieces; no append until end_record."""
        self._pieces.start(csn)

    def write_record(self, piece: bytes) -> None:
        """Append a piece of the open record's payload (written at once, not yet visible)."""
        self._pieces.write(piece)

    def end_record(self) -> None:
        """Write the open record's head: it is appended, as `append` would have (visible after a sync)."""
        self._pieces.end()

    def abort_record(self) -> None:
        """Drop the open record (its transaction was given up): cut its bytes off the segment."""
        self._pieces.abort()

    def sync(self) -> int:
        """Write what is pending, fsync it (and the directory for a new segment); returns durable_csn."""
        if self._closed:
            raise ValueError("sync of a closed changelog")
        point = self.begin_sync()
        if point is None:
            return self._view.durable_csn
        self.fsync(point)
        return self.finish_sync(point)

    # sync() in three steps, for a group commit that keeps appending while it
    # waits for the disk: begin_sync and finish_sync are quick and run where
    # append does (under the caller's lock, when append runs in another
    # thread); fsync, the slow part, runs without it.  One sync at a time.

    def begin_sync(self) -> SyncPoint | None:
        """Writes what is pending and notes what an fsync now covers; None when nothing is new."""
        return self._writer.begin_sync()

    def fsync(self, point: SyncPoint) -> None:
        """Makes what `point` covers durable (the segments appended to, then a new one's directory)."""
        self._fsyncer.fsync(point)

    def finish_sync(self, point: SyncPoint) -> int:
        """Shows readers what `point` covered; returns the new durable_csn."""
        return self._view.publish(point, self._writer.segments)

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

    # -- reading (any thread): csnd.changelog.view ------------------------------

    @property
    def durable_csn(self) -> int:
        return self._view.durable_csn

    @property
    def visible_csn(self) -> int:
        """The newest record readers are shown: durable_csn, unless readers are held back."""
        return self._view.visible_csn

    def hold_readers(self, at: int | None = None) -> None:
        """Readers see nothing past csn `at` (default: what is durable now) until `release_readers`.

        For an initial snapshot: its records are shown only once the
        completion record is durable, so one cut short by a crash was never
        read by anyone and can be taken again from scratch (docs/design.md section 5).
        """
        self._view.hold_readers(at)

    def release_readers(self) -> None:
        self._view.release_readers()

    def clear(self) -> None:
        """Remove every record and relation version: the directory is as a new changelog's.

        Only for records no reader was ever shown (an initial snapshot cut
        short, held back by `hold_readers`), before anything reads or appends.
        """
        if self._pieces.open is not None or self._writer.pending:
            raise ValueError("clear of a changelog with a record being appended")

        def step() -> None:
            self._writer.remove_all()
            sync_directory(os.path.join(self.directory, LOCK_NAME))
            self.relations.clear()

        self._guard(step)
        self._writer.reset()
        self._view.reset()

    @property
    def newest_csn(self) -> int:
        return self._view.durable_csn

    @property
    def oldest_csn(self) -> int:
        return self._view.oldest_csn

    @property
    def oldest_after_csn(self) -> int:
        """Where a read of the oldest retained starts: the csn before it (0 when retention dropped nothing)."""
        return self._view.oldest_after_csn

    @property
    def size_bytes(self) -> int:
        return self._view.size_bytes

    @property
    def segment_count(self) -> int:
        return len(self._view.segments)

    def count_after(self, csn: int, cap: int) -> tuple[int, bool]:
        """Durable records after `csn`, counted up to `cap`: (count, whether it is only a lower bound).

        The newest RECENT_CSNS are counted by bisection; only a count
        reaching further back, below what they cover and under the cap,
        reads the records in between (their heads, not their payloads).
        """
        return self._view.count_after(csn, cap)

    def wait_durable(
        self, after_csn: int, timeout: float, interrupted: Callable[[], bool] | None = None
    ) -> bool:
        """Block until visible_csn > after_csn (True), or `timeout` seconds pass or the log closes (False).

        `interrupted`, when given, also ends the wait once it is true, as
        soon as whoever made it true calls `wake_waiters`.
        """
        return self._view.wait_durable(after_csn, timeout, interrupted)

    def wake_waiters(self) -> None:
        """Makes every `wait_durable` look at its `interrupted` again."""
        self._view.wake_waiters()

    def read(self, after_csn: int, until_csn: int | None = None) -> Iterator[tuple[int, bytes]]:
        """The durable records with after_csn < csn (<= until_csn), in order; seeks, never scans from the start.

        Raises CsnOutOfRange at once when retention dropped records after
        `after_csn` (0 means: from the oldest retained).  The iterator stops
        at the durable end as it was when read() was called.  Every record
        is read whole: a reader that must stay bounded takes `read_pieced`.
        """
        return whole_records(self._view.read_pieced(after_csn, until_csn))

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
        return self._view.read_pieced(after_csn, until_csn, whole_up_to, strict=strict)

    def check_retained(self, after_csn: int, *, strict: bool = False) -> None:
        """CsnOutOfRange, as `read` raises it, when retention dropped records after `after_csn`."""
        check_retained(self._view.segments, after_csn, strict)

    # -- retention (writer thread): csnd.changelog.retainer -----------------------

    def add_retention_holder(self, holds: Callable[[], Mapping[str, int]]) -> None:
        """`holds()` names holders and the csn each has read through: retention keeps what is after it.

        Called on the thread that applies retention; it must be quick and not block on the changelog.
        """
        self._retainer.add_holder(holds)

    def remove_retention_holder(self, holds: Callable[[], Mapping[str, int]]) -> None:
        self._retainer.remove_holder(holds)

    @property
    def retention_held(self) -> Mapping[str, int]:
        """holder -> bytes retention would have dropped but keeps for it, as of the last pass."""
        return self._retainer.held

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
        return self._retainer.apply()

    # -- closing and checking ----------------------------------------------------

    def close(self) -> None:
        """Sync what is pending (unless a write failed), release the files and the lock."""
        if self._closed:
            return
        try:
            if self._guard.failed is None:
                self.abort_record()
            if self._guard.failed is None and (self._writer.pending or self._writer.dirty):
                self.sync()
        finally:
            self._closed = self._writer.closed = True
            self._view.close()
            self.relations.close()
            self._writer.close_files()
            os.close(self._lock_fd)

    def __enter__(self) -> Changelog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        self._writer._check()
        self._view._check()
        view, segs = self._view.segments, self._writer.segments
        assert list(view) == [s for s in segs if s.last_csn][: len(view)]
        assert self._writer.appended_csn >= self._view.durable_csn
        assert self._pieces.open is None or self._writer.open_csn == self._pieces.open.csn
