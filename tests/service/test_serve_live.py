"""`csnd serve` on a live PostgreSQL 15 node (single mode) against a `test_decoding` witness.

The witness slot is created beside ours before any change, so it sees the
same WAL.  The test checks what a consumer receives against it, transaction
by transaction, and polls `pg_replication_slots` while the service runs: the
slot is never confirmed past what the changelog holds (every transaction that
committed before the confirmed position must already be durable), and it
keeps advancing while the node is idle.
"""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import psycopg

from csnd.core.ids import lsn_from_str
from tests.fixtures import witness
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import Served, start_serve, subscribe, wait_for


def _setup(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE other (id int PRIMARY KEY, n int)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding')")


def _workload(pg: PgDatabase, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        for i in range(rounds):
            with c.transaction(force_rollback=rng.random() < 0.1):
                for _ in range(rng.randint(1, 4)):
                    k = rng.randint(1, 50)
                    table = rng.choice(("item", "other"))
                    if rng.random() < 0.7:
                        value = "'x'" if table == "item" else str(i)
                        c.execute(
                            f"INSERT INTO {table} VALUES ({k}, {value}) ON CONFLICT (id) DO UPDATE SET "
                            + ("v = excluded.v || 'y'" if table == "item" else "n = excluded.n")
                        )
                    else:
                        c.execute(f"DELETE FROM {table} WHERE id = {k}")


def _witness(pg: PgDatabase) -> list[tuple[int, list[tuple[str, str, int]]]]:
    """(end LSN, [(table, op, id)]) of each committed transaction with changes, in commit order.

    (test_decoding gives a COMMIT the end LSN of its commit record; csnd's
    commit_lsn is where the record starts.)
    """
    rows = pg.execute(
        "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes('witness', NULL, NULL)"
    )
    txns: list[tuple[int, list[tuple[str, str, int]]]] = []
    for t in witness.transactions(rows)[0]:
        assert t.end_lsn is not None and all(isinstance(e, witness.Row) for e in t.events), t
        if t.rows:
            txns.append((t.end_lsn, [(r.table, r.op, _id(r)) for r in t.rows]))
    return txns


def _id(row: witness.Row) -> int:
    cols = row.new if row.new is not None else row.old
    return int(witness.text_values(cols or ())["id"])


def _ours(lines: list[str]) -> list[tuple[int, list[tuple[str, str, int]]]]:
    """(commit LSN, [(table, op, id)]) of each transaction a consumer received."""
    out: list[tuple[int, list[tuple[str, str, int]]]] = []
    for line in lines:
        txn = json.loads(line)
        changes: list[tuple[str, str, int]] = []
        for ch in txn["changes"]:
            row = ch["new"] if ch["new"] is not None else ch["old"]
            changes.append((ch["table"], ch["op"], int(row["id"])))
        out.append((lsn_from_str(txn["nodes"]["dn1"]["commit_lsn"]), changes))
    return out


def _witness_commits(pg: PgDatabase) -> list[tuple[int, int]]:
    """(xid, end LSN) of every commit the witness slot has seen of a transaction that changed a row.

    A transaction that changed only the catalogs (an ANALYZE; autovacuum's
    auto-ANALYZE of a table under load) has nothing for pgoutput to send, so
    it is never held; test_decoding shows it as an empty BEGIN ... COMMIT
    unless told to skip those, and it must not count as committed here.
    """
    rows = pg.execute(
        "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes("
        "'witness', NULL, NULL, 'skip-empty-xacts', '1')"
    )
    return [(t.xid, t.end_lsn) for t in witness.transactions(rows)[0] if t.rows and t.end_lsn is not None]


def _changelog_xids(log_dir: str) -> list[int]:
    """dn1's xid of every transaction in the changelog, in its order (a stopped service's)."""
    from csnd.changelog import Changelog

    with Changelog(log_dir) as log:
        return [json.loads(raw)["nodes"]["dn1"]["xid"] for _, raw in log.read(0, 2**63)]


def _confirmed(pg: PgDatabase) -> int:
    (row,) = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")
    return lsn_from_str(str(row[0]))


class _SlotWatch:
    """Polls the slot's confirmed position, then the changelog's newest CSN, while the service runs."""

    def __init__(self, pg: PgDatabase, served: Served) -> None:
        self.pg, self.served = pg, served
        self.readings: list[tuple[int, int]] = []  # (confirmed LSN, newest durable CSN read after it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                confirmed = _confirmed(self.pg)
                newest = self.served.newest_csn()
            except Exception:  # (a server restart in the test: try again)
                self._stop.wait(0.05)
                continue
            self.readings.append((confirmed, newest))
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_live_node_served_equals_the_witness_and_the_slot_stays_safe(pg: PgDatabase, tmp_path: Any) -> None:
    _setup(pg)
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub"
    served = start_serve([source], str(tmp_path / "log"))
    watch = _SlotWatch(pg, served)
    try:
        _workload(pg, rounds=150, seed=1)
        # Restart only once the stream has flowed: a service whose very first connection
        # fails reports it and exits (a mistake to fix), while a flowing one reconnects.
        wait_for(lambda: int(served.status()["totals"]["transactions"]) > 0, "the stream to flow")
        pg.server.restart("immediate")  # mid-stream: the service reconnects, consumers see no gap
        _workload(pg, rounds=150, seed=2)
        end = lsn_from_str(pg.current_lsn())
        expected = _witness(pg)
        wait_for(
            lambda: int(served.status()["totals"]["transactions"]) >= len(expected),
            "every transaction in the changelog",
        )
        got = subscribe(served.address, "--idle-timeout", "2")
        assert got.returncode == 0, got.stderr
        ours = _ours(got.stdout.splitlines())
        assert [changes for _, changes in ours] == [changes for _, changes in expected]
        assert all(commit < end for (commit, _), (end, _) in zip(ours, expected, strict=True))
        # Idle now: the keepalives' WAL end is confirmed, so the slot holds no WAL back.
        wait_for(lambda: _confirmed(pg) >= end, "the idle slot confirmed to the end of the WAL")
    finally:
        watch.stop()
        code, err = served.terminate()
    assert code == 0, err
    # (end LSN, commit LSN = csn) of every transaction
    positions = [(end, commit) for (end, _), (commit, _) in zip(expected, ours, strict=True)]
    assert watch.readings, "no slot readings were taken"
    for confirmed, newest in watch.readings:
        # the server never re-sends a transaction that ends at or before `confirmed`: it must be durable
        assert all(csn <= newest for end, csn in positions if end <= confirmed), (confirmed, newest)
    assert served.proc.returncode == 0


def test_a_slow_subscriber_does_not_hold_the_slot_back(pg: PgDatabase, tmp_path: Any) -> None:
    """A named subscriber that reads one transaction and then stops: the slot still follows the changelog."""
    from csnd.consumers.client import Changefeed

    _setup(pg)
    served = start_serve([f"dn1={pg.url}?slot=csnd&publication=csnd_pub"], str(tmp_path / "log"))
    feed = Changefeed(served.address, name="slowpoke")
    try:
        _workload(pg, rounds=5, seed=3)
        assert feed.next(timeout=60) is not None  # it read one, acknowledges nothing, reads no more
        _workload(pg, rounds=100, seed=4)
        end = lsn_from_str(pg.current_lsn())
        wait_for(lambda: _confirmed(pg) >= end, "the slot confirmed to the end of the WAL")
        slow = next(c for c in served.status()["consumers"] if c["name"] == "slowpoke")
        assert int(slow["acknowledged_csn"]) == 0 and int(slow["lag_transactions"]) > 50
    finally:
        feed.close()
        code, err = served.terminate()
    assert code == 0, err


def test_sigterm_under_load_stops_at_once_with_the_slot_at_what_is_durable(
    pg: PgDatabase, tmp_path: Any
) -> None:
    """A busy node: the reader stops mid-stream, says where it got and hangs up, so the slot is free.

    It used to keep its replication connection open after stopping, so the final confirmation
    waited 15 s for the slot and then failed the stop (exit 1)."""
    _setup(pg)
    served = start_serve([f"dn1={pg.url}?slot=csnd&publication=csnd_pub"], str(tmp_path / "log"))
    stop = threading.Event()

    def write() -> None:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            i = 0
            while not stop.is_set():
                i += 1
                c.execute(
                    "INSERT INTO other VALUES (%s, 0) ON CONFLICT (id) DO UPDATE SET n = other.n + 1",
                    (i % 500,),
                )

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_for(lambda: int(served.status()["totals"]["transactions"]) > 200, "the stream to flow")
        code, err = served.terminate(timeout=60)  # while the writer goes on
    finally:
        stop.set()
        writer.join()
    assert code == 0 and "error" not in err, err
    (active,) = pg.execute("SELECT active FROM pg_replication_slots WHERE slot_name = 'csnd'")
    assert active[0] is False  # (the walsender is gone: the slot is free for the next run)
    confirmed = _confirmed(pg)
    held = set(_changelog_xids(str(tmp_path / "log")))
    before = [xid for xid, end in _witness_commits(pg) if end <= confirmed]
    assert before, "nothing was confirmed"
    missing = [x for x in before if x not in held]
    assert not missing, f"confirmed past transactions the changelog does not hold: {missing[:5]}"


def test_kill_9_under_a_pgbench_load_loses_and_doubles_nothing(pg: PgDatabase, tmp_path: Any) -> None:
    """The service killed with -9 twice while pgbench commits flat out; each restart resumes from the slot."""
    import subprocess

    _setup(pg)
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub"
    log_dir = str(tmp_path / "log")
    script = tmp_path / "upsert.sql"
    script.write_text(
        "\\set k random(1, 1000)\n"
        "INSERT INTO other VALUES (:k, 1) ON CONFLICT (id) DO UPDATE SET n = other.n + 1;\n"
    )
    served = start_serve([source], log_dir)
    load = subprocess.Popen(
        [
            pg.server.bin("pgbench"),
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            str(pg.server.port),
            "-U",
            "postgres",
            "-c",
            "2",
            "-T",
            "8",
            "-f",
            str(script),
            pg.name,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(2):
            before = served.newest_csn()

            def under_way(s: Served = served, b: int = before) -> bool:
                return s.newest_csn() > b + 500

            wait_for(under_way, "the service under way")
            # A catalog-only transaction (what autovacuum's auto-ANALYZE of `other` commits
            # under this load, at a moment of its choosing): no row changes, so not held,
            # and it must not count as committed either.
            pg.execute("ANALYZE other")
            served.kill()
            served = start_serve([source], log_dir)
        _, err = load.communicate(timeout=120)
        assert load.returncode == 0, err
        commits = _witness_commits(pg)
        committed = [xid for xid, _ in commits]
        last_end = max(end for _, end in commits)
        # the slot is confirmed only as far as the changelog holds: past the last commit, it holds all
        wait_for(lambda: _confirmed(pg) >= last_end, "the slot confirmed past the last commit")
    finally:
        if load.poll() is None:
            load.kill()
        code, err = served.terminate()
    assert code == 0, err
    held = _changelog_xids(log_dir)
    assert len(held) == len(set(held)), "a transaction was appended twice"
    assert set(held) == set(committed)
