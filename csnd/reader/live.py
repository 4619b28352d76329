"""A live PostgreSQL node as a source: pgoutput over a replication connection.

psycopg 3 has no replication API, so this drives the protocol at the pq level
(docs/design.md section 9): a `replication=database` connection, `START_REPLICATION
SLOT ... LOGICAL` with `send_query`, then COPY_BOTH -- `get_copy_data` to read
frames, `put_copy_data` to send standby status updates.  `LiveSource` composes
the parts, each a module of one job:

    replconn     the replication connection: libpq options, waits, what failures mean
    sourcecheck  before the first start: wal_level, slot, publication; the slot made
    replstart    START_REPLICATION: the options asked of pgoutput
    copyloop     the receive loop: frames in, items out; keepalives, silence, pauses
    feedback     the positions (received, confirmed, reported) and status updates
    catalog      what an ordinary connection answers: enum types, slot position, advance

Framing and resume logic are pure (`reader.pgoutput`, `reader.resume`).

Feedback.  The flush position we report is only ever what the pipeline has
made durable and handed to `confirm()` -- never further: early feedback loses
data, late feedback piles WAL up on the server.  We confirm END LSNs (the
server re-sends every transaction whose commit record starts at or after the
confirmed position), and send a final update before ending the copy.

Reconnects.  A lost connection or a server restart is retried with
exponential backoff (`reader.reconnect.Backoff`), starting again from the
confirmed position; the `ResumeFilter` drops what the server re-sends, so
nothing downstream sees the gap.  Errors that a retry cannot fix (no such
slot, database or publication, authentication, a role without REPLICATION,
a slot of another output plugin, wal_level) fail at once with a
`SourceError` saying what to do, and so does any failure of the very first
connection: a wrong host or port is a typo to fix, not an outage to wait out.

Ready.  A new slot streams only what commits after its consistent point,
which the server reaches once every transaction running when the slot was
asked for has ended.  A command that tells others it is ready (`csnd serve`,
`csnd node`) calls `prepare()` first: the slot exists, at that point, before
anyone can commit something it should capture.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Final

import psycopg
from psycopg import pq

from csnd.core.errors import ConnectionLost, SourceError
from csnd.core.ids import INVALID_LSN, Lsn, lsn_from_str, lsn_to_str
from csnd.reader import catalog
from csnd.reader.copyloop import RECEIVE_TIMEOUT_S, CopyLoop
from csnd.reader.events import EventStream, PauseListener, QuietListener
from csnd.reader.feedback import STATUS_INTERVAL_S, Feedback
from csnd.reader.reconnect import RECONNECT_GIVE_UP_S, Backoff, one_line
from csnd.reader.replconn import (
    OBJECT_IN_USE,
    Closed,
    ReplicationConnection,
    TransientError,
    await_copy_end,
    quote_ident,
)
from csnd.reader.replstart import start_replication
from csnd.reader.resume import Item, ResumeFilter
from csnd.reader.shutdown import ShutdownProbe
from csnd.reader.sourcecheck import CREATED_SLOTS, CreatedSlot, ExportedSnapshot, SourceCheck

__all__ = [
    "CREATED_SLOTS",
    "RECEIVE_TIMEOUT_S",
    "STATUS_INTERVAL_S",
    "CreatedSlot",
    "ExportedSnapshot",
    "LiveOptions",
    "LiveSource",
    "parse_lsn_option",
]

log = logging.getLogger("csnd.reader.live")

# How long the first connection waits for a slot that is still active: the
# walsender of a run that just ended may take a moment to let go of it.
# Longer than that, another process is using the slot: an error.
SLOT_BUSY_FIRST_S: Final = 10.0


@dataclass
class LiveOptions:
    conninfo: str
    slot: str
    publication: str
    create_slot: bool = False
    failover_slot: bool = False  # make it a failover slot (reader.slotmaking)
    until_lsn: Lsn | None = None
    binary: bool = True
    streaming: bool = True
    messages: bool = True
    start_lsn: Lsn = INVALID_LSN
    status_interval_s: float = STATUS_INTERVAL_S
    reconnect_give_up_s: float = RECONNECT_GIVE_UP_S
    receive_timeout_s: float = RECEIVE_TIMEOUT_S
    # a slot made here that is not at its consistent point after this long is given up (None: no limit)
    slot_wait_timeout_s: float | None = None
    extra: dict[str, str] = field(default_factory=dict)


class LiveSource:
    """One node's replication stream; iterate `events()` in one thread.

    `confirm(lsn)` may be called from any thread; the position is sent with
    the next status update (or at once when the server asks for a reply).
    """

    def __init__(
        self,
        node: str,
        options: LiveOptions,
        mode: str = "single",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.options = options
        self.mode = mode
        self.binary = options.binary
        self.feedback = Feedback(node, options.start_lsn)
        self._closed = threading.Event()
        self.link = ReplicationConnection(node, options.conninfo, options.receive_timeout_s, self._closed)
        self.filter = ResumeFilter()
        self._enums: list[tuple[int, int]] | None = None
        self.reconnects = 0
        self.reconnecting = False  # the connection is down and being re-established (for status)
        self.backoff = Backoff(clock, give_up=options.reconnect_give_up_s)
        # A stopping server waits for a confirmation we may not give yet: hang up then (reader.shutdown).
        self.shutdown = ShutdownProbe(options.conninfo)
        self._started = False  # a START_REPLICATION has succeeded: later failures may be transient
        self._quiet: QuietListener | None = None  # the open stream's (`frames`)

    # --- positions ------------------------------------------------------------------

    def confirm(self, lsn: Lsn) -> None:
        self.feedback.confirm(lsn)
        self.filter.confirmed(lsn)

    def confirm_final(self, lsn: Lsn, timeout_s: float = 15.0) -> None:
        """Confirm `lsn` after the stream has ended (`--until-lsn`), so the slot really moves.

        A pipeline whose stages run after the reader (decoders, sender, merge)
        learns what is durable only after the reader sent its last status
        update, so that final position is set with pg_replication_slot_advance
        over an ordinary connection; the walsender may need a moment to let
        go of the slot, hence the retry while it is still active.
        """
        self.confirm(lsn)
        if (
            lsn <= self.feedback.reported or lsn <= 0
        ):  # (0: nothing of this run is durable; 0/0 is no position)
            return
        catalog.advance_slot(self.node, self.options.conninfo, self.options.slot, lsn, timeout_s)
        self.feedback.reported = lsn

    def enum_types(self) -> list[tuple[int, int]]:
        """(type OID, array type OID) of every enum in the source database.

        In binary mode pgoutput sends an enum as its label, but a Type message
        does not say the type is an enum; the decoder is told up front.  An
        enum created later is reported as unreadable at its Relation message.
        """
        if self._enums is None:
            self._enums = catalog.enum_types(self.node, self.options.conninfo)
        return self._enums

    def user_types(self) -> list[tuple[int, str, int, int]]:
        """The source database's enums, composites, ranges, multiranges and domains, for the decoders.

        A Type message names a user type but does not say what it is; told,
        the decoders read each in both stream forms alike (docs/design.md section 7).
        """
        from csnd.reader.usertypes import user_types

        return user_types(self.node, self.options.conninfo)

    def prepare(self, snapshot: str = "never") -> ExportedSnapshot | None:
        """Check the source and make its slot (`create_slot`) now, in the calling thread.

        Returns once the slot exists at its consistent point: everything
        committed afterwards will be streamed (see the module docstring).
        An existing slot costs one connection and one query.  Nothing has
        started yet, so every failure is a `SourceError` naming the node and
        the slot, never a retry.  Ctrl-C (or `close()`) while the server
        waits for the consistent point cancels the creation.

        `snapshot` (docs/design.md section 5, "Initial snapshot"): "initial" makes the
        slot now, exporting the snapshot of its consistent point, and refuses
        a slot that exists already (its consistent point is past: no snapshot
        of it can be had); "when_needed" does so only when the slot does not
        exist.  The snapshot is valid while the connection that made the slot
        stays open and idle, so it is returned open: import it elsewhere
        (`SET TRANSACTION SNAPSHOT`), then `release()` it.
        """
        slot = self.options.slot
        try:
            pgconn = self.link.open(self._started)
            exported: ExportedSnapshot | None = None
            try:
                exported = SourceCheck(self.node, self.options, self.link).run(pgconn, snapshot)
            finally:
                if exported is None:
                    self.link.drop()
            return exported
        except Closed:
            return None
        except (SourceError, psycopg.Error, OSError) as e:
            text = e.message if isinstance(e, SourceError) else one_line(str(e))
            if f"slot {slot}" not in text and quote_ident(slot) not in text:
                what = "create" if self.options.create_slot else "check"
                text = f"cannot {what} replication slot {slot}: {text}"
            raise SourceError(text, node=self.node) from None

    def slot_position(self) -> Lsn:
        """Where the slot resumes (its confirmed_flush_lsn), over an ordinary connection."""
        return catalog.slot_position(self.node, self.options.conninfo, self.options.slot)

    @property
    def received_lsn(self) -> Lsn:
        """The newest WAL position the server has sent (for status; any thread)."""
        return self.feedback.received

    @property
    def confirmed_lsn(self) -> Lsn:
        return self.feedback.confirmed

    @property
    def silences(self) -> int:
        """Connections given up as silent past receive_timeout_s (a black-holed path)."""
        return self.link.silences

    def close(self) -> None:
        self._closed.set()

    # --- the stream -----------------------------------------------------------------

    def events(
        self,
        raw_changes: bool = False,
        pauses: PauseListener | None = None,
        quiet: QuietListener | None = None,
    ) -> EventStream:
        """Yield `(lsn, message)` until `--until-lsn` is reached or `close()`.

        Every change comes parsed whatever `raw_changes` says: the resume
        filter places each one by its LSN and xid (and the walsender, not
        this parse, bounds a live node's rate).  `pauses` is told each time
        the stream pauses, in the thread iterating it (`PauseListener`);
        `quiet` of its lulls and its end (`QuietListener`).
        """
        from csnd.reader.recorded import checked_commit_times

        items = self.frames(runs=raw_changes, pauses=pauses, quiet=quiet)
        yield from checked_commit_times(((lsn, msg) for lsn, msg, _payload in items), self.node)

    def frames(
        self, runs: bool = False, pauses: PauseListener | None = None, quiet: QuietListener | None = None
    ) -> Iterator[Item]:
        """Yield `(lsn, message, pgoutput payload)`, reconnecting as needed.

        The payload is the CopyData payload as the server sent it (a resumed
        stream block's Start is re-encoded with `first_segment` cleared).
        With `runs`, consecutive row changes outside stream blocks come as
        one `ChangeFrames` (its payload: its blob), framed as a format-1
        recording frames them, so neither this thread nor the resume filter
        builds an object per change: the decoder workers parse them.
        `pauses`, `quiet`: as for `events`.
        """
        self._quiet = quiet
        first = True
        backoff = self.backoff
        first_try = backoff.clock()
        while not self._closed.is_set():
            try:
                pgconn = self.link.open(self._started)
                backoff.connected()
                if first:
                    SourceCheck(self.node, self.options, self.link).run(pgconn)
                else:
                    yield from self.filter.reconnected(self.confirmed_lsn)
                    self.reconnects += 1
                    log.warning(
                        "node %s: reconnected, resuming from %s", self.node, lsn_to_str(self.confirmed_lsn)
                    )
                self.shutdown.reset()
                start_replication(self.link, pgconn, self.options, self.confirmed_lsn, self.feedback.received)
                first = False
                self.reconnecting = False
                self._started = True
                done = yield from self._copy_loop(pgconn, runs, pauses)
                if done:
                    self._finish_copy()
                    return
            except Closed:
                self._finish_copy()
                return
            except GeneratorExit:  # the consumer left mid-stream (a stop, or its own failure)
                # Say where we got and hang up, so the server frees the slot now; quietly:
                # a close must not raise, and a failed `finishing` reports nothing.
                with contextlib.suppress(Exception):
                    self._finish_copy()
                self.link.drop()
                return
            except (ConnectionLost, psycopg.OperationalError, OSError) as err:
                e = (
                    err
                    if isinstance(err, ConnectionLost)
                    else ConnectionLost(one_line(str(err)), node=self.node)
                )
                self.link.drop()
                busy = isinstance(e, TransientError) and e.sqlstate == OBJECT_IN_USE
                if not self._started and not (busy and backoff.clock() - first_try < SLOT_BUSY_FIRST_S):
                    # The stream never started: nothing to wait for but a mistake to fix.
                    raise SourceError(e.message, node=self.node, lsn=e.lsn) from None
                wait = backoff.failed()
                if wait is None:
                    raise ConnectionLost(
                        f"connection lost and not back after {self.options.reconnect_give_up_s:.0f}s "
                        f"(--give-up): {e.message}",
                        node=self.node,
                        lsn=self.confirmed_lsn,
                    ) from e
                log.warning("node %s: %s; retrying in %.1fs", self.node, e.message, wait)
                self.reconnecting = True
                if self._closed.wait(wait):
                    return
            finally:
                if self._closed.is_set():
                    self.link.drop()
        self.link.drop()

    def _copy_loop(
        self, pgconn: pq.abc.PGconn, runs: bool, pauses: PauseListener | None
    ) -> Generator[Item, None, bool]:
        """One connection's stream (`reader.copyloop`): True once `--until-lsn`'s end is reached.

        Returns the loop's own generator, not one wrapping it: every item of
        a busy node passes here, and each generator layer costs per item.
        """
        loop = CopyLoop(
            self.node,
            self.options,
            self.link,
            self.feedback,
            self.filter,
            self.backoff,
            self.shutdown,
            pauses=pauses,
            on_idle=None if self._quiet is None else self._quiet.idle,
        )
        return loop.run(pgconn, runs)

    def finish(self) -> None:
        """End the stream now (Ctrl-C, SIGTERM): the quiet listener's `finishing`, the last status update, CopyDone.

        Without it an interrupted recording made its file durable but the
        slot never heard of it: the next recording would get those
        transactions again.
        """
        self._finish_copy()

    def _finish_copy(self) -> None:
        """Send the final status update and end the copy cleanly."""
        conn = self.link.conn
        if conn is None or conn.closed:
            return
        pgconn = conn.pgconn
        if self._quiet is not None:
            self._quiet.finishing()
        try:
            self.feedback.send_status(pgconn)
            pgconn.put_copy_end()
            pgconn.flush()
            await_copy_end(pgconn, self.node)
        except (ConnectionLost, psycopg.Error, OSError):
            pass
        self.link.drop()


def parse_lsn_option(text: str) -> Lsn:
    try:
        return lsn_from_str(text)
    except ValueError as e:
        raise SourceError(str(e)) from None
