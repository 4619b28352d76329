"""The merger's sink in the service: every merged transaction into the changelog.

    Merger ── end_transaction(csn, tail) ──► ChangelogSink ── append ──► Changelog
           ── request_durable() ─► ticket      │ sync thread: begin_sync ─ fsync ─ finish_sync
           ◄─ durable_ticket ───────────────────┘                               ─► durable_csn
              consumers (changefeed) read only what is durable ◄──────────────────────┘

A transaction is gathered into one record (its docs/design.md section 7 line) and
appended; one too large to gather (STREAM_OVER_CHARS) is appended piece by
piece as it comes (`Changelog.start_record`), so memory stays bounded.  Durability is a group commit on a thread of its own: the runtime
asks for it (`request_durable`, a ticket) and goes on appending while the
sync thread writes what is pending and waits for fsync; one fsync covers
everything appended before it began, and `durable_ticket` tells the runtime
which of its requests that includes, so it confirms slots only that far.
When fsync is slow (a disk shared with a busy database) the groups grow
instead of the appends stopping: with the fsync in the runtime's thread, a
100 ms fsync held the whole pipeline to the few milliseconds of appends
between two of them.

After a restart the sources re-send what follows their confirmed positions,
and the senders drop what the changelog already holds (`resume_csn`).  The
sink is the last guard: a transaction at or below the changelog's newest CSN
at start is counted and skipped, never appended twice; one below what this
run appended is a bug upstream and fails loudly (the changelog refuses it).
Right after an initial snapshot, when the changelog holds nothing streamed
yet, one at or below the snapshot's CSNs is no repeat but a collision with
them (a GTM counter below the snapshot's size): a `SnapshotError`, never a
silent skip.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Final

from csnd.changelog import Changelog
from csnd.core.errors import SnapshotError
from csnd.runtime.sinks import GroupCommit
from csnd.service.latency import COMMIT_TO_DURABLE
from csnd.snapshot.watermark import Windows

# How often retention runs (from the sync thread, after a sync).  (CSND_RETENTION_EVERY_S:
# the fault suite's clock class makes it short, to see retention run after a clock jump.)
RETENTION_INTERVAL_S: Final = float(os.environ.get("CSND_RETENTION_EVERY_S", "30"))
# A transaction whose text passes this many characters is no longer gathered
# but appended to the changelog piece by piece as the runtime hands it on, so
# the service holds at most about this much of it (the runtime's own parts
# are OUTPUT_CHUNK_BYTES).  Larger: fewer transactions take the slower path
# (a write per piece, a second pass over the payload for its head); smaller:
# less memory per transaction.
STREAM_OVER_CHARS: Final = 8 << 20


class ChangelogSink:
    """A `csnd.runtime.sinks.Sink` over a `Changelog`, with its own sync thread once started.

    It is its own `GroupCommit` (`group_commit`): the runtime asks for a
    sync by ticket and goes on appending.

    The runtime's one thread writes; the sync thread only syncs.  Every
    call into the changelog that changes it is made under `_lock`, except
    the fsync itself.  Without `start()` (or after `stop()`) everything is
    done in the caller's thread.
    """

    def __init__(
        self,
        log: Changelog,
        *,
        snapshot_csn: int = 0,
        clock: Callable[[], float] = time.monotonic,
        stream_over: int = STREAM_OVER_CHARS,
        windows: Windows | None = None,
    ) -> None:
        """`snapshot_csn`: the changelog ends with a completed initial snapshot's record at this CSN.

        `windows`: the incremental snapshots' open windows, shown every transaction appended.
        """
        self.log = log
        self.group_commit: GroupCommit | None = self  # (durable in the background: `request_durable`)
        self.windows = windows
        if windows is not None:
            windows.in_force = log.relations.in_force
        self.held_csn = log.newest_csn  # what the changelog held when this run started
        self.snapshot_csn = snapshot_csn
        self.transactions = 0  # appended by this run
        self.bytes_out = 0
        self.skipped = 0  # re-sent after a restart and already held
        self._parts: list[str] = []
        self._parts_chars = 0
        self.stream_over = stream_over
        self._csn = 0  # of the transaction being written (start_transaction)
        self._held = False  # it is one the changelog held at start: its parts are dropped
        self._streaming = False  # it is being appended in pieces
        self._streamed_bytes = 0
        self._clock = clock
        self._next_retention = clock() + RETENTION_INTERVAL_S
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a request, a finished sync, a stop
        self._requested = 0  # the newest ticket handed out
        self.durable_ticket = 0  # every transaction ended before this ticket's request is durable
        self._error: BaseException | None = None  # the sync thread's failure, raised to the runtime
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._wake: threading.Event | None = None  # set as each sync finishes (the runtime asks again)

    # --- the runtime's thread -----------------------------------------------------

    def start_transaction(self, csn: int) -> None:
        self._csn = csn
        self._held = self._repeats(csn)

    def write(self, text: str) -> None:
        if self._held:
            return  # (a re-sent transaction: dropped at its end, never gathered)
        parts = self._parts
        parts.append(text)
        self._parts_chars += len(text)
        if self._streaming:
            self._write_through()
        elif self._parts_chars >= self.stream_over and self._csn:
            # Too large to gather: appended as it comes (docs/design.md section 5).
            with self._lock:
                self.log.start_record(self._csn)
            self._streaming = True
            self._write_through()

    def _write_through(self) -> None:
        data = "".join(self._parts).encode("utf-8")
        self._parts, self._parts_chars = [], 0
        with self._lock:
            self.log.write_record(data)
        self._streamed_bytes += len(data)

    def end_transaction(self, csn: int, tail: str) -> None:
        started, self._csn = self._csn, 0
        if self._streaming:
            if csn != started:
                raise ValueError(f"transaction of csn {started} ended as csn {csn}")
            self._parts.append(tail)
            self._write_through()
            with self._lock:
                self.log.end_record()
            self._streaming = False
            if self.windows is not None and self.windows.active:
                self.windows.poison(f"transaction {csn} was too large to look into")
            self.transactions += 1
            self.bytes_out += self._streamed_bytes
            self._streamed_bytes = 0
            return
        parts = self._parts
        parts.append(tail)
        self._parts, self._parts_chars = [], 0
        if self._held or self._repeats(csn):
            self._held = False
            self.skipped += 1
            return
        text = "".join(parts)
        if self.windows is not None and self.windows.active:
            text, relations = self.windows.observe(csn, text)
            if relations:
                self.relations(csn, relations)
        line = text.encode("utf-8")
        with self._lock:
            self.log.append(csn, line)
        self.transactions += 1
        self.bytes_out += len(line)

    def append_lines(self, csns: Sequence[int], lines: Sequence[str]) -> None:
        """Whole lines of consecutive transactions (`FinishedTxn.written`): each as a transaction ended at once.

        In one call of the changelog when nothing between them needs a look
        of its own -- an incremental snapshot's window, a re-sent
        transaction -- else one by one.
        """
        if (self.windows is not None and self.windows.active) or csns[0] <= self.held_csn or self._parts:
            for csn, line in zip(csns, lines, strict=True):
                self.start_transaction(csn)
                self.end_transaction(csn, line)
            return
        data = [line.encode("utf-8") for line in lines]
        with self._lock:
            self.log.append_many(csns, data)
        self.transactions += len(data)
        self.bytes_out += sum(map(len, data))

    def _repeats(self, csn: int) -> bool:
        """Whether the changelog held `csn` when this run started (a re-sent transaction to skip)."""
        if csn <= self.held_csn:
            if csn <= self.snapshot_csn and self.transactions == 0:
                # Nothing streamed is held yet: this is no re-sent transaction but one the
                # snapshot's reserved CSNs collide with (docs/design.md section 5, "Initial snapshot").
                raise SnapshotError(
                    f"a transaction streamed after the initial snapshot has csn {csn}, at or below the "
                    f"snapshot's last csn {self.snapshot_csn} (its records take the csns from 1 below the "
                    "first streamed one): the GTM's counter must be above them; advance it, or take the "
                    "snapshot in fewer chunks ([snapshot] chunk_rows), and start again with an empty "
                    "changelog directory and new slots"
                )
            return True
        return False

    def relations(self, csn: int, entries: Sequence[tuple[str, str]]) -> None:
        """Keep the relation versions first in force at `csn` (fsynced), before its record is appended.

        (A re-sent transaction's are kept already: the store finds them in force and adds nothing.)
        """
        store = self.log.relations
        for node, body in entries:
            store.add(csn, node, body)

    @property
    def ended(self) -> int:
        """Transactions ended, appended or skipped (what a durable ticket may cover)."""
        return self.transactions + self.skipped

    def request_durable(self) -> int:
        """A ticket: once `durable_ticket` reaches it, everything ended before this call is durable."""
        with self._changed:
            self._raise_failure()
            self._requested += 1
            ticket = self._requested
            if self._thread is None:
                self._sync_here()
                self.durable_ticket = ticket
            else:
                self._changed.notify_all()
            return ticket

    def wake_on_durable(self, wake: threading.Event) -> None:
        self._wake = wake

    @property
    def failed(self) -> bool:
        return self._error is not None  # (set once, by the sync thread: a look needs no lock)

    def raise_failure(self) -> None:
        """The sync thread's failure, raised in the runtime's thread (a look, no lock: set once)."""
        if self._error is not None:
            raise self._error

    def make_durable(self) -> None:
        ticket = self.request_durable()
        with self._changed:
            self._changed.wait_for(lambda: self.durable_ticket >= ticket or self._error is not None)
            self._raise_failure()

    def commit(self) -> None:
        self.make_durable()

    def discard(self) -> None:
        self._drop_open()

    def abandon(self) -> str | None:
        # What is appended but not synced is simply not durable: the sources
        # re-send it after a restart.  Nothing here is "partial" to name.
        self._drop_open()
        return None

    def _drop_open(self) -> None:
        self._parts, self._parts_chars, self._held = [], 0, False
        if self._streaming:
            self._streaming = False
            self._streamed_bytes = 0
            with self._lock:
                self.log.abort_record()

    # --- the sync thread --------------------------------------------------------------

    def start(self) -> None:
        """Syncs from now on in a thread of its own."""
        self._thread = threading.Thread(target=self._run, name="csnd-changelog-sync", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Ends the sync thread after the syncs asked for so far (the changelog stays open)."""
        thread = self._thread
        if thread is None:
            return
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        thread.join()
        self._thread = None

    def _run(self) -> None:
        try:
            while self._sync_asked():
                pass
        except BaseException as e:  # (raised in the runtime's thread)
            with self._changed:
                self._fail(e)

    def _sync_asked(self) -> bool:
        """One sync of everything asked for so far; False once stopped with nothing asked."""
        log_ = self.log
        with self._changed:
            self._changed.wait_for(lambda: self._requested > self.durable_ticket or self._stopping)
            if self._requested == self.durable_ticket:  # (stopping, nothing asked)
                return False
            ticket = self._requested
            point = log_.begin_sync()
        if point is not None:
            log_.fsync(point)  # (the slow part, without the lock: appends go on meanwhile)
        with self._changed:
            if point is not None:
                log_.finish_sync(point)
            self.durable_ticket = ticket
            self._retention()
            self._changed.notify_all()
        wake = self._wake
        if wake is not None:
            wake.set()
        if point is not None:  # (outside the lock: the runtime appends meanwhile)
            COMMIT_TO_DURABLE.observe_lines(point.lines)
        return True

    # --- under the lock ---------------------------------------------------------------

    def _sync_here(self) -> None:
        self.log.sync()
        self._retention()

    def _retention(self) -> None:
        if self._clock() >= self._next_retention:
            self._next_retention = self._clock() + RETENTION_INTERVAL_S
            self.log.apply_retention()

    def _fail(self, e: BaseException) -> None:
        self._error = e
        self._changed.notify_all()
        wake = self._wake
        if wake is not None:  # (the runtime looks at once: `raise_failure`)
            wake.set()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error
