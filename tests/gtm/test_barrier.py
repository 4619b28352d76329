"""The GTM commit barrier on three live servers: one CSN X, every commit at or below it done everywhere.

Writer threads (each its own `PgGtm` session, as writer processes have)
commit global transactions that insert their gid on two or three nodes.
Each node's snapshot exported under the barrier is read: every
transaction with a CSN <= X must be in it on every node it wrote, and none
above X on any.  A writer stopped between taking its CSN and preparing
holds the barrier past its timeout: it is released and names the gid; a
node that stops answering under the barrier (its backend stopped with
SIGSTOP, so not even its statement timeout fires) is named the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from csnd.core.errors import BarrierError, CommitIncomplete
from csnd.gtm.barrier import CommitBarrier
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.writer import GlobalTransaction
from csnd.testing.cluster import LocalCluster, start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with start_cluster(3) as c:
        for url in c.urls().values():
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE TABLE bt (gid text PRIMARY KEY)")
        PgGtm(c.gtm_url).close()
        yield c


def _gids(url: str, snapshot: str | None = None) -> set[str]:
    """The node's committed gids: now, or as the snapshot the barrier exported sees them."""
    with psycopg.connect(url, autocommit=True) as conn:
        if snapshot is not None:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)))
        return {str(g) for (g,) in conn.execute("SELECT gid FROM bt").fetchall()}


