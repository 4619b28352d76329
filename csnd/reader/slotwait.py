"""What a new slot waits for: the transactions that keep it from its consistent point, by name.

CREATE_REPLICATION_SLOT returns once every transaction that held an xid
when the slot began (and every one that got its xid before the slot's
FULL point) has ended -- on the whole server, any database.  A session
left `idle in transaction`, or a transaction prepared by a writer that then
died, holds it for as long as it stays open, and the replication connection
itself says nothing meanwhile.  So, on a second, ordinary connection, the
progress line lists what is open with an xid, oldest first:

    sessions             pg_stat_activity.backend_xid: pid, user, application,
                         state, since when, the first words of its query
    prepared             pg_prepared_xacts: gid, xid, when, owner, database

and says what ends each.  backend_xid is shown to every role; the other
columns of another role's session only to one with pg_read_all_stats (the
line then says so instead).  `describe` and `waiting_line` are pure; only
`open_transactions` does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Final

import psycopg

from csnd.reader.reconnect import one_line

# How many transactions a line names (oldest first); the rest are counted.
SHOWN: Final = 5
# How much of a session's query the line quotes (its first words say what it is).
QUERY_CHARS: Final = 48

_SESSIONS_SQL: Final = (
    "SELECT pid, backend_xid::text, usename, application_name, state, xact_start, "
    f"left(regexp_replace(query, '\\s+', ' ', 'g'), {QUERY_CHARS + 1}) "
    "FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() "
    "ORDER BY age(backend_xid) DESC, pid"
)
_PREPARED_SQL: Final = (
    "SELECT transaction::text, gid, prepared, owner, database FROM pg_prepared_xacts "
    "ORDER BY age(transaction) DESC, gid"
)


@dataclass(frozen=True)
class OpenSession:
    """A server process inside a transaction with an xid (None: not shown to this role)."""

    pid: int
    xid: int
    user: str | None
    application: str | None
    state: str | None
    since: datetime | None
    query: str | None


@dataclass(frozen=True)
class PreparedXact:
    """A prepared transaction: open until COMMIT PREPARED or ROLLBACK PREPARED."""

    gid: str
    xid: int
    prepared: datetime
    owner: str
    database: str


@dataclass(frozen=True)
class OpenTransactions:
    sessions: tuple[OpenSession, ...]
    prepared: tuple[PreparedXact, ...]

    def __bool__(self) -> bool:
        return bool(self.sessions or self.prepared)


def open_transactions(conninfo: str, timeout_s: float = 10.0) -> OpenTransactions:
    """What is open with an xid on the server of `conninfo` now (psycopg.Error if it cannot be asked)."""
    with psycopg.connect(conninfo, autocommit=True, connect_timeout=max(1, int(timeout_s))) as conn:
        conn.execute(f"SET statement_timeout = {int(timeout_s * 1000)}")
        sessions = tuple(
            OpenSession(int(pid), int(xid), user, app, state, since, query)
            for pid, xid, user, app, state, since, query in conn.execute(_SESSIONS_SQL).fetchall()
        )
        prepared = tuple(
            PreparedXact(str(gid), int(xid), when, str(owner), str(db))
            for xid, gid, when, owner, db in conn.execute(_PREPARED_SQL).fetchall()
        )
    return OpenTransactions(sessions, prepared)


def _when(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _session(s: OpenSession) -> str:
    if s.user is None and s.state is None:
        return f"pid {s.pid} (xid {s.xid}; another role's session: pg_read_all_stats shows more)"
    parts = [f"user {s.user}"]
    if s.application:
        parts.append(f"application {s.application}")
    if s.state:
        parts.append(s.state + (f" since {_when(s.since)}" if s.since else ""))
    parts.append(f"xid {s.xid}")
    query = (s.query or "").strip()
    if query:
        cut = query[:QUERY_CHARS] + ("..." if len(query) > QUERY_CHARS else "")
        parts.append(f"last query: {cut}")
    return f"pid {s.pid} ({', '.join(parts)})"


def _prepared(p: PreparedXact) -> str:
    return (
        f"prepared transaction '{p.gid}' (xid {p.xid}, prepared {_when(p.prepared)} "
        f"by {p.owner} in database {p.database})"
    )


def describe(open_now: OpenTransactions) -> str:
    """The open transactions, oldest first (up to SHOWN of them), and what ends each kind."""
    named = [_session(s) for s in open_now.sessions] + [_prepared(p) for p in open_now.prepared]
    if not named:
        return "no transaction holds an xid now (the slot should be at its consistent point shortly)"
    shown = "; ".join(named[:SHOWN])
    if len(named) > SHOWN:
        shown += f"; and {len(named) - SHOWN} more"
    remedies = []
    if open_now.sessions:
        remedies.append(
            "a session's transaction ends when its client commits or rolls it back "
            "(or with SELECT pg_terminate_backend(pid))"
        )
    if open_now.prepared:
        remedies.append(
            "a prepared one with COMMIT PREPARED 'gid' or ROLLBACK PREPARED 'gid' "
            "(csnd gtm recover decides those a failed csnd writer left)"
        )
    return f"{shown}; {'; '.join(remedies)}"


def waiting_line(node: str, slot: str, waited_s: float, open_now: OpenTransactions | str) -> str:
    """The progress line of a slot still short of its consistent point (a str: why none are listed)."""
    head = f"node {node}: slot {slot} waits for its consistent point (waited {waited_s:.0f} s)"
    if isinstance(open_now, str):
        return f"{head}, for the transactions open on the server to end; {open_now}"
    return f"{head}, that is for these transactions on the server to end: {describe(open_now)}"


def gave_up_text(slot: str, timeout_s: float, open_now: OpenTransactions | str, left: bool) -> str:
    """The error of a slot whose wait passed slot_wait_timeout (its node is the error's)."""
    what = open_now if isinstance(open_now, str) else f"still open: {describe(open_now)}"
    after = (
        "the slot in the making was still on the server a while after the cancel: "
        f"drop it (csnd slot drop {slot} URL) before starting again"
        if left
        else "no slot was left on the server"
    )
    return (
        f"cannot create replication slot {slot}: gave up waiting for its consistent point after "
        f"slot_wait_timeout {timeout_s:g} s; it waits for the transactions open on the server to end; "
        f"{what}. {after}; end those transactions and start again, or raise or unset "
        "slot_wait_timeout (--slot-wait-timeout)"
    )


def listing_failure(e: psycopg.Error) -> str:
    return one_line(str(e))
