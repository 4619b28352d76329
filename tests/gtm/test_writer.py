"""csnd.gtm.writer against a real PostgreSQL 15: two databases of one server as nodes dn1, dn2.

Each database gets a test_decoding slot before anything is written; the
decoded output must show the protocol: `committing` before the commit, the
commit marker inside the committed transaction with a larger CSN, `cid`
markers at statement boundaries once the transaction spans both nodes, and
for a transaction whose PREPARE fails, `abort` and no data.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from csnd.gtm.sequencer import Gtm
from csnd.gtm.writer import GlobalTransaction, tick
from tests.fixtures import witness
from tests.fixtures.pg import PgDatabase, PgServer

Conn = psycopg.Connection[Any]


@pytest.fixture
def two_nodes(pg: PgDatabase, pg_server: PgServer) -> Iterator[dict[str, Conn]]:
    second = f"{pg.name}_dn2"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{second}"'.encode())
    conns = {"dn1": pg.connect(), "dn2": psycopg.connect(pg_server.dsn(second), autocommit=True)}
    slots = [f"w_{pg.name}_{name}" for name in conns]  # slot names are server-wide
    try:
        for c, slot in zip(conns.values(), slots, strict=True):
            c.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
            c.execute("CREATE TABLE uq (id int, CONSTRAINT uq_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
        yield conns
    finally:
        for c in conns.values():
            c.close()
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            for slot in slots:
                admin.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (slot,),
                )
            admin.execute(f'DROP DATABASE IF EXISTS "{second}" WITH (FORCE)'.encode())


def _decoded(conn: Conn, slot: str) -> list[tuple[str, str | None]]:
    """The slot's output as (kind, text): ("msg0"/"msg1", marker), ("BEGIN"/"COMMIT", None), ("row", line)."""
    # (the test server runs with synchronous_commit=off and the SQL decoding
    # functions stop at the flushed WAL: `consume` waits until everything written is flushed)
    out: list[tuple[str, str | None]] = []
    for lsn, _, data in witness.consume(conn, slot):
        line = witness.parse_line(witness.lsn_from_text(lsn), data)
        if isinstance(line, witness.Message) and line.prefix == "csn":
            out.append((f"msg{int(line.transactional)}", line.content))
        elif isinstance(line, (witness.Begin, witness.Commit)):
            out.append((data.split()[0], None))
        else:
            out.append(("row", data))
    return out


def test_global_transactions_on_two_nodes(pg: PgDatabase, two_nodes: dict[str, Conn]) -> None:
    dn1, dn2 = two_nodes["dn1"], two_nodes["dn2"]
    gtm = Gtm(start=100)

    t1 = GlobalTransaction(gtm, two_nodes, gid="g-1")
    t1.execute("dn1", "INSERT INTO acct VALUES (1, 'a')")  # statement 0: no marker, one node so far
    t1.execute("dn2", "INSERT INTO acct VALUES (2, 'b')")  # statement 1: 'cid 1' on dn2
    with t1.statement():  # statement 2 on both nodes
        t1.execute("dn1", "UPDATE acct SET v = 'a2' WHERE id = 1")
        t1.execute("dn2", "DELETE FROM acct WHERE id = 2")
    csn1 = t1.commit()
    assert csn1 == 101 and t1.state == "committed"

    assert tick(dn1, gtm) == 101

    t2 = GlobalTransaction(gtm, two_nodes, gid="g-2")
    t2.execute("dn1", "INSERT INTO acct VALUES (3, 'c')")
    t2.execute("dn2", "INSERT INTO uq VALUES (1), (1)")  # fails at PREPARE (deferred unique check)
    with pytest.raises(psycopg.errors.UniqueViolation):
        t2.commit()
    assert t2.state == "aborted"

    with GlobalTransaction(gtm, {"dn2": dn2}, gid="g-3") as t3:  # single node: no cid markers
        t3.execute("dn2", "INSERT INTO acct VALUES (4, 'd')")
        t3.execute("dn2", "INSERT INTO acct VALUES (5, 'e')")
    assert t3.csn is not None and t3.csn > csn1

    for c in (dn1, dn2):
        assert c.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone() == (0,)
    assert dn1.execute("SELECT id, v FROM acct ORDER BY id").fetchall() == [(1, "a2")]
    assert dn2.execute("SELECT id FROM acct ORDER BY id").fetchall() == [(4,), (5,)]

    out1 = _decoded(dn1, f"w_{pg.name}_dn1")
    assert out1 == [
        ("msg0", "committing g-1 100"),
        ("BEGIN", None),
        ("row", "table public.acct: INSERT: id[integer]:1 v[text]:'a'"),
        ("msg1", "cid 2"),
        ("row", "table public.acct: UPDATE: id[integer]:1 v[text]:'a2'"),
        ("msg1", "commit g-1 101"),
        ("COMMIT", None),
        ("msg0", "tick 101"),
        ("msg0", "committing g-2 101"),
        ("msg0", "abort g-2"),  # ROLLBACK PREPARED sends nothing; the abort marker follows
    ]
    out2 = _decoded(dn2, f"w_{pg.name}_dn2")
    assert out2 == [
        ("msg0", "committing g-1 100"),
        ("BEGIN", None),
        ("msg1", "cid 1"),
        ("row", "table public.acct: INSERT: id[integer]:2 v[text]:'b'"),
        ("msg1", "cid 2"),
        ("row", "table public.acct: DELETE: id[integer]:2"),
        ("msg1", "commit g-1 101"),
        ("COMMIT", None),
        ("msg0", "committing g-2 101"),
        ("msg0", "abort g-2"),
        ("msg0", f"committing g-3 {t3.csn - 1}"),
        ("BEGIN", None),
        ("row", "table public.acct: INSERT: id[integer]:4 v[text]:'d'"),
        ("row", "table public.acct: INSERT: id[integer]:5 v[text]:'e'"),
        ("msg1", f"commit g-3 {t3.csn}"),
        ("COMMIT", None),
    ]


def test_rollback_and_misuse(two_nodes: dict[str, Conn]) -> None:
    gtm = Gtm()
    t = GlobalTransaction(gtm, two_nodes)
    assert t.gid.startswith("g-")
    t.execute("dn1", "INSERT INTO acct VALUES (9, 'x')")
    t.rollback()
    assert t.state == "aborted" and gtm.current() == 0
    with pytest.raises(RuntimeError, match="already aborted"):
        t.execute("dn1", "SELECT 1")
    assert two_nodes["dn1"].execute("SELECT count(*) FROM acct").fetchone() == (0,)
    with pytest.raises(ValueError, match="unknown node"):
        GlobalTransaction(gtm, two_nodes).execute("dn9", "SELECT 1")
    with pytest.raises(ValueError, match="gid"):
        GlobalTransaction(gtm, two_nodes, gid="has space")
    assert GlobalTransaction(gtm, two_nodes).commit() is None  # nothing touched, nothing to do


def test_requires_autocommit(pg: PgDatabase) -> None:
    with pg.connect(autocommit=False) as conn, pytest.raises(ValueError, match="autocommit"):
        GlobalTransaction(Gtm(), {"dn1": conn})
