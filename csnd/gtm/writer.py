"""Writer side of GTM mode: plain PostgreSQL servers as a GaussDB-style cluster.

A `GlobalTransaction` runs statements on the nodes it touches and commits
them with the protocol csnd's GTM mode reads (docs/design.md section 2):

    per statement    BEGIN on first touch; `cid <n>` (transactional) before
                     statement n on a node, once the txn spans several nodes
    commit           0. gtm.begin_commit(gid, nodes): the intent (durable for a shared GTM)
                     1. `committing <gid> <current>` (non-transactional) on each node
                     2. csn = gtm.take_csn(gid): next(), noted in the intent
                     3. on each node: `commit <gid> <csn>` (transactional), PREPARE TRANSACTION
                     4. gtm.decide_commit(gid, csn): the point of no return
                     5. on each node: COMMIT PREPARED; gtm.end_commit(gid)
    failure in 0-3   ROLLBACK [PREPARED] on each node, then `abort <gid>` on every
                     node where `committing` was logged (in a tiny transaction
                     whose commit flushes it, so it unblocks the stream at once)
    failure in 4     the transaction is in doubt: left prepared for recovery

Why this order.  The commit CSN is taken only after `committing` is in every
node's WAL, so a node's sender knows a txn is in flight before any CSN larger
than its committing CSN can commit there.  The commit marker must carry the
CSN, so it follows step 2, and it must be inside the local transaction, so it
precedes PREPARE (after PREPARE the session has no transaction left).
`abort` is logged after the rollback, when it is certain the txn will not
commit.  The local PREPARE identifier is `<gid>@<node>`: prepared-transaction
names are server-wide, and two "nodes" may be databases of one server.

The decision (step 4) is the point of no return, as a two-phase commit
coordinator's log record: before it, recovery rolls the transaction back;
after it, recovery commits it wherever it is still prepared.  Every node
having prepared is necessary for the decision but cannot replace it: once
one node has committed, "prepared everywhere" no longer holds, and only the
record tells recovery the others must commit too.  If the decision itself
fails (the GTM connection broke), it may or may not be durable, so the
writer neither commits nor rolls back: `CommitInDoubt`, and
`csnd gtm recover` finishes it.  If COMMIT PREPARED fails on a node after
the decision, the txn stays prepared there (durably, with its commit marker)
and recovery commits it; `CommitIncomplete` says where.

`pause` is a test hook: called with the name of each step as it is reached
(`PAUSE_POINTS`), so a test can stop a writer process there and kill it.

cid markers are lazy: while the txn has touched a single node, its statements
need no markers (the node's stream order already orders them); from the first
statement on a second node on, each statement is preceded on its node by
`cid <statement number>`, so the coordinator can interleave the nodes'
changes in statement order.

Connections must be in autocommit mode: the helper issues BEGIN itself, and
COMMIT PREPARED cannot run inside a transaction block.  PREPARE needs
`max_prepared_transactions > 0` on every node.  One GlobalTransaction belongs
to one thread; the `Gtm` may be shared.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final

import psycopg
from psycopg import sql

from csnd.core import markers
from csnd.core.errors import CommitIncomplete, CommitInDoubt
from csnd.core.ids import Csn, lsn_from_str
from csnd.gtm.sequencer import Sequencer

_GID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_EMIT = "SELECT pg_logical_emit_message(%s::boolean, %s::text, %s::text)"
# A non-transactional marker is written to the WAL but not flushed
# (docs/design.md section 9): it would reach the walsender only at the next commit or WAL
# writer round (wal_writer_delay).  In a transaction that has an xid, the
# commit record makes the commit flush the WAL up to it, marker included,
# and wakes the walsenders.  pg_current_xact_id() is the cheapest way to get
# an xid; the transaction has no changes, so decoding skips it.  One simple
# query, one round trip; synchronous_commit is forced on for it (a server
# running with it off would not flush at commit).
_EMIT_FLUSHED = sql.SQL(
    "BEGIN; SET LOCAL synchronous_commit = on; SELECT pg_logical_emit_message(false, 'csn', {}); "
    "SELECT pg_current_xact_id(); COMMIT"
)

# The steps of commit(), in order, as passed to the `pause` hook.
PAUSE_POINTS: Final = (
    "intent",  # begin_commit recorded; no marker yet
    "committing",  # `committing` logged on a node (the first call: on one node only)
    "csn",  # committing on every node, commit csn taken, nothing prepared
    "prepared",  # a node prepared (the first call: one node only)
    "all-prepared",  # every node prepared, no decision yet
    "decided",  # decision recorded, nothing committed
    "committed-one",  # a node committed (the first call: one node only)
)

Connection = psycopg.Connection[Any]
Pause = Callable[[str], None]


def emit(conn: Connection, transactional: bool, content: str) -> None:
    """Write one `csn` marker with pg_logical_emit_message."""
    conn.execute(_EMIT, (transactional, markers.PREFIX, content))


def emit_flushed(conn: Connection, content: str) -> None:
    """Write a non-transactional `csn` marker and flush it (see _EMIT_FLUSHED); the session must be idle."""
    conn.execute(_EMIT_FLUSHED.format(sql.Literal(content)))


def tick(conn: Connection, gtm: Sequencer, *, flush: bool = False) -> Csn:
    """Write `tick <gtm.current()>` on a node; returns the CSN written.

    Valid whenever called: a txn not yet committing on this node has not taken
    its commit CSN (it logs committing everywhere first), so it will get one
    larger than the value read here.
    """
    csn = gtm.current()
    write_tick(conn, csn, flush=flush)
    return csn


def write_tick(conn: Connection, csn: Csn, *, flush: bool = False) -> None:
    """Write `tick <csn>`; `csn` must have been read from the GTM before this call."""
    if flush:
        emit_flushed(conn, markers.tick(csn))
    else:
        emit(conn, False, markers.tick(csn))


class _Node:
    __slots__ = ("name", "conn", "local_gid", "cid", "committing_logged", "prepared", "start_lsn")

    def __init__(self, name: str, conn: Connection, gid: str, start_lsn: int) -> None:
        self.name = name
        self.conn = conn
        self.start_lsn = start_lsn  # WAL insert position before this txn's first marker here
        self.local_gid = sql.Literal(f"{gid}@{name}")
        self.cid = 0
        self.committing_logged = False
        self.prepared = False


class GlobalTransaction:
    """One global transaction over several nodes; see the module docstring."""

    def __init__(
        self,
        gtm: Sequencer,
        nodes: Mapping[str, Connection],
        gid: str | None = None,
        *,
        pause: Pause | None = None,
    ) -> None:
        gid = gid or f"g-{uuid.uuid4().hex[:20]}"
        if not _GID_RE.match(gid):
            raise ValueError(f"gid {gid!r} must be 1-200 characters of letters, digits and . _ : -")
        for name, conn in nodes.items():
            if not conn.autocommit:
                raise ValueError(f"node {name}: the connection must be in autocommit mode")
        self.gtm = gtm
        self.gid = gid
        self._pause = pause
        self.nodes = dict(nodes)
        self.csn: Csn | None = None
        self.state = "active"  # -> "committed" | "aborted"
        self._touched: dict[str, _Node] = {}
        self._statements = 0
        self._stmt_cid: int | None = None  # set inside statement()

    # --- statements -----------------------------------------------------------

    @contextmanager
    def statement(self) -> Iterator[None]:
        """Group executes on several nodes into one statement (one cid)."""
        self._check_active()
        if self._stmt_cid is not None:
            raise RuntimeError("statement() blocks do not nest")
        self._stmt_cid = self._statements
        self._statements += 1
        try:
            yield
        finally:
            self._stmt_cid = None

    def execute(self, node: str, query: Any, params: Any = None) -> psycopg.Cursor[Any]:
        """Run `query` on `node` as the next statement of this transaction."""
        self._check_active()
        if self._stmt_cid is None:
            cid = self._statements
            self._statements += 1
        else:
            cid = self._stmt_cid
        n = self._touch(node)
        if len(self._touched) > 1 and n.cid != cid:
            emit(n.conn, True, markers.cid(cid))
            n.cid = cid
        return n.conn.execute(query, params)

    def _touch(self, node: str) -> _Node:
        n = self._touched.get(node)
        if n is None:
            try:
                conn = self.nodes[node]
            except KeyError:
                raise ValueError(
                    f"unknown node {node!r}; this transaction has {sorted(self.nodes)}"
                ) from None
            # The insert position is a lower bound of this txn's markers here,
            # where recovery looks for them; asked in BEGIN's round trip.
            row = conn.execute("SELECT pg_current_wal_insert_lsn()::text; BEGIN").fetchone()
            assert row is not None
            n = self._touched[node] = _Node(node, conn, self.gid, lsn_from_str(row[0]))
        return n

    def _check_active(self) -> None:
        if self.state != "active":
            raise RuntimeError(f"global transaction {self.gid} is already {self.state}")

    # --- commit / rollback ----------------------------------------------------

    def commit(self) -> Csn | None:
        """Commit on every touched node; returns the commit CSN (None if nothing was touched)."""
        self._check_active()
        nodes = list(self._touched.values())
        if not nodes:
            self.state = "committed"
            return None
        gtm, gid, pause = self.gtm, self.gid, self._pause or _no_pause
        try:
            committing = gtm.begin_commit(gid, {n.name: n.start_lsn for n in nodes})
            pause("intent")
            for n in nodes:
                emit(n.conn, False, markers.committing(gid, committing))
                n.committing_logged = True
                pause("committing")
            csn = gtm.take_csn(gid)
            pause("csn")
            for n in nodes:
                emit(n.conn, True, markers.commit(gid, csn))
                n.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(n.local_gid))
                n.prepared = True
                pause("prepared")
            pause("all-prepared")
        except BaseException as e:
            errors = self._abort(nodes)
            for err in errors:
                e.add_note(f"while rolling back global transaction {gid}: {err}")
            if not errors:
                gtm.end_commit(gid)
            raise
        try:
            gtm.decide_commit(gid, csn)
        except Exception as e:
            self.state = "in-doubt"
            self.csn = csn
            raise CommitInDoubt(gid, csn, str(e)) from e
        pause("decided")
        committed: list[str] = []
        for i, n in enumerate(nodes):
            try:
                n.conn.execute(sql.SQL("COMMIT PREPARED {}").format(n.local_gid))
            except psycopg.Error as e:
                self.state = "committed"
                self.csn = csn
                raise CommitIncomplete(gid, csn, committed, [m.name for m in nodes[i:]]) from e
            committed.append(n.name)
            pause("committed-one")
        gtm.end_commit(gid)
        self.state = "committed"
        self.csn = csn
        return csn

    def rollback(self) -> None:
        """Roll back before commit; nothing was logged, so no markers are needed."""
        self._check_active()
        errors = self._abort(list(self._touched.values()))
        if errors:
            raise RuntimeError(
                f"global transaction {self.gid}: rollback failed on {len(errors)} node(s): {errors[0]}"
            ) from errors[0]

    def _abort(self, nodes: list[_Node]) -> list[psycopg.Error]:
        """Best effort on every node (a failure on one must not leave the others open); returns the errors."""
        self.state = "aborted"
        errors: list[psycopg.Error] = []
        for n in nodes:
            try:
                if n.prepared:
                    n.conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(n.local_gid))
                elif n.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    n.conn.execute("ROLLBACK")
            except psycopg.Error as e:
                errors.append(e)
        for n in nodes:
            if n.committing_logged:
                try:
                    emit_flushed(n.conn, markers.abort(self.gid))
                except psycopg.Error as e:
                    errors.append(e)
        return errors

    def __enter__(self) -> GlobalTransaction:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.state == "active":
            if exc_type is None:
                self.commit()
            else:
                self.rollback()


def _no_pause(step: str) -> None:
    pass
