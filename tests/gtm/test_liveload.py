"""`csnd workload` on 3 local PostgreSQL 15 servers, checked against a test_decoding witness per node.

The witness, assembled by gid, must hold exactly the committed file's
transactions, each whole on every node it touched, with the same CSN; the
commit records must have reached some node's WAL out of CSN order; and the
ticker's watermarks must reach an idle node's slot.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from csnd.cli import main
from csnd.gtm.liveload import TABLES, LoadOptions, setup
from csnd.gtm.sequencer import Gtm
from csnd.gtm.ticker import Ticker
from csnd.testing.cluster import LocalCluster, start_cluster
from tests.fixtures.witness import create_slot, read_slot


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with start_cluster(3) as c:
        yield c


def test_workload_against_witness(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = cluster.urls()
    setup(LoadOptions(nodes=urls, gtm=cluster.gtm_url))  # tables and seed rows before the witness starts
    conns = {n: psycopg.connect(u, autocommit=True) for n, u in urls.items()}
    try:
        for c in conns.values():
            create_slot(c, "witness")
        out = tmp_path / "committed.jsonl"
        argv = ["workload", "--nodes", *urls.values(), "--writers", "4", "--duration", "6", "--out", str(out)]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "workload:" in err and "distributed transactions committed" in err
        committed = [json.loads(x) for x in out.read_text().splitlines()]
        assert len(committed) > 20

        witnessed: dict[str, dict[str, Any]] = {}
        out_of_order = 0
        for n, c in conns.items():
            w = read_slot(c, "witness", TABLES)
            csns = [t.csn for t in w.commits]
            assert all(t.gid is not None for t in w.commits), "every committed change carries a commit marker"
            out_of_order += sum(
                1 for a, b in itertools.pairwise(csns) if a is not None and b is not None and a > b
            )
            for t in w.commits:
                assert t.gid is not None
                entry = witnessed.setdefault(t.gid, {"csn": t.csn, "nodes": {}})
                assert entry["csn"] == t.csn, f"gid {t.gid} with two csns"
                assert n not in entry["nodes"], f"gid {t.gid} committed twice on {n}"
                if t.changes:
                    entry["nodes"][n] = t.changes
            assert any(m.startswith("tick ") for m in w.markers), f"no tick reached {n}"
        assert out_of_order > 0, "commit records never reached a WAL out of CSN order"
        expected = {
            r["gid"]: {"csn": r["csn"], "nodes": {k: v for k, v in r["nodes"].items() if v}}
            for r in committed
        }
        seed = [g for g in witnessed if g not in expected]
        assert len(seed) <= 1, "only setup's seed transaction is not in the file"
        for g in seed:
            del witnessed[g]
        assert witnessed == expected
    finally:
        for c in conns.values():
            c.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_the_workload_as_its_duration_would(
    cluster: LocalCluster, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM or Ctrl-C mid-run: the writers stop, the summary and --out are written, exit 0.

    A test or a script that races a load against some other step cannot know
    how long that step takes; it runs the load long and stops it when done.
    """
    urls = cluster.urls()
    out = tmp_path / "committed.jsonl"
    load = subprocess.Popen(
        [sys.executable, "-m", "csnd.cli", "workload", "--nodes", *urls.values(), "--writers", "2",
         "--duration", "600", "--out", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any(p.stat().st_size for p in tmp_path.glob("committed.jsonl.w*")):
            assert load.poll() is None, load.communicate()[1]
            assert time.monotonic() < deadline, "the writers never committed"
            time.sleep(0.05)
        load.send_signal(sig)
        _, err = load.communicate(timeout=60)
    finally:
        if load.poll() is None:
            load.kill()
    assert load.returncode == 0, err
    assert "distributed transactions committed" in err, err
    assert "Traceback" not in err, err
    committed = [json.loads(x) for x in out.read_text().splitlines()]
    assert committed and [r["csn"] for r in committed] == sorted(r["csn"] for r in committed)
    assert not list(tmp_path.glob("committed.jsonl.w*")), "the writers' parts were not merged"


def test_the_ticker_ticks_the_current_csn_and_spends_none(cluster: LocalCluster) -> None:
    """A real GTM does not advance while idle; neither does the ticker (a tick c lets the merge pass c)."""
    gtm = Gtm(start=41)
    gtm.next()
    ticker = Ticker(gtm, {"dn3": cluster.urls()["dn3"]})
    try:
        assert [ticker.tick_once() for _ in range(3)] == [42, 42, 42]
        assert gtm.current() == 42 and not ticker.errors
    finally:
        for conn in ticker._conns.values():  # (tick_once without the thread: its connections are ours)
            conn.close()


def test_ticks_reach_an_idle_node(cluster: LocalCluster) -> None:
    url = cluster.urls()["dn3"]
    with psycopg.connect(url, autocommit=True) as c:
        create_slot(c, "idle_witness")
        gtm = Gtm(start=41)
        with Ticker(gtm, {"dn3": url}, interval=0.05):
            deadline = time.monotonic() + 60
            ticks: list[int] = []
            while len(set(ticks)) < 3:
                assert time.monotonic() < deadline, "ticks did not reach the slot"
                gtm.next()  # (the CSN moves on elsewhere; this node stays idle)
                time.sleep(0.1)
                # The SQL decoding functions stop at the flushed WAL: only flushed ticks are seen.
                rows = c.execute(
                    "SELECT data FROM pg_logical_slot_peek_changes('idle_witness', NULL, NULL)"
                ).fetchall()
                ticks = [int(r[0].rsplit(" ", 1)[1]) for r in rows if "content:tick " in r[0]]
        assert ticks == sorted(ticks) and ticks[0] >= 41
        c.execute("SELECT pg_drop_replication_slot('idle_witness')")
