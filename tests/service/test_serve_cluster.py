"""`csnd serve` live on a 3-server GaussDB-style cluster in GTM mode, under concurrent distributed writers.

The writers (`csnd workload`: several processes through the shared PostgreSQL
GTM, a ticker, recovery at start) commit transfers and multi-node statements;
their commit records reach each node's WAL out of CSN order.  Meanwhile the
service is killed with -9 and restarted, and one server is restarted.  What a
consumer receives is checked against an independent witness: a test_decoding
slot per node, assembled by gid and ordered by CSN -- every distributed
transaction once, whole, in CSN order.  (The writers run while the service
is killed; the server is restarted after they are done, since the kit's
writers do not survive a server restart.)
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from csnd.gtm.liveload import TABLES, LoadOptions, setup
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.ticker import Ticker
from csnd.testing.cluster import LocalCluster, start_cluster
from tests.fixtures.witness import create_slot, read_slot
from tests.service.servekit import CSND, start_serve, subscribe, wait_for


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three servers and a GTM, with the workload's tables and the publication (every test's start)."""
    with start_cluster(3) as c:
        setup(LoadOptions(nodes=c.urls(), gtm=c.gtm_url, publication="csnd_pub"))
        yield c


def _witness(urls: dict[str, str]) -> list[dict[str, Any]]:
    """Every committed distributed transaction: gid, csn and each node's row changes, by CSN."""
    by_gid: dict[str, dict[str, Any]] = {}
    for node, url in urls.items():
        with psycopg.connect(url, autocommit=True) as c:
            w = read_slot(c, "witness", TABLES)
        for t in w.commits:
            assert t.gid is not None and t.csn is not None
            entry = by_gid.setdefault(t.gid, {"gid": t.gid, "csn": t.csn, "nodes": {}})
            assert entry["csn"] == t.csn
            if t.changes:
                assert node not in entry["nodes"], f"{t.gid} twice on {node}"
                entry["nodes"][node] = t.changes
    return sorted((e for e in by_gid.values() if e["nodes"]), key=lambda e: e["csn"])


def _key(change: dict[str, Any]) -> Any:
    row = change["new"] if change["new"] is not None else change["old"]
    if "id" in row:
        return int(row["id"])
    return f"{row['gid']}:{row['seq']}"


