"""The failover fault class: the primary killed -9 under load, its standby promoted, csnd following.

Each run builds a PostgreSQL 18 primary with a hot standby that synchronises
failover slots (tests/fixtures/standby.py), makes csnd's slot and a
`test_decoding` witness as failover slots, serves the pair through one
multi-host URL (odd seeds `u@a:p1,b:p2`, even seeds `?host=a,b&port=p1,p2`)
under two writers of multi-row transactions, kills the primary with SIGKILL
at a moment drawn from the seed, promotes the standby, lets the writers
commit on it, and checks what a subscriber reads against the witness on the
new primary: every transaction once, in commit order, nothing else.  The
outcome joins the fault table (tests/faults/conftest.py) as `failover`.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.faults.conftest import record, runs
from tests.faults.harness import Outcome
from tests.fixtures import witness
from tests.fixtures.standby import StandbyPair, standby_pair
from tests.fixtures.witness import lsn_from_text
from tests.service.servekit import Served, start_serve, subscribe, wait_for

pytestmark = pytest.mark.xdist_group("failover")

FAULT = "failover"
DB = "shop"
WRITERS = 2
# Commits each writer makes on the promoted standby before the run drains.
AFTER_PROMOTION = 40

# A transaction as both sides show it: its tag, then (table, op, id) of each change.
Txn = tuple[str, tuple[tuple[str, str, int], ...]]


class Writer:
    """Transactions of 1-5 changes to its own keys through the multi-host URL, until stopped.

    Every row a transaction writes carries its tag (`w<writer>-<n>`), so a
    transaction is known on both sides.  A commit whose answer was lost with
    the primary may or may not have landed: its tag is never used again.
    """

    def __init__(self, index: int, url: str, seed: int) -> None:
        self.index, self.url = index, url
        self.rng = random.Random(seed * 100 + index)
        self.n = 0
        self.failed = False
        self.after_failure = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        base = (self.index + 1) * 1_000_000
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as c:
                    while not self._stop.is_set():
                        self.n += 1
                        tag = f"w{self.index}-{self.n}"
                        with c.transaction():
                            c.execute("INSERT INTO item VALUES (%s, %s)", (base + self.n, tag))
                            for _ in range(self.rng.randint(0, 4)):
                                key = base + self.rng.randint(1, self.n)
                                if self.rng.random() < 0.7:
                                    c.execute("UPDATE item SET v = %s WHERE id = %s", (tag, key))
                                else:
                                    c.execute("INSERT INTO other VALUES (%s, %s)", (base * 10 + self.n, tag))
                        self.after_failure += self.failed
            except psycopg.Error:
                self.failed = True
                self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _setup(pair: StandbyPair) -> None:
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as c:
        c.execute(f"CREATE DATABASE {DB}".encode())
    with psycopg.connect(pair.primary.dsn(DB), autocommit=True) as c:
        c.execute("CREATE TABLE item (id bigint PRIMARY KEY, v text)")
        c.execute("CREATE TABLE other (id bigint PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
        for slot, plugin in (("csnd", "pgoutput"), ("witness", "test_decoding")):
            c.execute("SELECT pg_create_logical_replication_slot(%s, %s, false, false, true)", (slot, plugin))
    pair.sync_new_slots(DB, ("csnd", "witness"))


def _witness(pair: StandbyPair) -> list[Txn]:
    with psycopg.connect(pair.standby.dsn(DB), autocommit=True) as c:
        rows = c.execute(
            "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes("
            "'witness', NULL, NULL, 'skip-empty-xacts', '1')"
        ).fetchall()
    out: list[Txn] = []
    for t in witness.transactions(rows)[0]:
        if not t.rows:
            continue
        values = [witness.text_values((r.new or r.old) or ()) for r in t.rows]
        changes = tuple(
            (r.table.split(".")[-1], r.op, int(v["id"])) for r, v in zip(t.rows, values, strict=True)
        )
        out.append((str(values[0]["v"]), changes))
    return out


def _ours(served: Served) -> list[Txn]:
    got = subscribe(served.address, "--idle-timeout", "2")
    assert got.returncode == 0, got.stderr
    out: list[Txn] = []
    for line in got.stdout.splitlines():
        txn = json.loads(line)
        rows = [ch["new"] if ch["new"] is not None else ch["old"] for ch in txn["changes"]]
        changes = tuple(
            (ch["table"].split(".")[-1], str(ch["op"]), int(r["id"]))
            for ch, r in zip(txn["changes"], rows, strict=True)
        )
        out.append((str(rows[0]["v"]), changes))
    return out


def _transactions(served: Served) -> int:
    return int(served.status()["totals"]["transactions"])


def _check(outcome: Outcome, expected: list[Txn], ours: list[Txn]) -> None:
    want, got = Counter(expected), Counter(ours)
    outcome.transactions = len(expected)
    outcome.lost = sum((want - got).values())
    outcome.doubled = sum((got - want).values())
    if outcome.lost or outcome.doubled:
        missing = [t for t, _ in (want - got).items()][:5]
        extra = [t for t, _ in (got - want).items()][:5]
        outcome.problems.append(
            f"lost {outcome.lost} (e.g. {missing}), doubled or extra {outcome.doubled} (e.g. {extra})"
        )
    elif ours != expected:
        first = next(i for i, (a, b) in enumerate(zip(ours, expected, strict=True)) if a != b)
        outcome.problems.append(
            f"out of commit order from transaction {first}: {ours[first][0]} for {expected[first][0]}"
        )


@pytest.mark.parametrize("seed", list(range(1, runs() + 1)))
def test_failover(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    hosts_as_parameters = seed % 2 == 0
    outcome = Outcome(FAULT, seed)
    with standby_pair(failover_slots=True) as pair:
        _setup(pair)
        url = pair.multi_host_url(DB, hosts_as_parameters)
        served = start_serve([f"dn1={url}&slot=csnd&publication=csnd_pub"], str(tmp_path / "log"))
        writers = [Writer(i, url, seed) for i in range(WRITERS)]
        try:
            flowing = rng.randint(20, 200)
            wait_for(lambda: _transactions(served) >= flowing, "the stream to flow", diagnose=served.status)
            pause, promote_after = rng.uniform(0.0, 2.0), rng.uniform(0.0, 1.0)
            time.sleep(pause)  # (the moment of the kill, drawn from the seed)
            form = "?host=a,b&port=p1,p2" if hosts_as_parameters else "a:p1,b:p2"
            outcome.detail = (
                f"kill -9 primary after {pause:.2f}s, promote {promote_after:.2f}s later ({form})"
            )
            killed = time.monotonic()
            pair.kill_primary()
            time.sleep(promote_after)
            pair.promote()
            with psycopg.connect(pair.standby.dsn(), autocommit=True) as c:
                (promoted,) = c.execute("SELECT pg_current_wal_lsn()::text").fetchone() or ("",)
            # Recovered: the changelog holds a transaction committed on the new primary (single
            # mode: a transaction's CSN is its commit LSN).
            wait_for(
                lambda: int(served.status()["changelog"]["newest_csn"]) > lsn_from_text(str(promoted)),
                "a transaction committed on the promoted standby in the changelog",
                diagnose=served.status,
            )
            outcome.recovery_s = round(time.monotonic() - killed, 1)
            wait_for(
                lambda: all(w.after_failure >= AFTER_PROMOTION for w in writers),
                "the writers' commits on the promoted standby",
                diagnose=served.status,
            )
            for w in writers:
                w.stop()
            expected = _witness(pair)
            wait_for(
                lambda: _transactions(served) >= len(expected),
                "every transaction in the changelog",
                diagnose=served.status,
            )
            ours = _ours(served)
            (node,) = served.status()["nodes"]
            if node["state"] != "streaming" or node["error"]:
                outcome.problems.append(f"node after the failover: {node['state']} {node['error']}")
            _check(outcome, expected, ours)
            outcome.recovered = True
        except AssertionError as e:
            outcome.problems.append(f"{type(e).__name__}: {e}")
        finally:
            for w in writers:
                w.stop()
            code, err = served.terminate()
            if code != 0:
                outcome.problems.append(f"csnd serve exited {code}: {err.strip()[-400:]}")
    record(outcome, tmp_path)
    assert outcome.ok, "\n".join([f"{FAULT} seed {seed}: {outcome.detail}", *outcome.problems])