class _Writer(threading.Thread):
    """Commits global transactions until told to stop; remembers each one's CSN and nodes."""

    def __init__(self, cluster: LocalCluster, index: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.cluster, self.index, self.stop = cluster, index, stop
        self.done: dict[str, tuple[int, list[str]]] = {}
        self.error: BaseException | None = None

    def run(self) -> None:
        urls = self.cluster.urls()
        conns = {n: psycopg.connect(u, autocommit=True) for n, u in urls.items()}
        names = sorted(urls)
        try:
            with PgGtm(self.cluster.gtm_url) as gtm:
                n = 0
                while not self.stop.is_set():
                    n += 1
                    pairs = [names[:2], names[1:], [names[0], names[2]]]
                    touched = names if n % 2 else pairs[(n // 2) % 3]
                    t = GlobalTransaction(gtm, conns, gid=f"b{self.index}-{n}")
                    for node in touched:
                        t.execute(node, "INSERT INTO bt VALUES (%s)", (t.gid,))
                    csn = t.commit()
                    assert csn is not None
                    self.done[t.gid] = (int(csn), touched)
        except BaseException as e:
            self.error = e
        finally:
            for c in conns.values():
                c.close()


class _PausedWriter(threading.Thread):
    """A global transaction on dn1 and dn2 that stops once its CSN is taken, until `go_on` is set."""

    def __init__(self, cluster: LocalCluster, gid: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.gid = cluster, gid
        self.at_csn, self.go_on = threading.Event(), threading.Event()
        self.result: dict[str, Any] = {}

    def _pause(self, step: str) -> None:
        if step == "csn":
            self.at_csn.set()
            self.go_on.wait(60)

    def run(self) -> None:
        conns = {n: psycopg.connect(u, autocommit=True) for n, u in self.cluster.urls().items()}
        try:
            with PgGtm(self.cluster.gtm_url) as gtm:
                t = GlobalTransaction(gtm, conns, gid=self.gid, pause=self._pause)
                t.execute("dn1", f"INSERT INTO bt VALUES ('{self.gid}')")
                t.execute("dn2", f"INSERT INTO bt VALUES ('{self.gid}')")
                self.result["csn"] = t.commit()
        except BaseException as e:
            self.result["error"] = e
        finally:
            for c in conns.values():
                c.close()


def test_the_barrier_cuts_every_node_at_one_csn_under_writers(cluster: LocalCluster) -> None:
    urls = cluster.urls()
    stop = threading.Event()
    writers = [_Writer(cluster, i, stop) for i in range(4)]
    for w in writers:
        w.start()
    try:
        with PgGtm(cluster.gtm_url) as gtm:
            first = gtm.current()
            while gtm.current() < first + 40:  # (the writers are committing before the barrier)
                assert all(w.is_alive() for w in writers), [w.error for w in writers]
                threading.Event().wait(0.01)
        cuts = []
        for i in range(4):
            barrier = CommitBarrier(cluster.gtm_url, urls, timeout_s=20)
            # (what the service imports: each node's exported snapshot, read with the GTM released or held)
            with barrier.export() if i % 2 else barrier.hold() as held:
                seen = {node: _gids(url, held.snapshots[node]) for node, url in urls.items()}
            cuts.append((held, seen))
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=60)
    assert all(w.error is None for w in writers), [w.error for w in writers]
    done = {gid: v for w in writers for gid, v in w.done.items()}
    for held, seen in cuts:
        below = [g for g, (csn, _) in done.items() if csn <= held.csn]
        above = [g for g, (csn, _) in done.items() if csn > held.csn]
        assert below and above, "the barrier did not fall between commits"
        for gid in below:
            _, nodes = done[gid]
            assert all(gid in seen[n] for n in nodes), f"{gid} (csn {done[gid][0]} <= {held.csn}) missing"
        for gid in above:
            assert not any(gid in s for s in seen.values()), f"{gid} (csn {done[gid][0]} > {held.csn}) seen"
        assert held.held_s > 0 and held.held_s >= held.drain_s


def test_a_writer_stuck_after_its_csn_times_the_barrier_out_and_it_names_the_gid(
    cluster: LocalCluster,
) -> None:
    urls = cluster.urls()
    stuck = _PausedWriter(cluster, "stuck-1")
    stuck.start()
    try:
        assert stuck.at_csn.wait(60), stuck.result
        with pytest.raises(BarrierError) as caught, CommitBarrier(cluster.gtm_url, urls, timeout_s=1).hold():
            raise AssertionError("the barrier held with a writer stuck after its csn")
        assert caught.value.gid == "stuck-1"
        assert "stuck-1" in str(caught.value) and "released" in str(caught.value)
        with PgGtm(cluster.gtm_url) as gtm:  # (released: CSNs are handed out again)
            assert gtm.next() > 0
    finally:
        stuck.go_on.set()
        stuck.join(timeout=60)
    result = stuck.result
    assert "error" not in result, result
    assert all("stuck-1" in _gids(u) for n, u in urls.items() if n in ("dn1", "dn2"))


def test_a_node_that_stops_answering_under_the_barrier_times_it_out_and_it_names_the_node(
    cluster: LocalCluster,
) -> None:
    """The barrier waits for a stuck writer; meanwhile dn2's barrier backend is stopped, then the writer goes on."""
    urls = cluster.urls()
    slow = _PausedWriter(cluster, "slow-1")
    result = slow.result

    def barrier() -> None:
        try:
            with CommitBarrier(cluster.gtm_url, urls, timeout_s=5).export():
                result["held"] = True
        except BaseException as e:
            result["barrier"] = e

    threads = [slow, threading.Thread(target=barrier, daemon=True)]
    threads[0].start()
    stopped: int | None = None
    try:
        assert slow.at_csn.wait(60), result
        threads[1].start()  # (it waits for slow-1, whose csn is taken)
        with psycopg.connect(urls["dn2"], autocommit=True) as conn:
            while stopped is None:  # (the barrier's connection to dn2, idle after its first round trip)
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE query LIKE 'SET statement_timeout%%' "
                    "AND state = 'idle' AND pid <> pg_backend_pid()"
                ).fetchone()
                if row is None:
                    assert threads[1].is_alive(), result
                    threading.Event().wait(0.01)
                    continue
                stopped = int(row[0])
        os.kill(stopped, signal.SIGSTOP)
        slow.go_on.set()  # (slow-1 commits: the barrier turns to the nodes, and dn2 does not answer)
        threads[1].join(timeout=60)
        assert not threads[1].is_alive(), "the barrier hung on a node that stopped answering"
    finally:
        slow.go_on.set()
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        for t in threads:
            t.join(timeout=60)
    caught = result.get("barrier")
    assert isinstance(caught, BarrierError), result
    assert caught.node == "dn2" and "dn2" in str(caught) and "released" in str(caught)
    with PgGtm(cluster.gtm_url) as gtm:  # (released: CSNs are handed out again)
        assert gtm.next() > 0
    assert "error" not in result and "held" not in result, result


def test_a_node_down_fails_before_the_gtm_is_held(cluster: LocalCluster) -> None:
    urls = {**cluster.urls(), "dn9": "postgresql://127.0.0.1:1/postgres"}
    with pytest.raises(BarrierError) as caught, CommitBarrier(cluster.gtm_url, urls, timeout_s=1).hold():
        raise AssertionError("held with a node down")
    assert caught.value.node == "dn9" and "nothing was held" in str(caught.value)


def test_a_decided_transaction_of_a_dead_writer_is_committed_under_the_barrier(cluster: LocalCluster) -> None:
    """A writer killed after its decision leaves prepared transactions: the barrier commits them, as recovery would."""
    urls = cluster.urls()
    decided, go_on = threading.Event(), threading.Event()

    def pause(step: str) -> None:
        if step == "decided":
            decided.set()
            go_on.wait(60)

    result: dict[str, Any] = {}

    def dying() -> None:
        conns = {n: psycopg.connect(u, autocommit=True) for n, u in urls.items()}
        gtm = PgGtm(cluster.gtm_url)
        result["pid"] = gtm.owner[0]
        try:
            t = GlobalTransaction(gtm, conns, gid="dead-1", pause=pause)
            t.execute("dn1", "INSERT INTO bt VALUES ('dead-1')")
            t.execute("dn3", "INSERT INTO bt VALUES ('dead-1')")
            t.commit()
        except BaseException as e:
            result["error"] = e
        finally:
            for c in conns.values():
                c.close()
            with contextlib.suppress(Exception):
                gtm.close()

    thread = threading.Thread(target=dying, daemon=True)
    thread.start()
    try:
        assert decided.wait(60), result
        with psycopg.connect(cluster.gtm_url, autocommit=True) as c:  # (the writer's GTM session dies)
            c.execute("SELECT pg_terminate_backend(%s, 30000)", (result["pid"],))
        with CommitBarrier(cluster.gtm_url, urls, timeout_s=20).hold() as held:
            seen = {node: _gids(url) for node, url in urls.items()}
        assert "dead-1" in seen["dn1"] and "dead-1" in seen["dn3"] and "dead-1" not in seen["dn2"]
        assert "dead-1" in held.drained
    finally:
        go_on.set()
        thread.join(timeout=60)
    assert isinstance(result.get("error"), CommitIncomplete), result  # (its own COMMIT PREPARED found none)
