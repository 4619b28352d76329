"""The replication connection of a live source: opening it, waiting on it, and what its failures mean.

psycopg 3 has no replication API, so a live source drives a
`replication=database` connection at the pq level (docs/design.md section
9).  This module owns that connection -- its libpq options, the `select`
that waits on its socket (and notices `close()`), reading what the socket
holds -- and turns what the server answers into the reader's errors: a
`SourceError` for a mistake to fix, a `TransientError` for what a retry may
cure (`reader.reconnect.classify` decides), a `SlotLost` for a slot that is
gone.  The protocol on top of it (the options asked of pgoutput, the copy
loop, the slot's creation) lives in the modules that use it.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from typing import Final

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from csnd.core.appname import for_node
from csnd.core.errors import ConnectionLost, SlotLost, SourceError
from csnd.core.ids import Lsn, lsn_to_str
from csnd.reader.reconnect import classify, connect_hint, lost_slot, one_line, server_hint

log = logging.getLogger("csnd.reader.live")

# Longest a wait for data blocks, so `close()` and deadlines are noticed.
POLL_S: Final = 0.5
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
# (see `await_copy_end`) before it closes the connection anyway.
FINISH_TIMEOUT_S: Final = 10.0
# The SQLSTATE of a slot still held by another walsender.
OBJECT_IN_USE: Final = "55006"
# PostgreSQL 18's pgoutput meets a publication it cannot find (dropped, or
# not yet created at that point of the WAL) with a WARNING of this text
# (SQLSTATE 55000, shared with much else, so the text decides; a server
# whose lc_messages translates it is not recognised) and streams on without
# that publication's changes; 15 to 17 ended the stream with an error.  csnd
# must not confirm past such a gap.
SKIPPED_PUBLICATION: Final = "skipped loading publication"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class Closed(Exception):
    """`close()` was called: stop quietly."""


class TransientError(ConnectionLost):
    """A server error a retry may fix; `sqlstate` says which (a busy slot is waited for even at the start)."""

    def __init__(self, message: str, *, node: str | None = None, sqlstate: str | None = None) -> None:
        self.sqlstate = sqlstate
        super().__init__(message, node=node)


def connect_error(node: str, e: psycopg.OperationalError) -> SourceError:
    """A failed connection as one line, with what to do when the text says (pg_hba, password...)."""
    text = one_line(str(e))
    hint = connect_hint(text)
    return SourceError(f"cannot connect: {text}{'; ' + hint if hint else ''}", node=node)


class ReplicationConnection:
    """The one replication connection a live source has open at a time (or none).

    `closed` is the source's close flag: every wait raises `Closed` once it
    is set, so a blocked reader stops within `POLL_S`.  `silences` counts the
    connections given up as silent past the receive timeout (a black-holed path).
    """

    def __init__(self, node: str, conninfo: str, receive_timeout_s: float, closed: threading.Event) -> None:
        self.node = node
        self.conninfo = conninfo
        self.receive_timeout_s = receive_timeout_s
        self.closed = closed
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None
        self.silences = 0
        # Set by the notice handler when the server warns that it leaves
        # changes out (see SKIPPED_PUBLICATION); the copy loop raises it after
        # each read, before anything read with or after the warning goes on.
        self.refusal: SourceError | None = None

    def open(self, started: bool) -> pq.abc.PGconn:
        """Connect; before the stream ever `started`, any failure is a `SourceError` (a typo, not an outage)."""
        try:
            conninfo = make_conninfo(self.conninfo, **self.tcp_options())
            conn = psycopg.connect(conninfo, replication="database", autocommit=True)
        except psycopg.OperationalError as e:
            text = one_line(str(e))
            if not started or classify(None, text, connecting=True):
                raise connect_error(self.node, e) from None
            raise ConnectionLost(f"cannot connect: {text}", node=self.node) from e
        conn.add_notice_handler(self.on_notice)
        self.conn = conn
        return conn.pgconn

    def on_notice(self, diag: psycopg.errors.Diagnostic) -> None:
        """A server notice on the replication connection: a skipped publication is a refusal, the rest
        are logged."""
        text = one_line(diag.message_primary or "")
        if text.startswith(SKIPPED_PUBLICATION):
            name = text[len(SKIPPED_PUBLICATION) :].strip(' :"')
            hint = server_hint("42704", "publication")  # (15's error for the same case: undefined_object)
            detail = one_line(diag.message_detail or "")
            self.refusal = SourceError(
                f'publication "{name}" does not exist: the server warned "{text}"'
                f"{' (' + detail + ')' if detail else ''} and would stream on without its changes; "
                f"{hint}",
                node=self.node,
            )
            return
        log.info("node %s: the server says: %s", self.node, text, extra={"node": self.node})

    def tcp_options(self) -> dict[str, str]:
        """TCP_KEEPALIVES and the node's application_name, less what the source's URL sets itself
        (an operator's choice wins)."""
        try:
            given = conninfo_to_dict(self.conninfo)
        except psycopg.ProgrammingError:
            return {}  # (a malformed URL: the connection attempt says what is wrong with it)
        wanted = {
            **TCP_KEEPALIVES,
            "tcp_user_timeout": str(int(self.receive_timeout_s * 1000)),
            **for_node(self.conninfo, self.node),  # (pg_stat_replication: csnd serve dn1)
        }
        return {k: v for k, v in wanted.items() if k not in given}

    def drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()

    def wait(self, pgconn: pq.abc.PGconn, read: bool, timeout: float = POLL_S) -> bool:
        """Whether the socket became readable (writable) within `timeout`; `Closed` once closed."""
        if self.closed.is_set():
            raise Closed
        fd = pgconn.socket
        r, w, _ = select.select([fd] if read else [], [] if read else [fd], [], timeout)
        return bool(r or w)

    def consume(self, pgconn: pq.abc.PGconn, lsn: Lsn | None = None) -> None:
        """Reads what the socket holds into libpq's buffer; a lost connection names node and LSN."""
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            raise ConnectionLost(pq_error(pgconn), node=self.node, lsn=lsn) from None

    def exec(self, pgconn: pq.abc.PGconn, sql: str) -> pq.abc.PGresult:
        res = pgconn.exec_(sql.encode())
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise self.result_error(res, sql.split(" ", 2)[0:2])
        return res

    def result_error(self, res: pq.abc.PGresult, what: list[str]) -> SourceError:
        msg = one_line((res.error_message or b"").decode(errors="replace"))
        state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() or None
        hint = server_hint(state, msg)
        text = f"{' '.join(what)} failed: {msg}{'; ' + hint if hint else ''}"
        if classify(state, msg, connecting=False):
            return SourceError(text, node=self.node)
        return TransientError(text, node=self.node, sqlstate=state)

    def lost_slot(self, res: pq.abc.PGresult, slot: str, confirmed_lsn: Lsn) -> SlotLost | None:
        """The slot checked (or streamed from) before is gone: a `SlotLost`, never a retry (`reader.reconnect`)."""
        msg = one_line((res.error_message or b"").decode(errors="replace"))
        state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() or None
        detail = (res.error_field(pq.DiagnosticField.MESSAGE_DETAIL) or b"").decode(errors="replace")
        return lost_slot(
            state, msg, node=self.node, slot=slot, confirmed_lsn=confirmed_lsn, started=True, detail=detail
        )

    def silent(self, quiet: float, slot: str, received: Lsn, confirmed: Lsn) -> ConnectionLost:
        """The server has sent nothing for `quiet` seconds, a reply asked for meanwhile: the path is lost."""
        self.silences += 1
        return ConnectionLost(
            f"nothing received on the replication connection of slot {slot} for {quiet:.0f}s "
            f"(receive_timeout {self.receive_timeout_s:g}s), not even the reply it asked for; last "
            f"received {lsn_to_str(received)}, confirmed {lsn_to_str(confirmed)}: treating "
            "the connection as lost",
            node=self.node,
            lsn=received,
        )


def pq_error(pgconn: pq.abc.PGconn) -> str:
    """libpq's last error on one line (its text spans several, for a log line of one)."""
    return one_line((pgconn.error_message or b"connection lost").decode(errors="replace"))


def await_copy_end(pgconn: pq.abc.PGconn, node: str) -> None:
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
    log.warning("node %s: the server did not end the copy within %.0fs", node, FINISH_TIMEOUT_S)
