"""In-doubt recovery after a writer process is SIGKILLed at each step of its commit.

Three databases of the test server are the nodes dn1..dn3 (prepared
transaction names `<gid>@<node>` are server-wide, so this is a fair
cluster); the GTM lives in dn1.  A test_decoding slot per node is the
witness of the markers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from csnd.gtm.pggtm import PgGtm
from csnd.gtm.recovery import recover_in_doubt
from csnd.gtm.writer import PAUSE_POINTS, GlobalTransaction
from tests.fixtures.pg import PgDatabase, PgServer
from tests.fixtures.witness import create_slot, read_slot

Conn = psycopg.Connection[Any]
NODES = ("dn1", "dn2", "dn3")


@pytest.fixture
def nodes(pg: PgDatabase, pg_server: PgServer) -> Iterator[dict[str, str]]:
    dbs = {"dn1": pg.name, "dn2": f"{pg.name}_dn2", "dn3": f"{pg.name}_dn3"}
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        for n in ("dn2", "dn3"):
            admin.execute(f'CREATE DATABASE "{dbs[n]}"'.encode())
    dsns = {n: pg_server.dsn(db) for n, db in dbs.items()}
    for n, dsn in dsns.items():
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY)")
            create_slot(c, f"r_{pg.name}_{n}")
    try:
        yield dsns
    finally:
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            for n in NODES:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (f"r_{pg.name}_{n}",),
                )
            for n in ("dn2", "dn3"):
                for (gid,) in admin.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (dbs[n],)
                ):
                    with psycopg.connect(dsns[n], autocommit=True) as c:
                        c.execute(f"ROLLBACK PREPARED '{gid}'".encode())
                admin.execute(f'DROP DATABASE IF EXISTS "{dbs[n]}" WITH (FORCE)'.encode())


def _writer(dsns: dict[str, str], step: str, flag: str) -> None:
    """Commit one transaction on every node; stop at `step` (its first occurrence) and wait to be killed."""
    gtm = PgGtm(dsns["dn1"])
    conns = {n: psycopg.connect(d, autocommit=True) for n, d in dsns.items()}

    def pause(at: str) -> None:
        if at == step:
            Path(flag).write_text(t.gid)
            time.sleep(600)

    t = GlobalTransaction(gtm, conns, gid="g-victim", pause=pause)
    for i, n in enumerate(dsns):
        t.execute(n, "INSERT INTO t VALUES (%s)", (i,))
    t.commit()


def _wait_for(path: Path, proc: Any) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        assert proc.is_alive(), "the writer died before its pause point"
        assert time.monotonic() < deadline, "the writer never reached its pause point"
        time.sleep(0.05)


@pytest.mark.parametrize("step", PAUSE_POINTS)
def test_writer_killed_at_each_step(step: str, nodes: dict[str, str], pg: PgDatabase, tmp_path: Path) -> None:
    flag = tmp_path / "paused"
    proc = mp.get_context("spawn").Process(target=_writer, args=(nodes, step, str(flag)))
    proc.start()
    _wait_for(flag, proc)
    assert proc.pid is not None
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()

    conns = {n: psycopg.connect(d, autocommit=True) for n, d in nodes.items()}
    try:
        with PgGtm(nodes["dn1"]) as gtm:
            report = recover_in_doubt(conns, gtm, settle=30)
        commits = step in ("decided", "committed-one")
        assert not report.errors and not report.in_flight
        assert ("g-victim" in report.committed) == (step == "decided" or step == "committed-one")
        for n, c in conns.items():
            assert c.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchone() == (0,)
            assert c.execute("SELECT count(*) FROM t").fetchone() == (1 if commits else 0,), n
        with psycopg.connect(nodes["dn1"]) as g:
            assert g.execute("SELECT count(*) FROM csnd_gtm_txn").fetchone() == (0,), "the record is gone"

        logged = {"intent": 0, "committing": 1}.get(step, 3)  # nodes where committing was logged
        for i, (n, c) in enumerate(conns.items()):
            w = read_slot(c, f"r_{pg.name}_{n}")
            kinds = [m.split(" ")[0] for m in w.markers if "g-victim" in m]
            if commits:
                assert kinds == ["committing"]
                assert [t.gid for t in w.commits] == ["g-victim"] and len(w.commits[0].changes) == 1
            else:
                assert kinds == (["committing", "abort"] if i < logged else []), n
                assert w.commits == []
        # A second recovery finds nothing to do.
        with PgGtm(nodes["dn1"]) as gtm:
            again = recover_in_doubt(conns, gtm)
        assert not (again.committed or again.aborted or again.errors or again.unknown_prepared)
    finally:
        for c in conns.values():
            c.close()


def test_live_writers_are_left_alone(nodes: dict[str, str]) -> None:
    conns = {n: psycopg.connect(d, autocommit=True) for n, d in nodes.items()}
    try:
        with PgGtm(nodes["dn1"]) as gtm:
            t = GlobalTransaction(gtm, conns, gid="g-live")
            t.execute("dn1", "INSERT INTO t VALUES (1)")
            t.execute("dn2", "INSERT INTO t VALUES (1)")
            gtm.begin_commit("g-live", {"dn1": 0})  # as if mid-commit, by this live session
            with PgGtm(nodes["dn1"]) as other:
                report = recover_in_doubt(conns, other, settle=0)
            assert report.in_flight == ["g-live"] and not report.aborted and not report.committed
            t.rollback()
    finally:
        for c in conns.values():
            c.close()
