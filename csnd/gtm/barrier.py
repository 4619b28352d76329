"""A commit barrier on the shared GTM: one CSN at which every node's snapshot is taken.

A snapshot of a GTM-mode cluster is consistent when it holds, on every
node, exactly the transactions whose commit CSN is at most some X.  The
barrier makes such a moment:

    hold()  ALTER SEQUENCE <gtm> (rolled back at the end): nextval and pg_sequence_last_value wait
            X = the sequence's last value: no CSN above it can be taken while the barrier holds
            drain: every transaction that took a CSN (<= X) commits on every node it touched
            ─► the caller exports each node's snapshot (or makes its slot)
    release ROLLBACK: the writers waiting on the sequence go on, with CSNs above X

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

A live writer's record is always waited for, even when its GTM session
waits on the barrier's lock: a `PgGtm` may be shared by threads, one of
them preparing the transaction the record names while another asks for a
CSN.  A writer that rolls back after taking a CSN deletes its record at
once (`PgGtm.end_commit`), so only a writer stuck mid-commit holds the
barrier to its timeout.

What cannot finish -- a writer stuck between its CSN and its decision, a
node that stops answering -- ends the barrier at its timeout: the lock is
released (the writers go on) and `BarrierError` names the gid or node.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import psycopg
from psycopg import sql

from csnd.core.errors import BarrierError
from csnd.core.ids import Csn
from csnd.gtm.pggtm import DEFAULT_NAME, _first_line, _redact, ensure_objects

log = logging.getLogger("csnd.gtm")

# How long the barrier may hold the GTM before it gives up and releases it.
BARRIER_TIMEOUT_S: Final = 10.0
# How often the commit log and the nodes are looked at while commits drain: a commit's last
# steps take about a millisecond, and writers wait for this the whole time.
POLL_S: Final = 0.001
# The commit log's records with a CSN taken: (gid, csn decided, writer alive, writer pid) -- the
# activity read once, not once a record.
_RECORDS_SQL: Final = sql.SQL(
    "WITH alive AS (SELECT pid, backend_start FROM pg_stat_activity) "
    "SELECT t.gid, t.csn, (t.owner_pid, t.owner_start) IN (SELECT pid, backend_start FROM alive), "
    "t.owner_pid FROM {} t WHERE t.taken IS NOT NULL"
)


@dataclass
class Held:
    """The barrier while it holds: its CSN; once released, how long writers were held."""

    csn: Csn
    lock_wait_s: float = 0.0  # the lock asked for until held (commits taking a CSN then end first)
    drain_s: float = 0.0  # the commits with a CSN finishing on every node
    # from asking for the lock to its release: what a writer's commit may have waited (a nextval
    # asked for after the barrier's lock request queues behind it)
    held_s: float = 0.0
    drained: list[str] = field(default_factory=list)  # gids waited for


class CommitBarrier:
    """`hold()` stops the GTM's CSNs at one value X until the block ends (see the module docstring)."""

    def __init__(
        self,
        gtm_conninfo: str,
        nodes: Mapping[str, str],
        *,
        name: str = DEFAULT_NAME,
        timeout_s: float = BARRIER_TIMEOUT_S,
        connect_timeout: int = 10,
    ) -> None:
        self.gtm_conninfo = gtm_conninfo
        self.nodes = dict(nodes)
        self.name = name
        self.timeout_s = timeout_s
        self.connect_timeout = connect_timeout

    @contextmanager
    def hold(self) -> Iterator[Held]:
        """Hold the GTM at one CSN, every commit at or below it done on every node; release at the end.

        The connections are made first (a node down fails here, before the
        GTM is held); the caller's block should take only what it must take
        at X (exported snapshots), as writers wait meanwhile.
        """
        gtm = self._connect(self.gtm_conninfo, None)
        conns: dict[str, psycopg.Connection[Any]] = {}
        try:
            ensure_objects(gtm, self.name)
            for node, conninfo in self.nodes.items():
                conns[node] = self._connect(conninfo, node)
                # (a node that stops answering ends the barrier at its timeout, not later)
                conns[node].execute(
                    sql.SQL("SET statement_timeout = {}").format(
                        sql.Literal(f"{int(self.timeout_s * 1000)}ms")
                    )
                )
            deadline = time.monotonic() + self.timeout_s
            asked = time.monotonic()
            gtm.execute("BEGIN")
            held: Held | None = None
            locked = time.monotonic()
            try:
                held = self._lock(gtm, asked)
                locked = time.monotonic()
                self._drain(gtm, conns, held, deadline)
                held.drain_s = time.monotonic() - locked
                yield held
            finally:
                with contextlib.suppress(psycopg.Error):  # (closing the connection below releases it too)
                    gtm.execute("ROLLBACK")
                if held is not None:
                    held.held_s = time.monotonic() - asked
        finally:
            gtm.close()
            for conn in conns.values():
                conn.close()
        log.info(
            "gtm commit barrier at csn %d: held %.1f ms (%.1f ms draining %d commits), %d nodes",
            held.csn,
            held.held_s * 1000,
            held.drain_s * 1000,
            len(held.drained),
            len(conns),
            extra={"csn": held.csn},
        )

    def _connect(self, conninfo: str, node: str | None) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(conninfo, autocommit=True, connect_timeout=self.connect_timeout)
        except psycopg.Error as e:
            where = f"node {node}" if node else f"the gtm at {_redact(conninfo)}"
            raise BarrierError(
                f"gtm commit barrier: cannot connect to {where}: {_first_line(e)}; nothing was held",
                node=node,
            ) from None

    def _lock(self, gtm: psycopg.Connection[Any], asked: float) -> Held:
        """The sequence locked against nextval; its last value (X)."""
        ms = max(1, int(self.timeout_s * 1000))
        try:
            gtm.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{ms}ms")))
            gtm.execute(sql.SQL("ALTER SEQUENCE {} CACHE 1").format(sql.Identifier(self.name)))
            row = gtm.execute("SELECT pg_sequence_last_value(%s::regclass)", (self.name,)).fetchone()
        except psycopg.errors.LockNotAvailable:
            raise BarrierError(
                f"gtm commit barrier: sequence {self.name} stayed in use for {self.timeout_s:g}s "
                "(a session holding it inside a long transaction?); released, nothing was held"
            ) from None
        except psycopg.Error as e:
            raise BarrierError(
                f"gtm commit barrier: cannot hold sequence {self.name}: {_first_line(e)} "
                "(the service's --gtm role must own it, as the writers' does)"
            ) from None
        return Held(Csn(int(row[0] or 0) if row else 0), lock_wait_s=time.monotonic() - asked)

    def _drain(
        self,
        gtm: psycopg.Connection[Any],
        conns: Mapping[str, psycopg.Connection[Any]],
        held: Held,
        deadline: float,
    ) -> None:
        """Until every transaction with a CSN (all <= X) is committed on every node, or the deadline."""
        table = sql.Identifier(f"{self.name}_txn")
        seen: set[str] = set()
        while True:
            rows = gtm.execute(_RECORDS_SQL.format(table)).fetchall()
            decided = any(csn is not None for _, csn, *_ in rows)
            prepared = self._prepared(conns) if decided else {}
            waiting: list[str] = []
            for gid, csn, alive, pid in rows:
                left = [
                    (node, local)
                    for node, locals_ in prepared.items()
                    for local in locals_
                    if local.startswith(f"{gid}@")
                ]
                if csn is None:
                    if alive:
                        waiting.append(f"{gid} (csn taken, not decided; writer pid {pid} on the gtm server)")
                        seen.add(gid)
                    continue
                if not left:
                    continue
                if alive:
                    waiting.append(f"{gid} (decided, still prepared on {', '.join(n for n, _ in left)})")
                    seen.add(gid)
                    continue
                # (its writer died after the decision: the decision stands, so commit it, as recovery would)
                for node, local in left:
                    self._commit_prepared(conns[node], node, local, gid)
                seen.add(gid)
            if not waiting:
                held.drained = sorted(seen)
                return
            if time.monotonic() >= deadline:
                raise BarrierError(
                    f"gtm commit barrier at csn {held.csn}: after {self.timeout_s:g}s still waiting for "
                    f"{', '.join(waiting[:3])}{' and more' if len(waiting) > 3 else ''}; released the gtm "
                    "(a stuck writer: csnd gtm recover, or end it, and start again)",
                    gid=waiting[0].split(" ", 1)[0],
                )
            time.sleep(POLL_S)

    def _prepared(self, conns: Mapping[str, psycopg.Connection[Any]]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for node, conn in conns.items():
            try:
                out[node] = [
                    str(g)
                    for (g,) in conn.execute(
                        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                    ).fetchall()
                ]
            except psycopg.Error as e:
                raise BarrierError(
                    f"gtm commit barrier: node {node} did not answer ({_first_line(e)}); released the gtm",
                    node=node,
                ) from None
        return out

    def _commit_prepared(self, conn: psycopg.Connection[Any], node: str, local: str, gid: str) -> None:
        try:
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
