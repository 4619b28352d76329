"""A live PostgreSQL node as a source: pgoutput over a replication connection.

psycopg 3 has no replication API, so this drives the protocol at the pq level
(docs/design.md section 9): a `replication=database` connection, `START_REPLICATION
SLOT ... LOGICAL` with `send_query`, then COPY_BOTH -- `get_copy_data` to read
frames, `put_copy_data` to send standby status updates.  Only this module
touches sockets; framing and resume logic are pure (`reader.pgoutput`,
`reader.resume`).

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
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Final

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from csnd.core.appname import for_node
from csnd.core.errors import ConnectionLost, ProtocolError, SlotLost, SourceError
from csnd.core.ids import PG_EPOCH_UNIX_US, Lsn, lsn_from_str, lsn_to_str
from csnd.reader.events import EventStream
from csnd.reader.pgoutput import (
    CHANGE_FRAME_MIN,
    CHANGE_TAGS,
    RUN_FRAME_LENGTH,
    XLOGDATA_HEADER_SIZE,
    XLOGDATA_START,
    Begin,
    ChangeFrames,
    Commit,
    FrameError,
    Keepalive,
    Message,
    PgOutputParser,
    TxnRun,
    XLogData,
    encode_status_update,
    parse_frame,
    parse_hot_frame,
    scanned_txn,
)
from csnd.reader.reconnect import (
    RECONNECT_GIVE_UP_S,
    Backoff,
    classify,
    connect_hint,
    lost_slot,
    one_line,
    server_hint,
)
from csnd.reader.resume import Item, ResumeFilter
from csnd.reader.shutdown import ShutdownProbe
from csnd.reader.txnscan import NO_STOP, CopyData, copy_reader, take_whole_txns

log = logging.getLogger("csnd.reader.live")

# How often we tell the server our positions when it does not ask.  Shorter
# confirms WAL sooner (less pile-up on the server); longer costs a few more
# packets.  Well under the server's wal_sender_timeout (60 s by default).
STATUS_INTERVAL_S: Final = 5.0
# A new slot that has not reached its consistent point after this long is
# waiting for long transactions on the server: say so once (it may take as
# long as they do; there is no limit, as the server has none).
SLOT_CREATE_NOTICE_S: Final = 5.0
# How long the first connection waits for a slot that is still active: the
# walsender of a run that just ended may take a moment to let go of it.
# Longer than that, another process is using the slot: an error.
SLOT_BUSY_FIRST_S: Final = 10.0
# Longest a wait for data blocks, so `close()` and deadlines are noticed.
POLL_S: Final = 0.5
# When nothing more has come for this long after data, the stream has paused:
# `on_drained` is called so that a batch being gathered downstream goes on.
DRAINED_WAIT_S: Final = 0.002
# A confirmation that moved, or a wait for `--until-lsn`'s end, is reported
# to the server at most this often.  Sent at every pause of the stream, as
# they were, a one-row load cost a status message, a flush and the server's
# reply each few transactions: a tenth of the service's CPU.  Longer: the
# slot's confirmed position (and the WAL it frees) trails by as much.
REPORT_GAP_S: Final = 0.05
# Silence on the replication connection longer than this is a lost
# connection: reconnect (from the confirmed position, as after any loss).
# A path that drops packets without a reset (a black hole) sends no error
# and no end of stream, so without a bound the reader waited forever.  Half
# way through the silence a status update asks the server for a reply, which
# a live walsender sends at once, so an idle but healthy connection is never
# silent that long.  60 s is the default of PostgreSQL's own
# wal_receiver_timeout, which bounds the same wait for its replicas; shorter
# gains little, since the server frees the slot for the new connection only
# once its walsender sees the old one gone (its wal_sender_timeout, 60 s by
# default), and risks reconnecting from a server that is merely slow to answer.
RECEIVE_TIMEOUT_S: Final = 60.0
# TCP keepalive of the replication connection (libpq's keepalives_* options,
# unless the source's URL sets them): a peer that is gone is found by the
# kernel in about idle + interval x count = 25 s even while the reader is
# blocked in libpq (the check of the source, START_REPLICATION), where the
# receive timeout cannot look.  And tcp_user_timeout, set to the receive
# timeout: data sent and not acknowledged for that long closes the connection
# (a status update into a black hole).  Each probe is a few bytes; an idle source costs nothing more.
TCP_KEEPALIVES: Final = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}
# How long a finished stream waits for the server to end the copy as well
# (see `_await_copy_end`) before it closes the connection anyway.
FINISH_TIMEOUT_S: Final = 10.0

_OBJECT_IN_USE: Final = "55006"
# A run of row-change frames handed on as one `ChangeFrames` ends at this many
# frames (or at the next other frame, or when the socket is drained).
RUN_FRAMES: Final = 512
# At most this many frames are read by one `take_whole_txns` (then `close()` is checked).
SCAN_FRAMES: Final = 256


@dataclass
class LiveOptions:
    conninfo: str
    slot: str
    publication: str
    create_slot: bool = False
    until_lsn: Lsn | None = None
    binary: bool = True
    streaming: bool = True
    messages: bool = True
    start_lsn: int = 0
    status_interval_s: float = STATUS_INTERVAL_S
    reconnect_give_up_s: float = RECONNECT_GIVE_UP_S
    receive_timeout_s: float = RECEIVE_TIMEOUT_S
    extra: dict[str, str] = field(default_factory=dict)


def _now_pg_us() -> int:
    return int(time.time() * 1_000_000) - PG_EPOCH_UNIX_US


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


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
        self._confirmed = options.start_lsn
        self._reported = -1
        self._received = options.start_lsn
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.filter = ResumeFilter()
        self._enums: list[tuple[int, int]] | None = None
        self.reconnects = 0
        self.silences = 0  # connections given up as silent past receive_timeout_s (a black-holed path)
        self.reconnecting = False  # the connection is down and being re-established (for status)
        self.backoff = Backoff(clock, give_up=options.reconnect_give_up_s)
        # A stopping server waits for a confirmation we may not give yet: hang up then (reader.shutdown).
        self.shutdown = ShutdownProbe(options.conninfo)
        self._started = False  # a START_REPLICATION has succeeded: later failures may be transient
        self.on_reconnect: Callable[[int], None] | None = None
        # called just before the final status update, so a sink can make its
        # last data durable and confirm it in time to be reported
        self.before_finish: Callable[[], None] | None = None
        # Called when the server has sent nothing for a poll interval (an idle
        # moment: csnd record syncs and confirms what it holds then).
        self.on_idle: Callable[[], None] | None = None
        # Called (in the thread reading this stream, between two of its items)
        # when everything received has been yielded and nothing more came for
        # DRAINED_WAIT_S: whoever gathers batches downstream hands on what it has.
        self.on_drained: Callable[[], None] | None = None

    # --- positions ------------------------------------------------------------------

    def confirm(self, lsn: Lsn) -> None:
        with self._lock:
            if lsn > self._confirmed:
                self._confirmed = lsn
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
        if lsn <= self._reported or lsn <= 0:  # (0: nothing of this run is durable; 0/0 is no position)
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.options.conninfo, autocommit=True) as conn:
                    conn.execute(
                        "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)",
                        (self.options.slot, lsn_to_str(lsn)),
                    )
                self._reported = lsn
                return
            except psycopg.errors.ObjectInUse:
                if time.monotonic() >= deadline:
                    raise SourceError(
                        f"slot {self.options.slot} is still in use after the stream ended; "
                        f"could not confirm {lsn_to_str(lsn)} to it",
                        node=self.node,
                        lsn=lsn,
                    ) from None
                time.sleep(0.1)
            except psycopg.Error as e:
                raise SourceError(
                    f"cannot confirm {lsn_to_str(lsn)} to slot {self.options.slot}: {str(e).strip()}",
                    node=self.node,
                    lsn=lsn,
                ) from None

    def enum_types(self) -> list[tuple[int, int]]:
        """(type OID, array type OID) of every enum in the source database.

        In binary mode pgoutput sends an enum as its label, but a Type message
        does not say the type is an enum; the decoder is told up front.  An
        enum created later is reported as unreadable at its Relation message.
        """
        if self._enums is None:
            # The first connection of a run: any failure is reported at once.
            try:
                with psycopg.connect(self.options.conninfo, autocommit=True) as conn:
                    rows = conn.execute(
                        "SELECT oid::int8, typarray::int8 FROM pg_type WHERE typtype = 'e' ORDER BY oid"
                    ).fetchall()
            except psycopg.OperationalError as e:
                raise self._connect_error(e) from None
            except psycopg.Error as e:
                raise SourceError(f"cannot list enum types: {one_line(str(e))}", node=self.node) from None
            self._enums = [(int(a), int(b)) for a, b in rows]
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
            pgconn = self._connect()
            exported: ExportedSnapshot | None = None
            try:
                exported = self._check_source(pgconn, snapshot)
            finally:
                if exported is None:
                    self._drop_conn()
            return exported
        except _Closed:
            return None
        except (SourceError, psycopg.Error, OSError) as e:
            text = e.message if isinstance(e, SourceError) else one_line(str(e))
            if f"slot {slot}" not in text and _quote_ident(slot) not in text:
                what = "create" if self.options.create_slot else "check"
                text = f"cannot {what} replication slot {slot}: {text}"
            raise SourceError(text, node=self.node) from None

    def slot_position(self) -> Lsn:
        """Where the slot resumes (its confirmed_flush_lsn), over an ordinary connection."""
        slot = self.options.slot
        try:
            with psycopg.connect(self.options.conninfo, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
        except psycopg.OperationalError as e:
            raise self._connect_error(e) from None
        except psycopg.Error as e:
            raise SourceError(f"cannot read slot {slot}: {one_line(str(e))}", node=self.node) from None
        if row is None:
            raise SourceError(
                f"replication slot {slot} does not exist: a new slot starts at the server's current "
                "position, so an existing recording cannot be continued without a gap; record to a new file",
                node=self.node,
            )
        return lsn_from_str(str(row[0])) if row[0] is not None else Lsn(0)

    @property
    def received_lsn(self) -> int:
        """The newest WAL position the server has sent (for status; any thread)."""
        return self._received

    @property
    def confirmed_lsn(self) -> int:
        with self._lock:
            return self._confirmed

    def close(self) -> None:
        self._closed.set()

    # --- connection -----------------------------------------------------------------

    def _connect(self) -> pq.abc.PGconn:
        try:
            conninfo = make_conninfo(self.options.conninfo, **self._tcp_options())
            conn = psycopg.connect(conninfo, replication="database", autocommit=True)
        except psycopg.OperationalError as e:
            text = one_line(str(e))
            if not self._started or classify(None, text, connecting=True):
                raise self._connect_error(e) from None
            raise ConnectionLost(f"cannot connect: {text}", node=self.node) from e
        self._conn = conn
        return conn.pgconn

    def _tcp_options(self) -> dict[str, str]:
        """TCP_KEEPALIVES and the node's application_name, less what the source's URL sets itself
        (an operator's choice wins)."""
        try:
            given = conninfo_to_dict(self.options.conninfo)
        except psycopg.ProgrammingError:
            return {}  # (a malformed URL: the connection attempt says what is wrong with it)
        wanted = {
            **TCP_KEEPALIVES,
            "tcp_user_timeout": str(int(self.options.receive_timeout_s * 1000)),
            **for_node(self.options.conninfo, self.node),  # (pg_stat_replication: csnd serve dn1)
        }
        return {k: v for k, v in wanted.items() if k not in given}

    def _connect_error(self, e: psycopg.OperationalError) -> SourceError:
        text = one_line(str(e))
        hint = connect_hint(text)
        return SourceError(f"cannot connect: {text}{'; ' + hint if hint else ''}", node=self.node)

    def _exec(self, pgconn: pq.abc.PGconn, sql: str) -> pq.abc.PGresult:
        res = pgconn.exec_(sql.encode())
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise self._result_error(res, sql.split(" ", 2)[0:2])
        return res

    def _result_error(self, res: pq.abc.PGresult, what: list[str]) -> SourceError:
        msg = one_line((res.error_message or b"").decode(errors="replace"))
        state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() or None
        hint = server_hint(state, msg)
        text = f"{' '.join(what)} failed: {msg}{'; ' + hint if hint else ''}"
        if classify(state, msg, connecting=False):
            return SourceError(text, node=self.node)
        return _Transient(text, node=self.node, sqlstate=state)

    def _check_source(self, pgconn: pq.abc.PGconn, snapshot: str = "never") -> ExportedSnapshot | None:
        """Before the first START_REPLICATION: wal_level, the slot and the publication, each with what to do.

        The server reports a missing publication only when the first change
        is decoded, a slot of another output plugin as an unknown option;
        asking first gives each mistake its own line.
        """
        o = self.options
        res = self._exec(
            pgconn,
            "SELECT current_setting('wal_level'), current_database(), s.plugin, s.database, "
            f"EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {_quote_literal(o.publication)}) "
            "FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots AS s "
            f"ON s.slot_name = {_quote_literal(o.slot)}",
        )
        wal_level, db, plugin, slot_db, has_pub = (
            (v or b"").decode() for v in (res.get_value(0, i) for i in range(5))
        )
        if wal_level != "logical":
            raise SourceError(
                f"wal_level is {wal_level}, logical decoding needs logical: set wal_level = logical "
                "in postgresql.conf and restart the server",
                node=self.node,
            )
        exported: ExportedSnapshot | None = None
        if plugin and snapshot == "initial":
            raise SourceError(
                f"replication slot {o.slot} exists already, but an initial snapshot (snapshot=initial) needs "
                "the slot made now, with the snapshot of its consistent point: drop it "
                f"(csnd slot drop {o.slot} URL) and start again with an empty changelog directory, or use "
                "snapshot=never (stream from the slot) or snapshot=when_needed",
                node=self.node,
            )
        if not plugin:
            export = snapshot in ("initial", "when_needed")
            if not o.create_slot and not export:
                raise SourceError(
                    f"replication slot {o.slot} does not exist; pass --create-slot to create it",
                    node=self.node,
                )
            if has_pub != "t":  # (before the slot is made: a snapshot needs the publication's tables)
                raise self._no_publication(db)
            exported = self._create_slot(pgconn, export=export)
            CREATED_SLOTS.append(CreatedSlot(self.node, o.slot, o.conninfo))
            log.info("node %s: created slot %s", self.node, o.slot)
        elif plugin != "pgoutput":
            raise SourceError(
                f"replication slot {o.slot} uses the output plugin {plugin}, csnd reads pgoutput: "
                "name a pgoutput slot (or a new one with --create-slot)",
                node=self.node,
            )
        elif slot_db != db:
            raise SourceError(
                f"replication slot {o.slot} belongs to database {slot_db}, not {db}: "
                "connect to that database or use another slot",
                node=self.node,
            )
        if has_pub != "t":
            raise self._no_publication(db)
        return exported

    def _no_publication(self, db: str) -> SourceError:
        o = self.options
        return SourceError(
            f"publication {o.publication} does not exist in database {db}: create it "
            f"(CREATE PUBLICATION {_quote_ident(o.publication)} FOR ALL TABLES) "
            "or name the right one with --publication",
            node=self.node,
        )

    def _create_slot(self, pgconn: pq.abc.PGconn, export: bool = False) -> ExportedSnapshot | None:
        """CREATE_REPLICATION_SLOT, which returns once the slot is at its consistent point.

        That waits for the transactions running on the server to end, so the
        command is sent without blocking: `close()` and signals are noticed
        meanwhile, and either cancels it (the server then drops the slot
        being made; a closed socket alone would not stop its wait).  With
        `export`, the snapshot of the consistent point is exported and
        returned, the connection left open (see `prepare`).
        """
        slot = self.options.slot
        how = "(SNAPSHOT 'export')" if export else "NOEXPORT_SNAPSHOT"
        sql = f"CREATE_REPLICATION_SLOT {_quote_ident(slot)} LOGICAL pgoutput {how}"
        pgconn.send_query(sql.encode())
        notice_at = time.monotonic() + SLOT_CREATE_NOTICE_S
        try:
            while pgconn.is_busy():
                if self._wait(pgconn, read=True):
                    self._consume(pgconn)
                elif notice_at and time.monotonic() >= notice_at:
                    notice_at = 0.0
                    log.warning(
                        "node %s: slot %s waits for the transactions running on the server to end "
                        "(its consistent point)",
                        self.node,
                        slot,
                    )
        except BaseException:
            with contextlib.suppress(Exception):
                pgconn.get_cancel().cancel()
            raise
        res = pgconn.get_result()
        while pgconn.get_result() is not None:
            pass
        if res is None:
            raise ConnectionLost(f"CREATE_REPLICATION_SLOT {slot} returned no result", node=self.node)
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise self._result_error(res, ["CREATE_REPLICATION_SLOT", _quote_ident(slot)])
        if not export:
            return None
        # (slot_name, consistent_point, snapshot_name, output_plugin)
        point, name = ((res.get_value(0, i) or b"").decode() for i in (1, 2))
        if not name:
            raise SourceError(f"CREATE_REPLICATION_SLOT {slot} exported no snapshot", node=self.node)
        return ExportedSnapshot(self.node, slot, name, lsn_from_str(point), _now_pg_us(), self._drop_conn)

    def _start(self, pgconn: pq.abc.PGconn) -> None:
        o = self.options
        opts = {
            "proto_version": "2",
            "publication_names": _quote_ident(o.publication),
            "binary": "true" if o.binary else "false",
            "streaming": "on" if o.streaming else "off",
            "messages": "true" if o.messages else "false",
            **o.extra,
        }
        opt_sql = ", ".join(f"{k} {_quote_literal(v)}" for k, v in opts.items())
        start = lsn_to_str(self.confirmed_lsn)
        sql = f"START_REPLICATION SLOT {_quote_ident(o.slot)} LOGICAL {start} ({opt_sql})"
        pgconn.send_query(sql.encode())
        silent_until = time.monotonic() + o.receive_timeout_s  # (no answer at all: as silence in the stream)
        while True:
            if self._wait(pgconn, read=True):
                silent_until = time.monotonic() + o.receive_timeout_s
            elif time.monotonic() >= silent_until:
                raise self._silent(o.receive_timeout_s)
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
        res = pgconn.get_result()
        if res is None or res.status != pq.ExecStatus.COPY_BOTH:
            if res is None:
                raise ConnectionLost("START_REPLICATION returned no result", node=self.node)
            raise self._lost_slot(res) or self._result_error(res, ["START_REPLICATION", f"slot {o.slot}"])

    def _lost_slot(self, res: pq.abc.PGresult) -> SlotLost | None:
        """The slot checked (or streamed from) before is gone: a `SlotLost`, never a retry (`reader.reconnect`)."""
        msg = one_line((res.error_message or b"").decode(errors="replace"))
        state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() or None
        detail = (res.error_field(pq.DiagnosticField.MESSAGE_DETAIL) or b"").decode(errors="replace")
        return lost_slot(
            state,
            msg,
            node=self.node,
            slot=self.options.slot,
            confirmed_lsn=self.confirmed_lsn,
            started=True,
            detail=detail,
        )

    def _wait(self, pgconn: pq.abc.PGconn, read: bool, timeout: float = POLL_S) -> bool:
        if self._closed.is_set():
            raise _Closed
        fd = pgconn.socket
        r, w, _ = select.select([fd] if read else [], [] if read else [fd], [], timeout)
        return bool(r or w)

    def _send_status(self, pgconn: pq.abc.PGconn, reply: bool = False) -> None:
        flush = self.confirmed_lsn
        # write = what we have received; flush/apply = what is durable downstream
        msg = encode_status_update(max(self._received, flush), flush, flush, _now_pg_us(), reply)
        if pgconn.put_copy_data(msg) != 1:
            raise ConnectionLost("cannot send standby status update", node=self.node, lsn=flush)
        pgconn.flush()
        self._reported = flush

    # --- the stream -----------------------------------------------------------------

    def events(self, raw_changes: bool = False) -> EventStream:
        """Yield `(lsn, message)` until `--until-lsn` is reached or `close()`.

        Every change comes parsed whatever `raw_changes` says: the resume
        filter places each one by its LSN and xid (and the walsender, not
        this parse, bounds a live node's rate).
        """
        from csnd.reader.recorded import checked_commit_times

        items = self.frames(runs=raw_changes)
        yield from checked_commit_times(((lsn, msg) for lsn, msg, _payload in items), self.node)

    def frames(self, runs: bool = False) -> Iterator[Item]:
        """Yield `(lsn, message, pgoutput payload)`, reconnecting as needed.

        The payload is the CopyData payload as the server sent it (a resumed
        stream block's Start is re-encoded with `first_segment` cleared).
        With `runs`, consecutive row changes outside stream blocks come as
        one `ChangeFrames` (its payload: its blob), framed as a format-1
        recording frames them, so neither this thread nor the resume filter
        builds an object per change: the decoder workers parse them.
        """
        first = True
        backoff = self.backoff
        first_try = backoff.clock()
        while not self._closed.is_set():
            try:
                pgconn = self._connect()
                backoff.connected()
                if first:
                    self._check_source(pgconn)
                else:
                    yield from self.filter.reconnected(self.confirmed_lsn)
                    self.reconnects += 1
                    log.warning(
                        "node %s: reconnected, resuming from %s", self.node, lsn_to_str(self.confirmed_lsn)
                    )
                    if self.on_reconnect:
                        self.on_reconnect(self.confirmed_lsn)
                self.shutdown.reset()
                self._start(pgconn)
                first = False
                self.reconnecting = False
                self._started = True
                done = yield from self._copy_loop(pgconn, runs)
                if done:
                    return
            except _Closed:
                self._finish_copy()
                return
            except GeneratorExit:  # the consumer left mid-stream (a stop, or its own failure)
                # Say where we got and hang up, so the server frees the slot now; quietly:
                # a close must not raise, and a failed `before_finish` reports nothing.
                with contextlib.suppress(Exception):
                    self._finish_copy()
                self._drop_conn()
                return
            except (ConnectionLost, psycopg.OperationalError, OSError) as err:
                e = (
                    err
                    if isinstance(err, ConnectionLost)
                    else ConnectionLost(one_line(str(err)), node=self.node)
                )
                self._drop_conn()
                busy = isinstance(e, _Transient) and e.sqlstate == _OBJECT_IN_USE
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
                    self._drop_conn()
        self._drop_conn()

    def _copy_loop(self, pgconn: pq.abc.PGconn, runs: bool = False) -> Generator[Item, None, bool]:
        parser = PgOutputParser()
        filt = self.filter.feed
        flowed = False
        last_status = time.monotonic()
        interval = self.options.status_interval_s
        closed = self._closed.is_set
        undrained = False  # items yielded since on_drained was last called
        # Since when the server has sent nothing (None: bytes came since the last look),
        # and whether a reply was asked for in this silence (see RECEIVE_TIMEOUT_S).
        receive_timeout = self.options.receive_timeout_s
        quiet_since: float | None = None
        pinged = False
        # The open run of row-change frames (`runs`): framed payloads and dataStarts.
        run_parts: list[bytes] = []
        run_lsns: list[Lsn] = []
        frame_length, data_start = RUN_FRAME_LENGTH.pack, XLOGDATA_START.unpack_from

        # A Begin held back (`runs`) while its transaction may still come whole:
        # its changes and Commit next, with nothing else between (a `TxnRun` of one).
        held: tuple[Lsn, Begin, bytes] | None = None

        def take_run() -> ChangeFrames | None:
            nonlocal run_parts, run_lsns
            if not run_lsns:
                return None
            run = ChangeFrames(b"".join(run_parts), False, None, run_lsns)
            run_parts, run_lsns = [], []
            return run

        def held_items() -> list[Item]:
            """What is held back goes on as it came: the Begin, then the run."""
            nonlocal held
            out: list[Item] = []
            if held is not None:
                out += filt(held)
                held = None
            run = take_run()
            if run is not None:
                out += filt((run.lsns[0], run, run.blob))
            return out

        def at_end() -> bool:
            """`--until-lsn` is reached with nothing open or held: the stream ends here."""
            until = self.options.until_lsn
            return (
                until is not None
                and self._received >= until
                and self.filter.open_transactions == 0
                and held is None
                and not run_lsns
            )

        get_copy_data = copy_reader(pgconn)  # (libpq's own call when it can: see txnscan)
        # Frames read ahead and not yet handled: by the run loop below, or
        # handed back by `take_whole_txns`.
        ahead: deque[CopyData] = deque()
        stop_at = NO_STOP if self.options.until_lsn is None else self.options.until_lsn
        between = self.filter.between_transactions
        while True:
            if closed():  # (also while data keeps coming: a busy node is stopped as fast)
                raise _Closed
            if ahead:
                nbytes, data = ahead.popleft()
            elif (
                runs
                and held is None
                and not run_lsns
                and not parser.in_stream
                and between()
                and self._received < stop_at
            ):
                # Between transactions: whole one-piece ones, read by the compiled loop.  (Once
                # `--until-lsn` is reached, frame by frame: the stream ends where it always has.
                # Its run limit is RUN_FRAMES - 1: a transaction of RUN_FRAMES changes or more
                # goes on as Begin, runs, Commit, as below.)
                txns, handed, received = take_whole_txns(get_copy_data, SCAN_FRAMES, RUN_FRAMES - 1, stop_at)
                ahead.extend(handed)
                if not txns:
                    continue
                undrained = True
                quiet_since = None  # (bytes came: whatever the last look saw of silence is over)
                if not flowed:
                    flowed = True
                    self.backoff.flowing()
                if received > self._received:
                    self._received = received
                yield from filt((txns[0][0], TxnRun(txns), b""))
                if at_end():
                    self._finish_copy()
                    return True
                continue
            else:
                nbytes, data = get_copy_data(1)
            if (run_lsns or held is not None) and nbytes <= 0:  # (drained, or the stream ends)
                yield from held_items()
            if nbytes == 0:
                now = time.monotonic()
                # Silence is timed from the first moment everything received was handled
                # (here, never per frame: the busy paths stay as they are) to the next byte.
                if quiet_since is None:
                    quiet_since, pinged = now, False
                quiet = now - quiet_since
                if quiet >= receive_timeout:
                    if self._wait(pgconn, read=True, timeout=0.0):  # (it came while we were held up)
                        quiet_since = None
                        self._consume(pgconn)
                        continue
                    raise self._silent(quiet)
                until = self.options.until_lsn
                waiting_for_end = until is not None and self._received < until
                since = now - last_status
                ping = not pinged and quiet >= receive_timeout / 2
                if (
                    ping
                    or since >= interval
                    or (since >= REPORT_GAP_S and (self.confirmed_lsn > self._reported or waiting_for_end))
                ):
                    # with --until-lsn pending, ask for a keepalive so an idle
                    # server tells us its WAL end instead of waiting 30 s; and
                    # half way to the receive timeout, so a healthy one speaks
                    self._send_status(pgconn, reply=waiting_for_end or ping)
                    last_status = now
                    pinged = pinged or ping
                if undrained and self.on_drained is not None:
                    # A short wait first: data that follows at once belongs to the same burst.
                    if self._wait(pgconn, read=True, timeout=DRAINED_WAIT_S):
                        quiet_since = None
                        self._consume(pgconn)
                        continue
                    undrained = False
                    self.on_drained()
                wait = min(POLL_S, interval, max(0.0, quiet_since + receive_timeout - time.monotonic()))
                if self.confirmed_lsn > self._reported or waiting_for_end:  # (a report is due soon)
                    wait = min(wait, max(0.0, REPORT_GAP_S - (time.monotonic() - last_status)))
                if self._wait(pgconn, read=True, timeout=wait):
                    quiet_since = None
                    self._consume(pgconn)
                elif self.on_idle is not None:
                    self.on_idle()
                if self.shutdown.stopping.is_set():
                    raise ConnectionLost(
                        "the server is shutting down and waits for a confirmation that must wait for "
                        f"durable output (confirmed {lsn_to_str(self.confirmed_lsn)}); hanging up so it can stop",
                        node=self.node,
                        lsn=self._received,
                    )
                continue
            if nbytes < 0:
                res = pgconn.get_result()
                detail = ""
                if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
                    if lost := self._lost_slot(res):
                        raise lost
                    detail = one_line((res.error_message or b"").decode(errors="replace"))
                    state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() or None
                    if classify(state, detail, connecting=False):  # e.g. the publication was dropped
                        hint = server_hint(state, detail)
                        raise SourceError(
                            f"the server ended the replication stream: {detail}{'; ' + hint if hint else ''}",
                            node=self.node,
                            lsn=self._received,
                        )
                raise ConnectionLost(
                    f"replication stream ended by the server{': ' + detail if detail else ''}",
                    node=self.node,
                    lsn=self._received,
                )
            payload = bytes(data)
            undrained = True
            quiet_since = None  # (bytes came: whatever the last look saw of silence is over)
            if (
                runs
                and len(payload) > CHANGE_FRAME_MIN
                and payload[XLOGDATA_HEADER_SIZE] in CHANGE_TAGS
                and payload[0] == 0x77
                and not parser.in_stream
            ):
                start = data_start(payload, 1)[0]
                run_parts.append(frame_length(len(payload)))
                run_parts.append(payload)
                run_lsns.append(start)
                # The frames that follow at once are most likely more of the run:
                # read them here, with only the checks a change frame needs.
                # (what was read ahead comes first: it was read before anything the socket holds)
                while len(run_lsns) < RUN_FRAMES:
                    nbytes, data = ahead.popleft() if ahead else get_copy_data(1)
                    if nbytes <= 0:
                        ahead.appendleft((nbytes, data))
                        break
                    payload = bytes(data)
                    if not (
                        len(payload) > CHANGE_FRAME_MIN
                        and payload[XLOGDATA_HEADER_SIZE] in CHANGE_TAGS
                        and payload[0] == 0x77
                    ):
                        ahead.appendleft((nbytes, data))
                        break
                    start = data_start(payload, 1)[0]
                    run_parts.append(frame_length(len(payload)))
                    run_parts.append(payload)
                    run_lsns.append(start)
                if start > self._received:  # (positions only go forward in a run)
                    self._received = start
                if len(run_lsns) >= RUN_FRAMES:  # (a big transaction: it goes on as it comes)
                    yield from held_items()
                continue
            # Row changes, Begins and Commits -- nearly every frame of a busy
            # node -- skip the XLogData object and the general parse (as a
            # recorded file's reader does); the rest, and whatever those
            # paths refuse, go the general way, which reports every error.
            data_msg: tuple[Lsn, Message] | None = parse_hot_frame(payload, parser.in_stream)
            if data_msg is None:
                frame = parse_frame(payload)
                if isinstance(frame, Keepalive):
                    if held is not None or run_lsns:  # (it comes after them)
                        yield from held_items()
                    self._received = max(self._received, frame.wal_end)
                    if frame.reply_requested:
                        self._send_status(pgconn, reply=False)
                        last_status = time.monotonic()
                        # Holding the slot back: is a shutdown waiting on us?
                        if self.confirmed_lsn < self._received:
                            self.shutdown.maybe_probe()
                    yield frame.wal_end, frame, payload
                else:
                    assert isinstance(frame, XLogData)
                    data_msg = frame.data_start, _parse_message(parser, frame, self.node)
            if data_msg is not None:
                if not flowed:
                    flowed = True
                    self.backoff.flowing()
                start, msg = data_msg
                if start > self._received:
                    self._received = start
                if not runs:
                    yield from filt((start, msg, payload))
                elif type(msg) is Commit and held is not None:  # the transaction came whole
                    begin_at, begin, _ = held
                    held = None
                    blob, lsns = (b"".join(run_parts), run_lsns) if run_lsns else (None, None)
                    run_parts, run_lsns = [], []
                    whole = scanned_txn(begin_at, begin, blob, lsns, start, msg)
                    yield from filt((begin_at, TxnRun([whole]), b""))
                else:
                    if held is not None or run_lsns:  # (anything else ends it: it goes on first)
                        yield from held_items()
                    if type(msg) is Begin and not parser.in_stream:
                        held = (start, msg, payload)
                        continue
                    yield from filt((start, msg, payload))
            if at_end():
                self._finish_copy()
                return True

    def _silent(self, quiet: float) -> ConnectionLost:
        """The server has sent nothing for `quiet` seconds, a reply asked for meanwhile: the path is lost."""
        self.silences += 1
        return ConnectionLost(
            f"nothing received on the replication connection of slot {self.options.slot} for {quiet:.0f}s "
            f"(receive_timeout {self.options.receive_timeout_s:g}s), not even the reply it asked for; last "
            f"received {lsn_to_str(self._received)}, confirmed {lsn_to_str(self.confirmed_lsn)}: treating "
            "the connection as lost",
            node=self.node,
            lsn=self._received,
        )

    def _consume(self, pgconn: pq.abc.PGconn) -> None:
        """Reads what the socket holds into libpq's buffer; a lost connection names node and LSN."""
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            raise ConnectionLost(self._pq_error(pgconn), node=self.node, lsn=self._received) from None

    def _pq_error(self, pgconn: pq.abc.PGconn) -> str:
        """libpq's last error on one line (its text spans several, for a log line of one)."""
        return one_line((pgconn.error_message or b"connection lost").decode(errors="replace"))

    def finish(self) -> None:
        """End the stream now (Ctrl-C, SIGTERM): `before_finish`, the last status update, CopyDone.

        Without it an interrupted recording made its file durable but the
        slot never heard of it: the next recording would get those
        transactions again.
        """
        self._finish_copy()

    def _finish_copy(self) -> None:
        """Send the final status update and end the copy cleanly."""
        conn = self._conn
        if conn is None or conn.closed:
            return
        pgconn = conn.pgconn
        if self.before_finish is not None:
            self.before_finish()
        try:
            self._send_status(pgconn)
            pgconn.put_copy_end()
            pgconn.flush()
            self._await_copy_end(pgconn)
        except (ConnectionLost, psycopg.Error, OSError):
            pass
        self._drop_conn()

    def _await_copy_end(self, pgconn: pq.abc.PGconn) -> None:
        """Read (and drop) what the server still sends until it ends the copy too.

        The walsender applies our last status update only when it reads it.
        Closing the socket right after CopyDone lets a walsender that is still
        sending (WAL past --until-lsn) die of a broken pipe first, the update
        unread: the slot stays behind and the next run gets transactions
        again.  The server answers CopyDone with its own only after reading
        everything before it, so once that arrives the update has been taken.
        """
        deadline = time.monotonic() + FINISH_TIMEOUT_S
        while time.monotonic() < deadline:
            nbytes, _ = pgconn.get_copy_data(1)
            if nbytes < 0:
                # The copy's results, never by a blocking get_result: one whose end
                # does not come (seen after a reconnect through a black hole) held
                # the stream's end forever.
                while time.monotonic() < deadline:
                    if pgconn.is_busy():
                        select.select([pgconn.socket], [], [], POLL_S)
                        pgconn.consume_input()
                    elif pgconn.get_result() is None:
                        return
                break
            if nbytes == 0:
                select.select([pgconn.socket], [], [], POLL_S)
                pgconn.consume_input()
        log.warning("node %s: the server did not end the copy within %.0fs", self.node, FINISH_TIMEOUT_S)

    def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()


class _Transient(ConnectionLost):
    """A server error a retry may fix; `sqlstate` says which (a busy slot is waited for even at the start)."""

    def __init__(self, message: str, *, node: str | None = None, sqlstate: str | None = None) -> None:
        self.sqlstate = sqlstate
        super().__init__(message, node=node)


@dataclass(frozen=True)
class ExportedSnapshot:
    """The snapshot a new slot exported at its consistent point (`LiveSource.prepare`).

    Valid while the replication connection that made the slot stays open and
    idle: other connections import it (`SET TRANSACTION SNAPSHOT 'name'` as the
    first statement of a REPEATABLE READ transaction), then `release()`
    closes that connection; their transactions keep the snapshot.
    """

    node: str
    slot: str
    name: str  # what SET TRANSACTION SNAPSHOT takes
    consistent_lsn: int  # the slot's consistent point: streamed commits start at or after it
    made_at: int  # when, in microseconds since 2000-01-01 UTC
    release: Callable[[], None]


@dataclass(frozen=True)
class CreatedSlot:
    node: str
    slot: str
    conninfo: str


# The slots this process created (`--create-slot`): the command line says at
# the end of a run which of them hold WAL and how to drop them.
CREATED_SLOTS: list[CreatedSlot] = []


class _Closed(Exception):
    """`close()` was called: stop quietly."""


def _parse_message(parser: PgOutputParser, frame: XLogData, node: str) -> Message:
    try:
        return parser.parse(frame.payload)
    except FrameError as e:
        raise ProtocolError(e.message, node=node, lsn=frame.data_start or None) from None


def parse_lsn_option(text: str) -> int:
    try:
        return lsn_from_str(text)
    except ValueError as e:
        raise SourceError(str(e)) from None
