"""An initial snapshot in GTM mode under unpaced distributed writers: one CSN across every node.

Writers (`csnd workload`, unlimited rate) commit distributed transactions on
three servers through the shared GTM while `csnd serve --snapshot initial`
makes its slots and copies the tables.  Every distributed transaction must be
wholly in the snapshot or wholly in the stream -- never one node's part in a
snapshot and another's streamed -- and the snapshot followed by the stream
must replay to every node's tables.  An independent witness (a test_decoding
slot per node, made before the writers start) says which nodes each
transaction touched.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from csnd.gtm.liveload import TABLES, LoadOptions, setup
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.ticker import Ticker
from csnd.testing.cluster import LocalCluster, start_cluster
from tests.fixtures.witness import create_slot, read_slot
from tests.service.servekit import CSND, start_serve, subscribe, wait_for
from tests.service.test_serve_cluster import _node_tables, _replay_tables


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with start_cluster(3) as c:
        setup(LoadOptions(nodes=c.urls(), gtm=c.gtm_url, publication="csnd_pub"))
        with psycopg.connect(c.gtm_url, autocommit=True) as conn:  # (past the CSNs snapshot records take)
            conn.execute("SELECT setval('csnd_gtm', greatest(pg_sequence_last_value('csnd_gtm'), 0) + 10000)")
        yield c


def _make_witness(urls: dict[str, str], slot: str) -> None:
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as c:
            create_slot(c, slot)


def _witness_nodes(urls: dict[str, str], slot: str) -> dict[str, tuple[int, set[str]]]:
    """gid -> (csn, the nodes where it changed rows), for every committed distributed transaction."""
    out: dict[str, tuple[int, set[str]]] = {}
    for node, url in urls.items():
        with psycopg.connect(url, autocommit=True) as c:
            w = read_slot(c, slot, TABLES)
        for t in w.commits:
            if t.gid is None or t.csn is None or not t.changes:
                continue
            csn, nodes = out.setdefault(t.gid, (t.csn, set()))
            assert csn == t.csn
            nodes.add(node)
    return out


def _gtm_current(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute("SELECT pg_sequence_last_value('csnd_gtm')").fetchone()
    return int(row[0] or 0) if row else 0


def test_a_snapshot_under_unpaced_writers_holds_each_distributed_transaction_whole(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    urls = cluster.urls()
    _make_witness(urls, "witness_s")
    start = _gtm_current(cluster.gtm_url)
    committed = tmp_path / "committed.jsonl"
    writers = subprocess.Popen(
        [*CSND, "workload", "--nodes", *urls.values(), "--gtm", cluster.gtm_url, "--writers", "3",
         "--duration", "900", "--publication", "csnd_pub", "--out", str(committed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    sources = [f"{n}={u}?slot=snap_w&publication=csnd_pub&mode=gtm&snapshot=initial" for n, u in urls.items()]
    gtm = PgGtm(cluster.gtm_url)
    ticker = Ticker(gtm, urls, interval=0.1).start()
    served = None
    try:
        # provably mid-run: the writers have committed transactions before the slots are asked for
        wait_for(lambda: _gtm_current(cluster.gtm_url) > start + 50, "the writers committing")
        served = start_serve(sources, str(tmp_path / "log"), "--gtm", cluster.gtm_url)
        wait_for(
            lambda: served.status().get("snapshot", {}).get("state") == "complete",
            "the snapshot of every node",
            diagnose=lambda: json.dumps(served.status().get("snapshot")),
        )
        # The writers run until stopped (however long the snapshot takes on a busy machine).
        assert writers.poll() is None, "the writers ended before the snapshot did"
        writers.send_signal(signal.SIGTERM)
        _, err = writers.communicate(timeout=120)
        assert writers.returncode == 0, err
        newest = max(json.loads(x)["csn"] for x in committed.read_text().splitlines())
        wait_for(
            lambda: served.newest_csn() >= newest,
            f"every committed transaction (csn {newest})",
            diagnose=lambda: json.dumps(served.status().get("nodes")),
        )
        got = subscribe(served.address, "--idle-timeout", "3")
        assert got.returncode == 0, got.stderr
        shown = served.status()["snapshot"]  # (the barrier, as Status and the metrics show it)
        assert served.http is not None
        with urllib.request.urlopen(served.http + "metrics", timeout=30) as r:
            metrics = r.read().decode()
    finally:
        ticker.stop()
        gtm.close()
        if writers.poll() is None:
            writers.kill()
        code, err = served.terminate() if served is not None else (0, "")
    assert code == 0, err
    _check_one_cut(got.stdout.splitlines(), urls, "witness_s", start, newest)
    done = next(json.loads(x) for x in got.stdout.splitlines() if '"done": true' in x)
    assert int(shown["gtm_csn"]) == done["snapshot"]["gtm_csn"]
    assert float(shown["barrier_ms"]) == done["snapshot"]["barrier_ms"] > 0
    assert f"csnd_snapshot_barrier_ms {float(shown['barrier_ms'])}" in metrics


def _check_one_cut(lines: list[str], urls: dict[str, str], witness: str, start: int, newest: int) -> None:
    """Each transaction wholly in the snapshot (CSN <= its cut) or wholly streamed; the replay equals every node."""
    records = [json.loads(x) for x in lines]
    streamed: dict[str, set[str]] = {}
    for r in records:
        if "snapshot" in r:
            continue
        assert r["gid"] not in streamed, f"{r['gid']} streamed twice"
        streamed[r["gid"]] = {ch["node"] for ch in r["changes"]}
    witnessed = {g: v for g, v in _witness_nodes(urls, witness).items() if v[0] <= newest}
    assert sum(csn > start for csn, _ in witnessed.values()) > 50, "too few transactions raced the snapshot"
    halves = {
        g: (streamed[g], nodes)
        for g, (_, nodes) in witnessed.items()
        if g in streamed and streamed[g] != nodes
    }
    assert not halves, (
        f"{len(halves)} transactions streamed from some of their nodes only: {list(halves.items())[:3]}"
    )
    replayed, want = _replay_tables(lines), _node_tables(urls)
    for where, rows in want.items():
        assert replayed.get(where, {}) == rows, where
    done = [r for r in records if r.get("snapshot", {}).get("done") is True]
    assert len(done) == 1
    cut = int(done[0]["snapshot"]["gtm_csn"])  # the barrier's CSN: the snapshot holds exactly those <= it
    assert start < cut < newest
    assert done[0]["csn"] == cut and float(done[0]["snapshot"]["barrier_ms"]) > 0
    for gid, (csn, nodes) in witnessed.items():
        if csn <= cut:
            assert gid not in streamed, f"{gid} (csn {csn} <= {cut}) is in the snapshot and streamed too"
        else:
            assert streamed.get(gid) == nodes, f"{gid} (csn {csn}) is not streamed whole"


_KEYS = {"wl_accounts": ("id",), "wl_ledger": ("gid", "seq")}


def _replay_over(lines: list[str]) -> dict[tuple[str, str], dict[str, dict[str, object]]]:
    """(node, table) -> rows by key: reads and inserts put a row, updates move it, deletes remove it.

    The stream began after the tables had rows, so a change of a row not read
    yet is applied as far as it goes; the incremental snapshot's reads fill in.
    """
    state: dict[tuple[str, str], dict[str, dict[str, object]]] = {}
    for line in lines:
        for ch in json.loads(line)["changes"]:
            rows = state.setdefault((ch["node"], ch["table"]), {})
            key = _KEYS[ch["table"]]
            old, new = ch["old"], ch["new"]
            if ch["op"] in ("read", "insert"):
                rows[json.dumps([new[c] for c in key])] = new
            elif ch["op"] == "update":
                rows.pop(json.dumps([(old or new)[c] for c in key]), None)
                rows[json.dumps([new[c] for c in key])] = new
            elif ch["op"] == "delete":
                rows.pop(json.dumps([old[c] for c in key]), None)
    return state


def test_an_incremental_snapshot_in_gtm_mode_under_writers_equals_every_node(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """`csnd snapshot` of two tables on three GTM-mode nodes while writers commit distributed transactions.

    The slots are made when the service starts, after the tables have rows,
    so only the snapshot can give those.  Each watermark takes its CSN from
    the GTM; the chunks land in the one CSN order with everything else.
    """
    urls = cluster.urls()
    sources = [f"{n}={u}?slot=inc_g&publication=csnd_pub&mode=gtm&create_slot=true" for n, u in urls.items()]
    served = start_serve(sources, str(tmp_path / "log"), "--gtm", cluster.gtm_url)
    gtm = PgGtm(cluster.gtm_url)
    ticker = Ticker(gtm, urls, interval=0.1).start()
    start = _gtm_current(cluster.gtm_url)
    committed = tmp_path / "committed.jsonl"
    writers = subprocess.Popen(
        [*CSND, "workload", "--nodes", *urls.values(), "--gtm", cluster.gtm_url, "--writers", "3",
         "--duration", "900", "--publication", "csnd_pub", "--out", str(committed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: _gtm_current(cluster.gtm_url) > start + 50, "the writers committing")
        got = subprocess.run(
            [*CSND, "snapshot", served.address, "public.wl_accounts", "public.wl_ledger", "--chunk-rows", "40"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert "complete" in got.stderr.splitlines()[-1], got.stderr
        # The writers run until stopped (however long the snapshot takes on a busy machine).
        assert writers.poll() is None, "the writers ended before the snapshot did: nothing raced it"
        writers.send_signal(signal.SIGTERM)
        _, err = writers.communicate(timeout=120)
        assert writers.returncode == 0, err
        newest = max(json.loads(x)["csn"] for x in committed.read_text().splitlines())
        wait_for(lambda: served.newest_csn() >= newest, f"every committed transaction (csn {newest})")
        read = subscribe(served.address, "--idle-timeout", "3")
        assert read.returncode == 0, read.stderr
    finally:
        ticker.stop()
        gtm.close()
        if writers.poll() is None:
            writers.kill()
        code, err = served.terminate()
    assert code == 0, err
    lines = read.stdout.splitlines()
    records = [json.loads(x) for x in lines]
    assert [r["csn"] for r in records] == sorted({r["csn"] for r in records}), (
        "not in one increasing CSN order"
    )
    chunks = [r for r in records if "snapshot" in r]
    assert {(r["snapshot"]["node"], r["snapshot"]["table"]) for r in chunks} == {
        (n, t) for n in urls for t in _KEYS
    }
    replayed, want = _replay_over(lines), _node_tables(urls)
    for where, rows in want.items():
        assert replayed.get(where, {}) == rows, where


def _lock_once_consistent(url: str, slot: str, blocker: psycopg.Connection, table: str) -> threading.Thread:
    """Lock `table` in `blocker`'s transaction as soon as the node's `slot` is consistent.

    Not before: the lock's xid would hold back the slot's consistent point.
    Not after the service's ready line: its snapshot starts right after that
    line, and on a loaded machine it copied the table before a test that
    locked only then got to run (the snapshot was complete, with nothing to
    kill mid-way).  The slots are all made before that line.
    """

    def lock() -> None:
        with psycopg.connect(url, autocommit=True) as c:
            wait_for(
                lambda: (
                    c.execute(
                        "SELECT confirmed_flush_lsn IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s",
                        (slot,),
                    ).fetchone()
                    == (True,)
                ),
                f"slot {slot} consistent",
                every=0.005,
            )
        blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")

    thread = threading.Thread(target=lock, daemon=True)
    thread.start()
    return thread


def test_killed_mid_snapshot_the_restart_takes_it_again_at_one_csn(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """kill -9 while dn3's last table waits behind a lock; the restart drops the slots and takes it anew.

    Writers commit distributed transactions throughout; the snapshot the
    restart takes is again one cut at one CSN, and what a consumer reads
    replays to every node's tables.
    """
    urls = cluster.urls()
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("CREATE TABLE zbulk (id int PRIMARY KEY, v text)")
            c.execute("INSERT INTO zbulk SELECT i, repeat('x', 20) || i FROM generate_series(1, 5000) AS i")
            # (cut by its pages, the default, on every node: not by what autovacuum did by then)
            c.execute("ANALYZE zbulk")
            c.execute("ALTER PUBLICATION csnd_pub ADD TABLE zbulk")
    _make_witness(urls, "witness_k")
    config = tmp_path / "csnd.toml"
    config.write_text("[snapshot]\nchunk_rows = 500\nreaders = 2\n")
    sources = [f"{n}={u}?slot=snap_k&publication=csnd_pub&mode=gtm&snapshot=initial" for n, u in urls.items()]
    log_dir = str(tmp_path / "log")
    extra = ("--gtm", cluster.gtm_url, "--config", str(config))
    start = _gtm_current(cluster.gtm_url)
    committed = tmp_path / "committed.jsonl"
    writers = subprocess.Popen(
        [*CSND, "workload", "--nodes", *urls.values(), "--gtm", cluster.gtm_url, "--writers", "3",
         "--duration", "900", "--publication", "csnd_pub", "--out", str(committed)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    gtm = PgGtm(cluster.gtm_url)
    ticker = Ticker(gtm, urls, interval=0.1).start()
    served = None
    blocker = psycopg.connect(urls["dn3"])
    try:
        wait_for(lambda: _gtm_current(cluster.gtm_url) > start + 50, "the writers committing")
        locker = _lock_once_consistent(urls["dn3"], "snap_k", blocker, "zbulk")
        first = served = start_serve(sources, log_dir, *extra)
        locker.join(60)
        assert not locker.is_alive(), "dn3's zbulk was never locked"
        wait_for(
            lambda: any(
                t["node"] == "dn1" and t["table"] == "zbulk" and t["state"] == "done"
                for t in first.status().get("snapshot", {}).get("tables", [])
            ),
            "dn1's tables copied while dn3's zbulk waits for its lock",
            diagnose=lambda: json.dumps(first.status().get("snapshot")),
        )
        assert first.status()["snapshot"]["state"] == "running"
        first.kill()
        blocker.rollback()
        again = served = start_serve(sources, log_dir, *extra)
        wait_for(
            lambda: again.status().get("snapshot", {}).get("state") == "complete",
            "the snapshot taken again",
            diagnose=lambda: json.dumps(again.status().get("snapshot")),
        )
        assert writers.poll() is None, "the writers ended before the second snapshot did"
        writers.send_signal(signal.SIGTERM)
        _, err = writers.communicate(timeout=120)
        assert writers.returncode == 0, err
        newest = max(json.loads(x)["csn"] for x in committed.read_text().splitlines())
        wait_for(lambda: served.newest_csn() >= newest, f"every committed transaction (csn {newest})")
        got = subscribe(served.address, "--idle-timeout", "3")
        assert got.returncode == 0, got.stderr
    finally:
        blocker.close()
        ticker.stop()
        gtm.close()
        if writers.poll() is None:
            writers.kill()
        code, err = served.terminate() if served is not None else (0, "")
    assert code == 0, err
    lines = got.stdout.splitlines()
    _check_one_cut(lines, urls, "witness_k", start, newest)
    bulk = _replay_tables(lines)
    assert all(len(bulk[(n, "zbulk")]) == 5000 for n in urls)
