"""Decoding on a hot standby (PostgreSQL 18): `csnd serve` on a standby's slot, under a writer on the primary.

    writer ─► primary ──WAL──► standby ◄── csnd serve (slot csnd, created there)
                                       ◄── test_decoding witness (slot witness, created there)

What the service delivers equals the witness on the same standby, and its
status is healthy: the slot monitor reads the WAL a standby's slot holds from
the standby's replay position (`pg_current_wal_lsn()` fails in recovery) and
shows the node as a standby.  A slot made on a standby waits for the
primary's next running-xacts record; the tests hurry it as the docs say, with
`pg_log_standby_snapshot()` on the primary.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from csnd.service.nodes import SlotMonitor
from tests.fixtures import witness
from tests.fixtures.browser import dump_dom
from tests.fixtures.standby import StandbyPair, standby_pair
from tests.service.servekit import start_serve, subscribe, wait_for

pytestmark = pytest.mark.xdist_group("standby")


@pytest.fixture(scope="module")
def pair() -> Iterator[StandbyPair]:
    with standby_pair(failover_slots=False) as p:
        yield p


_dbs = iter(range(1, 1000))


def _database(pair: StandbyPair) -> str:
    """A fresh database on the primary, with its table and publication, replayed on the standby."""
    name = f"sb{next(_dbs)}"
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}".encode())
    with psycopg.connect(pair.primary.dsn(name), autocommit=True) as c:
        c.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pair.wait_replayed()
    return name


class Hurry:
    """Calls `pg_log_standby_snapshot()` on the primary until stopped: a slot made on the standby completes."""

    def __init__(self, pair: StandbyPair) -> None:
        self._dsn = pair.primary.dsn()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Hurry:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as c:
            while not self._stop.is_set():
                c.execute("SELECT pg_log_standby_snapshot()")
                self._stop.wait(0.2)


def _witness_slot(pair: StandbyPair, db: str) -> str:
    """A test_decoding slot made on the standby in `db` (slot names are the server's: one per database)."""
    slot = f"witness_{db}"
    with Hurry(pair), psycopg.connect(pair.standby.dsn(db), autocommit=True) as c:
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    return slot


def _workload(dsn: str, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in range(rounds):
            with c.transaction(force_rollback=rng.random() < 0.1):
                for _ in range(rng.randint(1, 3)):
                    k = rng.randint(1, 40)
                    if rng.random() < 0.75:
                        c.execute(
                            "INSERT INTO item VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v",
                            (k, f"r{i}"),
                        )
                    else:
                        c.execute("DELETE FROM item WHERE id = %s", (k,))


def _witness(dsn: str, slot: str) -> list[list[tuple[str, int]]]:
    """[(op, id)] of each committed transaction with changes, as test_decoding saw it on the standby."""
    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes("
            "%s, NULL, NULL, 'skip-empty-xacts', '1')",
            (slot,),
        ).fetchall()
    out = []
    for t in witness.transactions(rows)[0]:
        if t.rows:
            out.append([(r.op, int(witness.text_values((r.new or r.old) or ())["id"])) for r in t.rows])
    return out


def _ours(lines: list[str]) -> list[list[tuple[str, int]]]:
    out = []
    for line in lines:
        txn = json.loads(line)
        out.append(
            [
                (ch["op"], int((ch["new"] if ch["new"] is not None else ch["old"])["id"]))
                for ch in txn["changes"]
            ]
        )
    return out


def _eventually(cond: Callable[[], bool], what: str) -> None:
    wait_for(cond, what, seconds=120)


def test_the_slot_monitor_reads_a_standby_slot(pair: StandbyPair) -> None:
    """In recovery there is no pg_current_wal_lsn(): the held WAL is read from the standby's own position."""
    db = _database(pair)
    slot = _witness_slot(pair, db)
    with psycopg.connect(pair.primary.dsn(db), autocommit=True) as c:
        c.execute("INSERT INTO item SELECT g, 'x' FROM generate_series(1, 2000) g")
    pair.wait_replayed()
    reading = SlotMonitor(pair.standby.dsn(db), slot).read_once()
    assert reading.error == "", reading
    assert reading.retained_wal_bytes > 0, reading
    assert reading.wal_status == "reserved", reading
    assert reading.standby, reading


def test_the_slot_monitor_shows_a_primary_as_one(pair: StandbyPair) -> None:
    db = _database(pair)
    with psycopg.connect(pair.primary.dsn(db), autocommit=True) as c:
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"p_{db}",))
        c.execute("INSERT INTO item SELECT g, 'x' FROM generate_series(1, 100) g")
    reading = SlotMonitor(pair.primary.dsn(db), f"p_{db}").read_once()
    with psycopg.connect(pair.primary.dsn(db), autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot(%s)", (f"p_{db}",))
    assert reading.error == "" and reading.retained_wal_bytes > 0 and not reading.standby, reading


def test_a_standby_slot_served_equals_the_witness_with_a_healthy_status(
    pair: StandbyPair, tmp_path: Path
) -> None:
    db = _database(pair)
    slot = _witness_slot(pair, db)
    source = f"dn1={pair.standby.url(db)}?slot=csnd_{db}&publication=csnd_pub&create_slot=true"
    with Hurry(pair):
        served = start_serve([source], str(tmp_path / "log"))
    try:
        writer = threading.Thread(target=_workload, args=(pair.primary.dsn(db), 200, 7))
        writer.start()
        writer.join()
        pair.wait_replayed()
        expected = _witness(pair.standby.dsn(db), slot)
        assert len(expected) > 100
        _eventually(
            lambda: int(served.status()["totals"]["transactions"]) >= len(expected), "every transaction"
        )
        got = subscribe(served.address, "--idle-timeout", "2")
        assert got.returncode == 0, got.stderr
        assert _ours(got.stdout.splitlines()) == expected

        def healthy() -> bool:
            (node,) = served.status()["nodes"]
            return bool(int(node["retained_wal_bytes"]) > 0 and node["server_role"] == "standby")

        _eventually(healthy, "the slot monitor's first reading of the standby's slot")
        (node,) = served.status()["nodes"]
        assert node["state"] == "streaming" and node["error"] == "", node
        assert node["slot_wal_status"] == "reserved", node
        assert served.http is not None
        row = re.search(
            r'<tr [^>]*data-node="dn1"[^>]*data-role="(\w*)"[^>]*>(.*?)</tr>', dump_dom(served.http), re.S
        )
        assert row is not None and row.group(1) == "standby", "the dashboard does not show dn1 as a standby"
        assert re.findall(r"<td[^>]*>(.*?)</td>", row.group(2))[1] == "single · standby"
    finally:
        code, err = served.terminate()
    assert code == 0, err
