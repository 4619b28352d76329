"""Where a GTM node's stream may begin: once every commit that straddles its start is decided.

Why.  A writer logs `committing <gid> <k>` -- a non-transactional logical
message -- before it takes its commit CSN; its `commit` marker travels inside
its local transaction (docs/design.md section 2).  A slot's stream starts at a
position S: a new slot's consistent point, or where the slot was confirmed.
PostgreSQL sends a non-transactional message only if it lies at or after S,
but a transaction whenever its commit does -- its snapshot builder decodes
every transaction that got its xid after the slot's FULL point, which comes
before the consistent point.  So a transaction whose `committing` lies before
S and whose commit lies after it arrives without its marker, and nothing held
larger CSNs back for it: a larger CSN could be released first, and the stream
could not go on past it.

What.  Every such transaction is open at S, and its commit or rollback lies
after S.  Before the stream starts, with the slot at its position,
`settle_start`

1. notes what is open on the server now: every session of the database
   inside a transaction that has no xid yet (a participant that only read on
   this node logs `committing` before it has an xid; a role without
   pg_read_all_stats sees no other role's transaction start, so the one csnd
   connects as should have it when writers connect as others), then every xid
   below one it takes for itself (prepared transactions included).  Not below
   a snapshot's xmax: that is one past the newest *completed* xid, so a writer
   holding the newest xid handed out, none later completed, lies at or above
   it and in no snapshot's running list, and would not be waited for.  And
   the sessions first: one that gets its xid after that look got it before
   this start's own, so the xid bound covers it;
2. waits until each of them has ended, saying after a while which are still
   open and what ends them (a prepared transaction a failed writer left:
   `csnd gtm recover`);
3. writes `csnd.start <token>`: a non-transactional logical message, flushed by
   the commit of a tiny transaction that has an xid.

The node's sender (`NodeSender(start_token=...)`) releases nothing and
promises no watermark until that message arrives.  Every transaction that
could have logged `committing` before S has its commit or rollback earlier in
the stream, so the commits gathered until then are ordered by the usual rule,
and nothing after the message can be missing its marker.  The token tells this
start's message from another start's, or another service's on the same
database.

Every start of a GTM-mode live node settles, not only one that made its slot:
a slot made by hand, a service stopped before its first start settled, and a
pipeline restart all begin where no `committing` marker before them is known.
A start waits as long as the transactions open at that moment take (a
writer's commit: a moment); meanwhile the slot keeps the WAL, nothing is lost,
and what commits is delivered once the start is settled.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Final

import psycopg
from psycopg import sql

from csnd.core.errors import ConnectionLost, SourceError
from csnd.core.ids import Lsn, lsn_from_str
from csnd.core.markers import START_PREFIX
from csnd.reader.reconnect import one_line

log = logging.getLogger("csnd.reader.settle")

# How often the wait asks whether the open transactions have ended.  Shorter:
# the stream starts sooner after the last of them; longer: fewer queries while
# a long one runs.  One cheap query each.
SETTLE_POLL_S: Final = 0.05
# After this long, the wait says once which transactions it waits for, and
# again every SETTLE_REPEAT_S: a prepared transaction left by a failed writer
# waits for recovery, and an open session for whoever holds it.
SETTLE_NOTICE_S: Final = 5.0
SETTLE_REPEAT_S: Final = 60.0

# An xid of our own, committed at once: every xid handed out so far is below it.
# (A snapshot's xmax is not: it is one past the newest completed xid.)
_BOUND_SQL: Final = "SELECT pg_current_xact_id()::text"
# Sessions of this database inside a transaction that has no xid (yet).
_SESSIONS_SQL: Final = (
    "SELECT pid, xact_start::text FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend' AND xact_start IS NOT NULL AND backend_xid IS NULL"
)
_XIDS_ENDED_SQL: Final = "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s::text::xid8"
_STILL_OPEN_SQL: Final = (
    "SELECT x::text, p.gid FROM pg_snapshot_xip(pg_current_snapshot()) AS x "
    "LEFT JOIN pg_prepared_xacts AS p ON p.transaction::text = (x::text::int8 %% 4294967296)::text "
    "WHERE x < %s::text::xid8 ORDER BY x LIMIT 5"
)
_EMIT_SQL: Final = "SELECT pg_logical_emit_message(false, {}, {})::text"

Session = tuple[int, str]  # (pid, xact_start)
Conn = psycopg.Connection[Any]


def new_start_token() -> str:
    """A token no other start has: the content of this start's `csnd.start` message."""
    return uuid.uuid4().hex


