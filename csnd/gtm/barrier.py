"""A commit barrier on the shared GTM: one CSN at which every node's snapshot is taken.

A snapshot of a GTM-mode cluster is consistent when it holds, on every
node, exactly the transactions whose commit CSN is at most some X.  The
barrier makes such a moment:

    connect  the GTM and every node, each warmed with the barrier's statements (no lock),
             before anything is held (a node down or not answering fails here)
    lock     one round trip: BEGIN; ALTER SEQUENCE <gtm> (rolled back at the end), so
             nextval and pg_sequence_last_value wait; X = its last value; the commit
             log's records with a CSN taken (all <= X)
    drain    until every such transaction is decided (GTM side), then on every node at
             once, one round trip each: its prepared transactions, then an exported
             snapshot -- kept when none of those transactions is still prepared there
    release  ROLLBACK: the writers waiting on the sequence go on, with CSNs above X

What must hold while the barrier is up is only that no CSN above X is
handed out before every node's snapshot is fixed, so the barrier does
nothing else while it holds: the connections are made before, the nodes
are served in parallel (the barrier's length is the slowest node's, not
their sum), and the exported snapshots are imported after the release
(`export()`; they stay importable while their transactions stay open).

Why the sequence.  A writer's commit takes its CSN with nextval (and reads
the current one with pg_sequence_last_value); both lock the sequence in
ROW EXCLUSIVE mode, which the SHARE ROW EXCLUSIVE lock of ALTER SEQUENCE
excludes.  So writers wait only at their commit step, for the barrier's
length, and nothing else of theirs is held up.  A writer's DML, its
markers and its PREPARE go on; only the CSN waits.  The ALTER is rolled
back, never applied: it is there for its lock (and needs the sequence's
owner, the role the writers' `PgGtm` uses).

What "drained" means, read from the commit log (`PgGtm`, `<name>_txn`),
whose `taken` column is written by the very statement that took the CSN
(`PgGtm.take_csn`), so once the barrier has the lock every CSN at most X
shows there:

    taken, decided (csn set)   wait until no node has '<gid>@...' prepared; a dead
                               writer's is committed now, as `csnd gtm recover` does
    taken, not decided         its writer is preparing: wait; a dead writer's is never
                               committed (recovery rolls it back): not waited for
    not taken                  its CSN comes after the barrier: above X

A decided transaction is prepared on every node it touched, so where it is
no longer prepared it has committed, and a snapshot taken after that sees
it.  That is why a node's round trip reads its prepared transactions in a
statement of their own, committed before the snapshot's transaction
begins: the other order could miss a commit made between the two.

A live writer's record is always waited for, even when its GTM session
waits on the barrier's lock: a `PgGtm` may be shared by threads, one of
them preparing the transaction the record names while another asks for a
CSN.  A writer that rolls back after taking a CSN deletes its record at
once (`PgGtm.end_commit`), so only a writer stuck mid-commit holds the
barrier to its timeout.

What cannot finish -- a writer stuck between its CSN and its decision, a
node that stops answering -- ends the barrier at its timeout: the lock is
released (the writers go on) and `BarrierError` names the gid or node.  The
nodes' round trips are sent at once and their answers read as they come
on one thread, with the deadline as the wait's limit, so a node that stops
answering (not even its statement timeout fires) cannot hold the GTM past it.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from csnd.core.appname import named_conninfo
from csnd.core.errors import BarrierError
from csnd.core.ids import Csn
from csnd.gtm.pggtm import DEFAULT_NAME, _first_line, _redact, ensure_objects

log = logging.getLogger("csnd.gtm")

# How long the barrier may hold the GTM before it gives up and releases it: a longer one
# outlasts a slower commit under way (a busy node), a shorter one bounds what writers wait
# when a writer or a node is stuck.  Overridable (`csnd serve --gtm-barrier-timeout`).
BARRIER_TIMEOUT_S: Final = 10.0
# How long the barrier waits between looks at the commit log and the nodes while commits with
# a CSN drain: a commit's last steps take about a millisecond, and writers wait the whole time.
POLL_S: Final = 0.001
# The commit log's records with a CSN taken: (gid, csn decided, writer alive, writer pid) -- the
# activity read once, not once a record.
_RECORDS_SQL: Final = sql.SQL(
    "WITH alive AS (SELECT pid, backend_start FROM pg_stat_activity) "
    "SELECT t.gid, t.csn, (t.owner_pid, t.owner_start) IN (SELECT pid, backend_start FROM alive), "
    "t.owner_pid FROM {} t WHERE t.taken IS NOT NULL"
)
# A node's round trip under the barrier: its prepared transactions in a statement committed
# on its own (the COMMIT ends the implicit block), then the snapshot exported after it.
_PREPARED_SQL: Final = "SELECT gid FROM pg_prepared_xacts WHERE database = current_database(); COMMIT; "
_EXPORT_SQL: Final = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT pg_export_snapshot()"


@dataclass(frozen=True)
class _Record:
    """A commit-log record with a CSN taken, as the barrier reads it."""

    gid: str
    csn: int | None  # the decision; None: its writer is still preparing
    alive: bool  # its writer's GTM session still exists
    pid: int


@dataclass
class Held:
    """The barrier: its CSN, each node's exported snapshot, and how long each step took.

    The steps, each from the lock asked for: `lock_wait_s` until the lock was
    held and X read; `decided_s` until every commit with a CSN was decided;
    `node_s[node]` until that node's snapshot was exported; `drain_s` until
    the last one was; `held_s` until the release, what a writer's commit may
    have waited (a nextval asked for after the barrier's lock request queues
    behind it).
    """

    csn: Csn
    lock_wait_s: float = 0.0
    decided_s: float = 0.0
    drain_s: float = 0.0
    held_s: float = 0.0
    node_s: dict[str, float] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)  # node -> pg_export_snapshot() name
    drained: list[str] = field(default_factory=list)  # gids waited for
    rounds: int = 0  # looks at the nodes (1 when nothing had to drain)


class CommitBarrier:
    """One cut at CSN X on every node (see the module docstring).

    `export()` releases the GTM before its block (the service's use);
    `hold()` keeps it held through its block.  Either yields `Held` with
    every node's exported snapshot, importable until the block ends.
    """

    def __init__(
        self,
        gtm_conninfo: str,
        nodes: Mapping[str, str],
        *,
        name: str = DEFAULT_NAME,
        timeout_s: float = BARRIER_TIMEOUT_S,
        connect_timeout: int = 10,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"the barrier's timeout must be positive, got {timeout_s}")
        self.gtm_conninfo = gtm_conninfo
        self.nodes = dict(nodes)
        self.name = name
        self.timeout_s = timeout_s
        self.connect_timeout = connect_timeout

    @contextmanager
    def export(self) -> Iterator[Held]:
        """Every node's snapshot exported at one CSN, the GTM already released; importable in the block."""
        with _Session(self) as session:
            held = session.cut()
            session.release(held)
            self._log(held)
            yield held

    @contextmanager
    def hold(self) -> Iterator[Held]:
        """As `export()`, with the GTM held until the block ends (writers wait meanwhile)."""
        with _Session(self) as session:
            held = session.cut()
            try:
                yield held
            finally:
                session.release(held)
            self._log(held)

    def _log(self, held: Held) -> None:
        log.info(
            "gtm commit barrier at csn %d: held %.1f ms (lock %.1f ms, %d nodes exported by %.1f ms, "
            "%d commits drained)",
            held.csn,
            held.held_s * 1000,
            held.lock_wait_s * 1000,
            len(held.snapshots),
            held.drain_s * 1000,
            len(held.drained),
            extra={"csn": held.csn},
        )


class _Session:
    """The barrier's connections (made before anything is held) and its steps."""

    def __init__(self, barrier: CommitBarrier) -> None:
        self.b = barrier
        self.gtm: psycopg.Connection[Any] | None = None
        self.conns: dict[str, psycopg.Connection[Any]] = {}
        self.asked = 0.0
        self.deadline = 0.0
        self.holding = False  # the lock asked for: an error from here on says it was released

    def __enter__(self) -> _Session:
        b = self.b
        try:
            self.gtm = self._connect(b.gtm_conninfo, None)
            ensure_objects(self.gtm, b.name)
            self._warm(self.gtm, None, _warm_gtm_sql(b.name))
            for node, conninfo in b.nodes.items():
                self.conns[node] = self._connect(conninfo, node)
            # (a node that stops answering mid-statement ends the barrier at its timeout, not later; the
            # rest warms the node's caches: its first export took several ms more than the next ones)
            warm = f"SET statement_timeout = '{int(b.timeout_s * 1000)}ms'; {_PREPARED_SQL}{_EXPORT_SQL}; ROLLBACK"
            self.deadline = time.monotonic() + b.timeout_s
            self._on_nodes(dict.fromkeys(self.conns, warm.encode()))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.gtm is not None:
            self.gtm.close()  # (releases the lock too, were it still held)
        for conn in self.conns.values():
            conn.close()

    def _warm(self, conn: psycopg.Connection[Any], node: str | None, query: sql.SQL | sql.Composed) -> None:
        """The barrier's own statements, or what they read, once before anything is held.

        A new backend's first use of a catalog loads it into its caches: the
        first ALTER SEQUENCE, or the first export, of a connection took 5 to
        7 ms on a loaded machine and 1 to 2 ms once these were read before.
        """
        try:
            _result_sets(conn.execute(query))
        except psycopg.Error as e:
            where = f"node {node}" if node else "the gtm"
            raise BarrierError(
                f"gtm commit barrier: {where} cannot run the barrier's statements: {_first_line(e)}; "
                "nothing was held",
                node=node,
            ) from None

    def _connect(self, conninfo: str, node: str | None) -> psycopg.Connection[Any]:
        try:
            named = named_conninfo(conninfo, node or "gtm barrier")
            return psycopg.connect(named, autocommit=True, connect_timeout=self.b.connect_timeout)
        except psycopg.Error as e:
            where = f"node {node}" if node else f"the gtm at {_redact(conninfo)}"
            raise BarrierError(
                f"gtm commit barrier: cannot connect to {where}: {_first_line(e)}; nothing was held",
                node=node,
            ) from None

    # --- the steps --------------------------------------------------------------------

    def cut(self) -> Held:
        """Lock, drain and export every node's snapshot; the GTM stays held (`release` ends it)."""
        self.asked = time.monotonic()
        self.deadline = self.asked + self.b.timeout_s
        self.holding = True
        held, records = self._lock_gtm()
        held.lock_wait_s = time.monotonic() - self.asked
        try:
            self._drain(held, records)
        except BaseException:
            self.release(held)
            raise
        held.drain_s = time.monotonic() - self.asked
        return held

    def release(self, held: Held) -> None:
        assert self.gtm is not None
        if self.gtm.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):  # (closing the connection releases it too)
                self.gtm.execute("ROLLBACK")
            held.held_s = time.monotonic() - self.asked

    def _lock_gtm(self) -> tuple[Held, list[_Record]]:
        """One round trip: the sequence locked against nextval, its last value (X), the records with a CSN."""
        assert self.gtm is not None
        b = self.b
        ms = max(1, int(b.timeout_s * 1000))
        query = sql.SQL(
            "BEGIN; SET LOCAL lock_timeout = {ms}; ALTER SEQUENCE {seq} CACHE 1; "
            "SELECT pg_sequence_last_value({name}::regclass); {records}"
        ).format(
            ms=sql.Literal(f"{ms}ms"),
            seq=sql.Identifier(b.name),
            name=sql.Literal(b.name),
            records=_RECORDS_SQL.format(sql.Identifier(f"{b.name}_txn")),
        )
        try:
            sets = _result_sets(self.gtm.execute(query))
        except psycopg.errors.LockNotAvailable:
            self._rollback_gtm()
            raise BarrierError(
                f"gtm commit barrier: sequence {b.name} stayed in use for {b.timeout_s:g}s "
                "(a session holding it inside a long transaction?); released, nothing was held"
            ) from None
        except psycopg.Error as e:
            self._rollback_gtm()
            raise BarrierError(
                f"gtm commit barrier: cannot hold sequence {b.name}: {_first_line(e)} "
                "(the service's --gtm role must own it, as the writers' does)"
            ) from None
        last, rows = sets[0], sets[1]
        csn = Csn(int(last[0][0] or 0) if last else 0)
        return Held(csn), [_Record(str(g), c, bool(a), int(p)) for g, c, a, p in rows]

    def _rollback_gtm(self) -> None:
        assert self.gtm is not None
        with contextlib.suppress(psycopg.Error):
            self.gtm.execute("ROLLBACK")

    def _records(self) -> list[_Record]:
        assert self.gtm is not None
        table = sql.Identifier(f"{self.b.name}_txn")
        try:
            rows = self.gtm.execute(_RECORDS_SQL.format(table)).fetchall()
        except psycopg.Error as e:
            raise BarrierError(
                f"gtm commit barrier: the gtm did not answer ({_first_line(e)}); released the gtm"
            ) from None
        return [_Record(str(g), c, bool(a), int(p)) for g, c, a, p in rows]

    def _drain(self, held: Held, records: list[_Record]) -> None:
        """Until every node's snapshot is exported with every commit at or below X in it, or the deadline."""
        seen: set[str] = set()
        while True:
            waiting = [
                f"{r.gid} (csn taken, not decided; writer pid {r.pid} on the gtm server)"
                for r in records
                if r.csn is None and r.alive
            ]
            seen.update(r.gid for r in records if r.csn is None and r.alive)
            if not waiting:
                held.decided_s = held.decided_s or time.monotonic() - self.asked
                decided = {r.gid: r for r in records if r.csn is not None}
                waiting += self._export_nodes(held, decided, seen)
            if not waiting:
                held.drained = sorted(seen)
                return
            if time.monotonic() >= self.deadline:
                raise BarrierError(
                    f"gtm commit barrier at csn {held.csn}: after {self.b.timeout_s:g}s still waiting for "
                    f"{', '.join(waiting[:3])}{' and more' if len(waiting) > 3 else ''}; released the gtm "
                    "(a stuck writer: csnd gtm recover, or end it, and start again)",
                    gid=waiting[0].split(" ", 1)[0],
                )
            time.sleep(POLL_S)
            records = self._records()

    def _export_nodes(self, held: Held, decided: Mapping[str, _Record], seen: set[str]) -> list[str]:
        """One round trip on every node not yet exported, at once; what they still wait for."""
        held.rounds += 1
        todo = [node for node in self.conns if node not in held.snapshots]
        queries = {node: self._export_query(node, bool(decided)) for node in todo}
        waiting: list[str] = []
        for node, sets in self._on_nodes(queries).items():
            prepared = [str(g) for (g,) in sets[0]] if decided else []
            left = [local for local in prepared if local.split("@", 1)[0] in decided]
            if not left:
                held.snapshots[node] = str(sets[-1][0][0])
                held.node_s[node] = time.monotonic() - self.asked
                continue
            for local in left:
                record = decided[local.split("@", 1)[0]]
                seen.add(record.gid)
                if record.alive:
                    waiting.append(f"{record.gid} (decided, still prepared on {node})")
                else:
                    # (its writer died after the decision: the decision stands, so commit it, as recovery would)
                    self._commit_prepared(self.conns[node], node, local, record.gid)
                    waiting.append(f"{record.gid} (decided, committed on {node} for a writer that died)")
        return waiting

    def _export_query(self, node: str, prepared: bool) -> bytes:
        # (an export kept from an earlier round is ended first: it was premature)
        again = self.conns[node].info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        return (("ROLLBACK; " if again else "") + (_PREPARED_SQL if prepared else "") + _EXPORT_SQL).encode()

    def _on_nodes(self, queries: Mapping[str, bytes]) -> dict[str, list[list[tuple[str, ...]]]]:
        """Each node's query sent at once, the answers read as they come, until the deadline.

        On the connections' libpq handles, not through psycopg's blocking
        calls: one thread waits on every node's socket, so a node that stops
        answering ends the barrier at the deadline (its connection is closed
        with the others) instead of holding it.
        """
        out: dict[str, list[list[tuple[str, ...]]]] = {node: [] for node in queries}
        with selectors.DefaultSelector() as sel:
            for node, query in queries.items():
                pgconn = self.conns[node].pgconn
                try:
                    pgconn.send_query(query)
                    while pgconn.flush():
                        pass  # (a few hundred bytes: the socket takes them at once)
                except psycopg.Error as e:
                    raise self._node_error(node, str(e)) from None
                sel.register(pgconn.socket, selectors.EVENT_READ, node)
            while sel.get_map():
                left = self.deadline - time.monotonic()
                ready = sel.select(max(0.0, left)) if left > 0 else []
                if not ready:
                    node = str(next(iter(sel.get_map().values())).data)
                    raise BarrierError(
                        f"gtm commit barrier: node {node} did not answer within {self.b.timeout_s:g}s; "
                        f"{self._outcome()} (is the node overloaded or stopped?)",
                        node=node,
                    )
                for key, _ in ready:
                    node = str(key.data)
                    if self._read_results(node, out[node]):
                        sel.unregister(key.fileobj)
        return out

    def _read_results(self, node: str, sets: list[list[tuple[str, ...]]]) -> bool:
        """What arrived on the node's connection; True once its query's last result is in."""
        pgconn = self.conns[node].pgconn
        try:
            pgconn.consume_input()
        except psycopg.Error as e:
            raise self._node_error(node, str(e)) from None
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                return True
            if result.status == psycopg.pq.ExecStatus.TUPLES_OK:
                sets.append(
                    [
                        tuple((result.get_value(r, c) or b"").decode() for c in range(result.nfields))
                        for r in range(result.ntuples)
                    ]
                )
            elif result.status != psycopg.pq.ExecStatus.COMMAND_OK:
                message = (result.error_message or b"").decode(errors="replace")
                while pgconn.get_result() is not None:
                    pass  # (the rest of the query's results: the connection idle again)
                raise self._node_error(node, message)
        return False

    def _node_error(self, node: str, message: str) -> BarrierError:
        first = (message.strip().splitlines() or ["the connection broke"])[0]
        return BarrierError(
            f"gtm commit barrier: node {node} did not answer ({first}); {self._outcome()}", node=node
        )

    def _outcome(self) -> str:
        return "released the gtm" if self.holding else "nothing was held"

    def _commit_prepared(self, conn: psycopg.Connection[Any], node: str, local: str, gid: str) -> None:
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.execute("ROLLBACK")  # (the premature export of this round)
            conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(local)))
        except psycopg.errors.UndefinedObject:
            pass  # (finished meanwhile: by its node, or a recovery)
        except psycopg.Error as e:
            raise BarrierError(
                f"gtm commit barrier: cannot commit {local}, decided by a writer that died: {_first_line(e)}; "
                "released the gtm (run csnd gtm recover)",
                node=node,
                gid=gid,
            ) from None
        log.warning(
            "gtm commit barrier: committed %s, decided by a writer that died (as recovery does)", local
        )


def _warm_gtm_sql(name: str) -> sql.Composed:
    """What the lock's round trip reads, without its lock: the sequence, its catalog row, the commit log."""
    return sql.SQL(
        "SELECT pg_sequence_last_value({name}::regclass); "
        "SELECT seqcache FROM pg_sequence WHERE seqrelid = {name}::regclass; "
        "SELECT count(*) FROM pg_event_trigger; {records}"
    ).format(name=sql.Literal(name), records=_RECORDS_SQL.format(sql.Identifier(f"{name}_txn")))


def _result_sets(cur: psycopg.Cursor[Any]) -> list[list[tuple[Any, ...]]]:
    """The rows of every statement of a multi-statement query that returned rows, in order."""
    out: list[list[tuple[Any, ...]]] = []
    while True:
        if cur.description is not None:
            out.append(cur.fetchall())
        if not cur.nextset():
            return out
