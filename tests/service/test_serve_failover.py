"""Following a failover (PostgreSQL 18): the primary killed -9 under a writer, its standby promoted.

    csnd serve ── postgresql://u@primary:p1,standby:p2/db?target_session_attrs=read-write
                  (or ?host=primary,standby&port=p1,p2&...)

With a failover slot (made on the primary with failover, copied to the
standby by `sync_replication_slots`, the primary holding decoded changes back
until the standby has their WAL: `synchronized_standby_slots`), csnd
reconnects to the promoted standby and continues from the synchronised slot:
every committed row once, as a failover `test_decoding` witness on the new
primary sees them.  A slot that was not synchronised is not on the new
primary: csnd stops with one line naming the node and the slot, and makes no
new slot (which would start from "now" and skip what was committed between).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.fixtures import witness
from tests.fixtures.standby import StandbyPair, standby_pair
from tests.service.servekit import Served, start_serve, subscribe, wait_for

pytestmark = pytest.mark.xdist_group("standby")

DB = "shop"


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    with standby_pair(failover_slots=True) as p:
        yield p


def _setup(pair: StandbyPair, failover: bool) -> None:
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {DB}".encode())
    with psycopg.connect(pair.primary.dsn(DB), autocommit=True) as c:
        c.execute("CREATE TABLE item (id bigint PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
        c.execute(
            "SELECT pg_create_logical_replication_slot('csnd', 'pgoutput', false, false, %s)", (failover,)
        )
        c.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding', false, false, true)")


class Writer:
    """Inserts one row a transaction through the multi-host URL until stopped, across the failover."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.next_id = 1
        self.failed = False  # its connection has failed once (the primary went away)
        self.after_failure = 0  # rows committed since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as c:
                    while not self._stop.is_set():
                        c.execute("INSERT INTO item VALUES (%s, 'x')", (self.next_id,))
                        self.next_id += 1
                        self.after_failure += self.failed
                        time.sleep(0.005)
            except psycopg.Error:  # (the primary is gone: a commit in flight may or may not have landed)
                self.failed = True
                self.next_id += 1_000_000  # (never reuse an id whose commit is unknown)
                self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _witness_ids(pair: StandbyPair) -> list[int]:
    """Every inserted id, in commit order, as test_decoding's failover slot on the new primary sees them."""
    with psycopg.connect(pair.standby.dsn(DB), autocommit=True) as c:
        rows = c.execute(
            "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes("
            "'witness', NULL, NULL, 'skip-empty-xacts', '1')"
        ).fetchall()
    return [
        int(witness.text_values(r.new or ())["id"]) for t in witness.transactions(rows)[0] for r in t.rows
    ]


def _served_ids(served: Served) -> list[int]:
    got = subscribe(served.address, "--idle-timeout", "2")
    assert got.returncode == 0, got.stderr
    return [int(ch["new"]["id"]) for line in got.stdout.splitlines() for ch in json.loads(line)["changes"]]


def _fail_over(pair: StandbyPair, served: Served) -> None:
    wait_for(lambda: int(served.status()["totals"]["transactions"]) > 50, "the stream to flow")
    pair.kill_primary()
    pair.promote()


@pytest.mark.parametrize("hosts_as_parameters", [False, True], ids=["hosts-in-netloc", "hosts-as-parameters"])
def test_a_synchronised_slot_is_followed_with_every_row_once(
    pair: StandbyPair, tmp_path: Path, hosts_as_parameters: bool
) -> None:
    _setup(pair, failover=True)
    pair.sync_new_slots(DB, ("csnd", "witness"))
    url = pair.multi_host_url(DB, hosts_as_parameters)
    served = start_serve([f"dn1={url}&slot=csnd&publication=csnd_pub"], str(tmp_path / "log"))
    writer = Writer(url)
    try:
        _fail_over(pair, served)
        wait_for(lambda: writer.after_failure >= 100, "the writer to commit on the promoted standby")
        writer.stop()
        expected = _witness_ids(pair)
        wait_for(
            lambda: int(served.status()["totals"]["transactions"]) >= len(expected),
            "every transaction in the changelog",
            diagnose=served.status,
        )
        ours = _served_ids(served)
        (node,) = served.status()["nodes"]
        assert node["state"] == "streaming", node
    finally:
        writer.stop()
        code, err = served.terminate()
    assert sorted(set(ours)) == sorted(ours), "a row was delivered twice"
    assert ours == expected
    assert any(i > 1_000_000 for i in ours), "nothing committed after the failover was delivered"
    assert code == 0, err


def test_a_slot_not_synchronised_stops_the_service_naming_node_and_slot(
    pair: StandbyPair, tmp_path: Path
) -> None:
    """(One URL form: how the hosts are given does not change what is missing on the new primary.)"""
    _setup(pair, failover=False)
    url = pair.multi_host_url(DB, hosts_as_parameters=True)
    source = f"dn1={url}&slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    writer = Writer(url)
    try:
        _fail_over(pair, served)
        try:
            served.proc.wait(timeout=120)
        except Exception:
            raise AssertionError("csnd serve still runs with its slot missing on the new primary") from None
        writer.stop()
        _out, err = served.proc.communicate(timeout=30)
    finally:
        writer.stop()
        served.kill()
    assert served.proc.returncode == 1, err
    errors = [ln for ln in err.splitlines() if ln.startswith("csnd serve: error:")]
    assert len(errors) == 1, err
    line = errors[0]
    assert "node dn1" in line and "replication slot csnd" in line, line
    assert "failover" in line and "cannot be delivered" in line, line
    with psycopg.connect(pair.standby.dsn(DB), autocommit=True) as c:
        made = c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'csnd'").fetchone()
    assert made is None, "a new slot was made on the new primary: what committed before it would be skipped"