def settle_start(
    conninfo: str,
    node: str,
    slot: str,
    token: str,
    stop: threading.Event,
    clock: Callable[[], float] = time.monotonic,
) -> Lsn | None:
    """Wait until what is open on the server now has ended, then write `csnd.start <token>` (module docstring).

    Call with the slot at its position (made or checked), before the stream
    starts.  Returns where the message ends, or None if `stop` was set first.
    A failure is a `SourceError` naming the node and the slot; a lost
    connection a `ConnectionLost` (transient: the pipeline is started again).
    """
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            bound, sessions = _open_now(conn)
            if not _wait_ended(conn, node, slot, bound, sessions, stop, clock):
                return None
            return _write_start(conn, token)
    except psycopg.Error as e:
        what = (
            f"cannot settle the start of slot {slot}'s stream (wait for the transactions open at its "
            f"start to end, then write its {START_PREFIX} message): {one_line(str(e))}"
        )
        if isinstance(e, psycopg.OperationalError):  # (the server went away: a restart may mend it)
            raise ConnectionLost(what, node=node) from None
        raise SourceError(what, node=node) from None


def _open_now(conn: Conn) -> tuple[int, set[Session]]:
    """(an xid above every one handed out so far, the sessions in a transaction without an xid)."""
    sessions = {(int(pid), str(start)) for pid, start in conn.execute(_SESSIONS_SQL).fetchall()}
    row = conn.execute(_BOUND_SQL).fetchone()  # (autocommit: its own transaction, ended here)
    assert row is not None
    return int(str(row[0])), sessions


def _wait_ended(
    conn: Conn,
    node: str,
    slot: str,
    bound: int,
    sessions: set[Session],
    stop: threading.Event,
    clock: Callable[[], float],
) -> bool:
    """Until every xid below `bound` and every one of `sessions`' transactions has ended; False: stopped."""
    began = clock()
    notice_at = began + SETTLE_NOTICE_S
    while True:
        row = conn.execute(_XIDS_ENDED_SQL, (str(bound),)).fetchone()
        xids_done = row is not None and bool(row[0])
        if sessions:
            sessions &= {(int(p), str(s)) for p, s in conn.execute(_SESSIONS_SQL).fetchall()}
        if xids_done and not sessions:
            if clock() >= began + SETTLE_NOTICE_S:
                log.info(
                    "node %s: slot %s: the transactions open at the stream's start have ended", node, slot
                )
            return True
        if clock() >= notice_at:
            notice_at = clock() + SETTLE_REPEAT_S
            log.warning("node %s: %s", node, _waiting_for(conn, slot, bound, sessions, xids_done))
        if stop.wait(SETTLE_POLL_S):
            return False


def _waiting_for(conn: Conn, slot: str, bound: int, sessions: set[Session], xids_done: bool) -> str:
    """What the wait still waits for, and what ends it."""
    parts: list[str] = []
    if not xids_done:
        rows = conn.execute(_STILL_OPEN_SQL, (str(bound),)).fetchall()
        shown = [f"{x} (prepared as {gid})" if gid else str(x) for x, gid in rows]
        parts.append("transactions " + ", ".join(shown) if shown else "transactions below xid " + str(bound))
    if sessions:
        pids = ", ".join(str(p) for p, _ in sorted(sessions)[:5])
        parts.append(f"the open transactions of server processes {pids}")
    return (
        f"slot {slot}: the stream waits for {' and '.join(parts)} to end: one of them may have logged a "
        "committing marker before the stream's start, and commits after it cannot be ordered until it is "
        "decided; nothing is lost meanwhile.  a prepared transaction left by a failed writer is decided by "
        "csnd gtm recover (or COMMIT/ROLLBACK PREPARED); an idle session, by ending its transaction"
    )


def _write_start(conn: Conn, token: str) -> Lsn:
    """`csnd.start <token>`, flushed: the commit of a transaction with an xid flushes the WAL up to it."""
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = on")
        row = conn.execute(
            sql.SQL(_EMIT_SQL).format(sql.Literal(START_PREFIX), sql.Literal(token))
        ).fetchone()
        conn.execute("SELECT pg_current_xact_id()")
    assert row is not None
    return Lsn(lsn_from_str(str(row[0])))