def _ours(lines: list[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        txn = json.loads(line)
        nodes: dict[str, list[list[Any]]] = {}
        for ch in txn["changes"]:
            nodes.setdefault(ch["node"], []).append([ch["table"], ch["op"].upper(), _key(ch)])
        out.append({"gid": txn["gid"], "csn": txn["csn"], "nodes": nodes})
    return out


def test_cluster_served_through_kill_9_and_a_server_restart_equals_the_witness(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    urls = cluster.urls()
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
            create_slot(c, "witness")
    sources = [f"{n}={u}?slot=csnd&publication=csnd_pub&mode=gtm" for n, u in urls.items()]
    log = str(tmp_path / "log")
    committed = tmp_path / "committed.jsonl"
    writers = subprocess.Popen(
        [
            *CSND,
            "workload",
            "--nodes",
            *urls.values(),
            "--writers",
            "3",
            "--duration",
            "12",
            "--publication",
            "csnd_pub",
            "--out",
            str(committed),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    served = start_serve(sources, log)
    # The GTM's ticker runs beside the cluster, not only while writers do: once
    # they stop, its ticks are what let the merge release the last transactions.
    gtm = PgGtm(cluster.gtm_url)
    ticker = Ticker(gtm, urls, interval=0.1).start()
    try:
        # provably mid-run: the service has made some distributed transactions durable
        first = wait_for(lambda: served.newest_csn() or None, "a first durable transaction")
        served.kill()
        served = start_serve(sources, log)
        wait_for(lambda: served.newest_csn() > first, "the restarted service moving on")
        _, err = writers.communicate(timeout=300)
        assert writers.returncode == 0, err
        # A node's server dies while the service still streams (the writers are done: the kit's
        # writers do not survive a server restart; `csnd gtm recover` is for them).
        cluster.server("dn2").restart("immediate")
        newest = max(json.loads(x)["csn"] for x in committed.read_text().splitlines())
        # the ticker's last watermarks let the merge release everything up to the newest commit
        wait_for(
            lambda: served.newest_csn() >= newest,
            f"every committed transaction (csn {newest}) in the changelog",
            diagnose=lambda: (served.status()["changelog"], served.status()["nodes"]),
        )
        got = subscribe(served.address, "--idle-timeout", "3")
        assert got.returncode == 0, got.stderr
        ours = _ours(got.stdout.splitlines())
        expected = [e for e in _witness(urls) if e["csn"] <= newest]
        assert [t["csn"] for t in ours] == sorted({t["csn"] for t in ours}), (
            "not in strictly increasing CSN order"
        )
        ours_by_gid = {t["gid"]: t for t in ours}
        assert len(ours_by_gid) == len(ours), "a transaction was delivered twice"
        witnessed = {e["gid"]: e for e in expected}
        assert ours_by_gid.keys() >= witnessed.keys(), sorted(witnessed.keys() - ours_by_gid.keys())[:5]
        for gid, entry in witnessed.items():
            assert ours_by_gid[gid] == entry, gid
        extra = set(ours_by_gid) - set(witnessed)
        assert len(extra) <= 1, extra  # (setup's seeding transaction, committed before the witness slots)
        doc = served.status()
        assert {n["name"] for n in doc["nodes"]} == set(urls)
        assert all(n["state"] == "streaming" for n in doc["nodes"]), doc["nodes"]
    finally:
        ticker.stop()
        gtm.close()
        if writers.poll() is None:
            writers.kill()
        code, err = served.terminate()
    assert code == 0, err


# (seconds the busy nodes write: some 60 of the ticker's marks on the idle node)
WRITE_S = 6


def test_an_idle_node_does_not_hold_the_stream_back(cluster: LocalCluster, tmp_path: Path) -> None:
    """Writers on dn1 and dn2; dn3 stays idle, moved only by the ticker's marks.

    The merge releases a busy node's transaction only once every node's watermark
    has passed its CSN, so the busy nodes' last transaction arriving is the proof
    that the ticker moved dn3's; the writers run a few seconds, long enough for
    many ticks (that a watermark standing still for STUCK_AFTER_S is reported
    stuck is test_nodewatch's, on a clock of its own).
    """
    urls = cluster.urls()
    busy = {n: urls[n] for n in ("dn1", "dn2")}
    with psycopg.connect(urls["dn3"], autocommit=True) as c:
        c.execute("SELECT pg_create_logical_replication_slot('idle_t', 'pgoutput')")
    for url in busy.values():
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT pg_create_logical_replication_slot('idle_t', 'pgoutput')")
    sources = [f"{n}={u}?slot=idle_t&publication=csnd_pub&mode=gtm" for n, u in urls.items()]
    served = start_serve(sources, str(tmp_path / "log"))
    gtm = PgGtm(cluster.gtm_url)
    ticker = Ticker(gtm, urls, interval=0.1).start()  # the cluster's ticker covers every node, idle or not
    try:
        writers = subprocess.run(
            [
                *CSND,
                "workload",
                "--nodes",
                *[f"{n}={u}" for n, u in busy.items()],
                "--writers",
                "2",
                "--duration",
                str(WRITE_S),
                "--rate",
                "20",
                "--publication",
                "csnd_pub",
                "--out",
                str(tmp_path / "c.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert writers.returncode == 0, writers.stderr
        newest = max(json.loads(x)["csn"] for x in (tmp_path / "c.jsonl").read_text().splitlines())
        wait_for(lambda: served.newest_csn() >= newest, "the busy nodes' transactions past the idle node")
        dn3 = next(n for n in served.status()["nodes"] if n["name"] == "dn3")
        assert dn3["state"] == "streaming" and not dn3["stuck"]
        assert int(dn3["transactions"]) == 0  # it really was idle all along
    finally:
        ticker.stop()
        gtm.close()
        code, err = served.terminate()
    assert code == 0, err


def _replay_tables(lines: list[str]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(node, table) -> rows by key, from the snapshot's reads and every change after them."""
    state: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for line in lines:
        for ch in json.loads(line)["changes"]:
            rows = state.setdefault((ch["node"], ch["table"]), {})
            op, old, new, key = ch["op"], ch["old"], ch["new"], ch["key"]
            if op in ("read", "insert"):
                k = json.dumps([new[c] for c in key])
                assert k not in rows, f"{op} of a row already there: {ch}"
                rows[k] = new
            elif op == "update":
                before = json.dumps([(old or new)[c] for c in key])
                assert before in rows, f"update of a row not there: {ch}"
                del rows[before]
                rows[json.dumps([new[c] for c in key])] = new
            elif op == "delete":
                del rows[json.dumps([old[c] for c in key])]
    return state


def _node_tables(urls: dict[str, str]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """The keyed tables of every node, as section 7 values (they are ints and text)."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for node, url in urls.items():
        with psycopg.connect(url, autocommit=True) as c:
            for table, key in (("wl_accounts", ("id",)), ("wl_ledger", ("gid", "seq"))):
                cur = c.execute(f"SELECT * FROM {table}".encode())
                names = [d.name for d in cur.description or ()]
                rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
                out[(node, table)] = {json.dumps([r[k] for k in key]): r for r in rows}
    return out


def test_an_initial_snapshot_in_gtm_mode_then_the_stream_equals_every_node(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Each node's tables are copied at its own slot's consistent point, then the stream follows.

    No writer runs while the slots are made: a distributed transaction
    committed on one node before its slot's point and on another after its
    own would be half in a snapshot and half in the stream (docs/design.md
    section 5 says what a consumer sees then).  The GTM is first moved past
    the CSNs the snapshot's records take, as the design asks.
    """
    urls = cluster.urls()
    with psycopg.connect(cluster.gtm_url, autocommit=True) as c:
        PgGtm(cluster.gtm_url).close()  # (its sequence exists)
        c.execute("SELECT setval('csnd_gtm', greatest(pg_sequence_last_value('csnd_gtm'), 0) + 10000)")
    sources = [f"{n}={u}?slot=snap_t&publication=csnd_pub&mode=gtm&snapshot=initial" for n, u in urls.items()]
    served = start_serve(sources, str(tmp_path / "log"))
    gtm = PgGtm(cluster.gtm_url)
    ticker = Ticker(gtm, urls, interval=0.1).start()
    committed = tmp_path / "committed.jsonl"
    try:
        wait_for(
            lambda: served.status().get("snapshot", {}).get("state") == "complete",
            "the snapshot of every node",
            diagnose=lambda: json.dumps(served.status().get("snapshot")),
        )
        writers = subprocess.run(
            [*CSND, "workload", "--nodes", *urls.values(), "--writers", "2", "--duration", "5",
             "--publication", "csnd_pub", "--out", str(committed)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert writers.returncode == 0, writers.stderr
        newest = max(json.loads(x)["csn"] for x in committed.read_text().splitlines())
        wait_for(lambda: served.newest_csn() >= newest, f"every committed transaction (csn {newest})")
        got = subscribe(served.address, "--idle-timeout", "3")
        assert got.returncode == 0, got.stderr
    finally:
        ticker.stop()
        gtm.close()
        code, err = served.terminate()
    assert code == 0, err
    lines = got.stdout.splitlines()
    snap = [t for t in map(json.loads, lines) if "snapshot" in t]
    assert snap and snap[-1]["snapshot"].get("done") is True
    assert {ch["node"] for t in snap for ch in t["changes"]} == set(urls)  # every node copied
    replayed, want = _replay_tables(lines), _node_tables(urls)
    for where, rows in want.items():
        assert replayed.get(where, {}) == rows, where
