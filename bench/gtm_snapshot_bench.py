"""Issue 41's done criterion at its size: a GTM-mode initial snapshot of 200,000 rows a node, killed and taken again.

`python -m bench.gtm_snapshot_bench [--rows N]`: three local servers, the
workload's tables and `zbig` (N rows on each node, default 200,000) in one
publication, a test_decoding witness slot a node, then `csnd workload` (3
unpaced writer processes committing distributed transactions) and a
ticker.  `csnd serve --snapshot initial --gtm` starts under the writers and
is killed with SIGKILL once a chunk of the snapshot is appended; the
restart drops the slots and takes the snapshot anew, under the writers
still.  Then the writers stop, the service catches up, and `csnd
subscribe` reads everything.  Checked exactly as the small test does
(tests/service/test_serve_gtm_snapshot.py, `_check_one_cut`): every
distributed transaction is wholly in the snapshot (CSN <= the barrier's) or
wholly streamed, none twice, and the snapshot followed by the stream
replays to every node's tables, `zbig` included.  Printed: the snapshot's
seconds and rows/s as the restart took it, and the barrier's length.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import psycopg

from csnd.gtm.liveload import LoadOptions, setup
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.ticker import Ticker
from csnd.testing.cluster import start_cluster
from tests.service.servekit import CSND, start_serve, subscribe, wait_for
from tests.service.test_serve_cluster import _replay_tables
from tests.service.test_serve_gtm_snapshot import _check_one_cut, _gtm_current, _make_witness

ROWS = 200_000


def _chunk_appended(status: dict[str, Any]) -> int:
    """The chunks appended so far while the snapshot runs (0: none yet, or not running)."""
    snapshot = status.get("snapshot", {})
    if snapshot.get("state") != "running":
        return 0
    return sum(int(t.get("chunks_done", 0)) for t in snapshot.get("tables", []))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.gtm_snapshot_bench")
    parser.add_argument(
        "--rows", type=int, default=ROWS, help="rows of zbig on each node (default %(default)s)"
    )
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"rows_per_node": args.rows, "nodes": 3, "writers": 3}
    with start_cluster(3) as cluster, tempfile.TemporaryDirectory(prefix="csnd-gtm-snap-") as tmp:
        urls = cluster.urls()
        setup(LoadOptions(nodes=urls, gtm=cluster.gtm_url, publication="csnd_pub"))
        with psycopg.connect(
            cluster.gtm_url, autocommit=True
        ) as conn:  # (past the CSNs snapshot records take)
            conn.execute(
                "SELECT setval('csnd_gtm', greatest(pg_sequence_last_value('csnd_gtm'), 0) + 100000)"
            )
        for url in urls.values():
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("CREATE TABLE zbig (id int PRIMARY KEY, v text)")
                c.execute(
                    "INSERT INTO zbig SELECT i, repeat('x', 20) || i FROM generate_series(1, %s) AS i",
                    (args.rows,),
                )
                c.execute("VACUUM ANALYZE zbig")
                c.execute("ALTER PUBLICATION csnd_pub ADD TABLE zbig")
        _make_witness(urls, "witness_b")
        sources = [
            f"{n}={u}?slot=snap_b&publication=csnd_pub&mode=gtm&snapshot=initial" for n, u in urls.items()
        ]
        log_dir, committed = f"{tmp}/log", f"{tmp}/committed.jsonl"
        start = _gtm_current(cluster.gtm_url)
        writers = subprocess.Popen(
            [*CSND, "workload", "--nodes", *urls.values(), "--gtm", cluster.gtm_url, "--writers", "3",
             "--duration", "3600", "--publication", "csnd_pub", "--out", committed],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        gtm = PgGtm(cluster.gtm_url)
        ticker = Ticker(gtm, urls, interval=0.1).start()
        served = None
        try:
            wait_for(lambda: _gtm_current(cluster.gtm_url) > start + 50, "the writers committing")
            first = served = start_serve(sources, log_dir, "--gtm", cluster.gtm_url)
            seen = wait_for(lambda: _chunk_appended(first.status()), "a chunk of the first snapshot", 600)
            first.kill()
            out["killed_after_chunks"] = seen
            t0 = time.monotonic()
            again = served = start_serve(sources, log_dir, "--gtm", cluster.gtm_url)
            wait_for(
                lambda: again.status().get("snapshot", {}).get("state") == "complete",
                "the snapshot taken again",
                seconds=1800,
                every=0.5,
            )
            out["snapshot_s"] = round(time.monotonic() - t0, 1)
            shown = again.status()["snapshot"]
            out["barrier_ms"] = shown.get("barrier_ms")
            if writers.poll() is not None:
                raise RuntimeError("the writers ended before the second snapshot did")
            writers.send_signal(signal.SIGTERM)
            _, err = writers.communicate(timeout=300)
            if writers.returncode != 0:
                raise RuntimeError(f"csnd workload: {err}")
            with open(committed, encoding="utf-8") as f:
                newest = max(json.loads(x)["csn"] for x in f if x.strip())
            wait_for(
                lambda: again.newest_csn() >= newest, f"every committed transaction (csn {newest})", 1800
            )
            got = subscribe(again.address, "--idle-timeout", "5", timeout=1800)
            if got.returncode != 0:
                raise RuntimeError(f"csnd subscribe: {got.stderr}")
        finally:
            ticker.stop()
            gtm.close()
            if writers.poll() is None:
                writers.kill()
            if served is not None:
                served.terminate()
        lines = got.stdout.splitlines()
        _check_one_cut(
            lines, urls, "witness_b", start, newest
        )  # (raises AssertionError naming what is wrong)
        big = _replay_tables(lines)
        counts = {n: len(big[(n, "zbig")]) for n in urls}
        if counts != dict.fromkeys(urls, args.rows):
            raise AssertionError(f"zbig replayed to {counts} rows, not {args.rows} a node")
        out["transactions_streamed"] = sum(1 for x in lines if '"snapshot"' not in x)
        out["rows_per_s"] = round(3 * args.rows / out["snapshot_s"])
    print(json.dumps(out, indent=2))
    sys.stdout.flush()
    return out


if __name__ == "__main__":
    main()
