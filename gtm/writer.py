"""Writer side of GTM mode: plain PostgreSQL servers as a GaussDB-style cluster.

A `GlobalTransaction` runs statements on the nodes it touches and commits
them with the protocol csnd's GTM mode reads (DESIGN section 2):

    per statement    BEGIN on first touch; `cid <n>` (transactional) before
                     statement n on a node, once the txn spans several nodes
    commit           1. `committing <gid> <gtm.current()>` (non-transactional) on each node
                     2. csn = gtm.next()
                     3. on each node: `commit <gid> <csn>` (transactional), PREPARE TRANSACTION
                     4. on each node: COMMIT PREPARED
    failure in 1-3   ROLLBACK [PREPARED] on each node, then `abort <gid>` on every
                     node where `committing` was logged

Why this order.  The commit CSN is taken only after `committing` is in every
node's WAL, so a node's sender knows a txn is in flight before any CSN larger
than its committing CSN can commit there.  The commit marker must carry the
CSN, so it follows step 2, and it must be inside the local transaction, so it
precedes PREPARE (after PREPARE the session has no transaction left).
`abort` is logged after the rollback, when it is certain the txn will not
commit.  The local PREPARE identifier is `<gid>@<node>`: prepared-transaction
names are server-wide, and two "nodes" may be databases of one server.  COMMIT PREPARED is the point of no return: if it fails on a node,
the txn stays prepared there (durably, with its commit marker) and must be
committed with COMMIT PREPARED; `CommitIncomplete` says where.

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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from csnd.core.ids import Csn
from csnd.gtm import markers
from csnd.gtm.sequencer import Gtm

_GID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
_EMIT = "SELECT pg_logical_emit_message(%s::boolean, %s::text, %s::text)"

Connection = psycopg.Connection[Any]


class CommitIncomplete(Exception):
    """COMMIT PREPARED failed on some nodes after it succeeded on others.

    The txn is committed where `committed` says and still prepared (with its
    commit marker) on `pending`; run `COMMIT PREPARED '<gid>@<node>'` there.
    """

    def __init__(self, gid: str, csn: int, committed: list[str], pending: list[str]) -> None:
        self.gid = gid
        self.csn = csn
        self.committed = committed
        self.pending = pending
        super().__init__(
            f"global transaction {gid} (csn {csn}) is committed on {committed or 'no node'} but still "
            f"prepared on {pending}; run COMMIT PREPARED '{gid}@<node>' there"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (CommitIncomplete, (self.gid, self.csn, self.committed, self.pending))


def emit(conn: Connection, transactional: bool, content: str) -> None:
    """Write one `csn` marker with pg_logical_emit_message."""
    conn.execute(_EMIT, (transactional, markers.PREFIX, content))


def tick(conn: Connection, gtm: Gtm) -> Csn:
    """Write `tick <gtm.current()>` on a node; returns the CSN written.

    Valid whenever called: a txn not yet committing on this node has not taken
    its commit CSN (it logs committing everywhere first), so it will get one
    larger than the value read here.
    """
    csn = gtm.current()
    emit(conn, False, markers.tick(csn))
    return csn


class _Node:
    __slots__ = ("name", "conn", "local_gid", "cid", "committing_logged", "prepared")

    def __init__(self, name: str, conn: Connection, gid: str) -> None:
        self.name = name
        self.conn = conn
        self.local_gid = sql.Literal(f"{gid}@{name}")
        self.cid = 0
        self.committing_logged = False
        self.prepared = False


class GlobalTransaction:
    """One global transaction over several nodes; see the module docstring."""

    def __init__(self, gtm: Gtm, nodes: Mapping[str, Connection], gid: str | None = None) -> None:
        gid = gid or f"g-{uuid.uuid4().hex[:20]}"
        if not _GID_RE.match(gid):
            raise ValueError(f"gid {gid!r} must be 1-200 characters of letters, digits and . _ : -")
        for name, conn in nodes.items():
            if not conn.autocommit:
                raise ValueError(f"node {name}: the connection must be in autocommit mode")
        self.gtm = gtm
        self.gid = gid
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
            conn.execute("BEGIN")
            n = self._touched[node] = _Node(node, conn, self.gid)
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
        try:
            for n in nodes:
                emit(n.conn, False, markers.committing(self.gid, self.gtm.current()))
                n.committing_logged = True
            csn = self.gtm.next()
            for n in nodes:
                emit(n.conn, True, markers.commit(self.gid, csn))
                n.conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(n.local_gid))
                n.prepared = True
        except BaseException as e:
            for err in self._abort(nodes):
                e.add_note(f"while rolling back global transaction {self.gid}: {err}")
            raise
        committed: list[str] = []
        for i, n in enumerate(nodes):
            try:
                n.conn.execute(sql.SQL("COMMIT PREPARED {}").format(n.local_gid))
            except psycopg.Error as e:
                self.state = "committed"
                self.csn = csn
                raise CommitIncomplete(self.gid, csn, committed, [m.name for m in nodes[i:]]) from e
            committed.append(n.name)
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
                    emit(n.conn, False, markers.abort(self.gid))
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
