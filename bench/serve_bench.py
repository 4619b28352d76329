"""The service end to end: a live node -> `csnd serve` -> a subscriber.

* throughput: WAL written beforehand, drained by `csnd serve` (decoders,
  sender, changelog with group commit) to a `csnd subscribe` that prints
  every line, against `pg_recvlogical` draining a twin slot over the same
  WAL: wide rows (50 a transaction) and one-row transactions.  Each run
  includes csnd's start-up.  Ratio = pg_recvlogical's time / csnd's; >= 1
  means csnd is not the bottleneck.
* latency: one-row transactions committed at a steady rate while the
  service runs; for each, the time from its commit (the server's commit
  timestamp) to its arrival at a subscriber (this process, through
  `csnd.consumers.client.Changefeed`), p50 and p99.

    python -m bench.serve_bench
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from typing import Any, Final

import psycopg

from bench.common import pg_recvlogical_seconds
from csnd.core.ids import lsn_from_str
from csnd.testing.pgserver import start_server

WIDE_ROWS: Final = 100_000
ONE_ROW_TXNS: Final = 20_000
LATENCY_RATE: Final = 2_000  # transactions a second
LATENCY_SECONDS: Final = 10.0
CSND = [sys.executable, "-m", "csnd.cli"]


def _current(c: psycopg.Connection[Any]) -> int:
    row = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return lsn_from_str(str(row[0]))


def _serve(url: str, slot: str, changelog: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*CSND, "serve", f"dn1={url}?slot={slot}&publication=bench", "--changelog", changelog]
        + ["--listen", "127.0.0.1:0", "--decoders", "2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("csnd serve: listening on "):
        raise RuntimeError(f"csnd serve did not start: {line}{proc.communicate()[1]}")
    return proc, line.split()[-1]


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=120)


def _drain(url: str, slot: str, end: int, transactions: int, work: str) -> float:
    """Seconds from starting `csnd serve` until a subscriber has printed every transaction."""
    t0 = time.perf_counter()
    proc, address = _serve(
        url, slot, os.path.join(work, f"log-{slot}"), "--until-lsn", f"{end >> 32:X}/{end & 0xFFFFFFFF:X}"
    )
    try:
        subprocess.run(
            [*CSND, "subscribe", address, "--limit", str(transactions)],
            stdout=subprocess.DEVNULL,
            check=True,
            timeout=1800,
        )
        return time.perf_counter() - t0
    finally:
        _stop(proc)


def throughput(server: Any, work: str) -> dict[str, Any]:
    url, port = server.url(), server.port
    results: dict[str, Any] = {}
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        c.execute(
            "CREATE TABLE wide (id bigint PRIMARY KEY, n numeric(12,2), t timestamptz, s text, j jsonb)"
        )
        c.execute("CREATE TABLE narrow (id bigint PRIMARY KEY, v int)")
        c.execute("CREATE PUBLICATION bench FOR ALL TABLES")
        # wide rows, 50 a transaction
        for slot in ("ours_wide", "twin_wide"):
            c.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        for start in range(0, WIDE_ROWS, 50):
            c.execute(
                "INSERT INTO wide SELECT g, g * 1.5, now(), md5(g::text), jsonb_build_object('g', g) "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (start, start + 49),
            )
        end_wide = _current(c)
        # one-row transactions
        for slot in ("ours_one", "twin_one"):
            c.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
        # (one round trip each: in pipeline mode the statements up to a Sync are one transaction)
        for i in range(ONE_ROW_TXNS):
            c.execute("INSERT INTO narrow VALUES (%s, %s)", (i, i))
        end_one = _current(c)
    for name, rows, txns, end in (
        ("wide_rows", WIDE_ROWS, WIDE_ROWS // 50, end_wide),
        ("one_row_transactions", ONE_ROW_TXNS, ONE_ROW_TXNS, end_one),
    ):
        slot = "wide" if name == "wide_rows" else "one"
        ours = _drain(url, f"ours_{slot}", end, txns, work)
        twin = pg_recvlogical_seconds(port, f"twin_{slot}", "bench", end)
        results[name] = {
            "rows": rows,
            "transactions": txns,
            "csnd_s": ours,
            "pg_recvlogical_s": twin,
            "csnd_rows_per_s": rows / ours,
            "csnd_transactions_per_s": txns / ours,
            "pg_recvlogical_rows_per_s": rows / twin,
            "ratio": twin / ours,
        }
    return results


def latency(server: Any, work: str) -> dict[str, Any]:
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        c.execute("CREATE TABLE lat (id bigint PRIMARY KEY)")
        c.execute("SELECT pg_create_logical_replication_slot('ours_lat', 'pgoutput')")
    proc, address = _serve(server.url(), "ours_lat", os.path.join(work, "log-lat"))
    seen: list[float] = []
    done = threading.Event()
    consumer = _subscriber(address, seen, done)
    sent = 0
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            t0 = time.perf_counter()
            total = int(LATENCY_RATE * LATENCY_SECONDS)
            for i in range(total):
                due = t0 + i / LATENCY_RATE
                pause = due - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                c.execute("INSERT INTO lat VALUES (%s)", (i,))
                sent += 1
            achieved = sent / (time.perf_counter() - t0)
        deadline = time.monotonic() + 120
        while len(seen) < sent and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        done.set()
        consumer.join(timeout=30)
        _stop(proc)
    lat = sorted(seen)
    if not lat:
        raise RuntimeError("the subscriber received nothing")
    return {
        "target_rate": LATENCY_RATE,
        "achieved_rate": achieved,
        "transactions": sent,
        "received": len(lat),
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def _subscriber(address: str, seen: list[float], done: threading.Event) -> threading.Thread:
    """A consumer in this process: for each transaction, now minus its commit time."""
    from csnd.consumers.client import Changefeed

    def consume() -> None:
        feed = Changefeed(address)
        try:
            while not done.is_set():
                rec = feed.next(timeout=0.5)
                if rec is None:
                    continue
                now = time.time()
                csn, line = rec
                seen.append(now - datetime.fromisoformat(json.loads(line)["commit_time"]).timestamp())
                feed.ack(csn)
        finally:
            feed.close()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    return t


def cluster_latency(work: str, seconds: float = 20.0, writers: int = 4) -> dict[str, Any]:
    """csnd workload flat out on 3 local servers, `csnd serve` live in GTM mode: commit to subscriber."""
    from csnd.gtm.liveload import LoadOptions, setup
    from csnd.gtm.pggtm import PgGtm
    from csnd.gtm.ticker import Ticker
    from csnd.testing.cluster import start_cluster

    with start_cluster(3) as cluster:
        urls = cluster.urls()
        setup(LoadOptions(nodes=urls, gtm=cluster.gtm_url, publication="bench"))
        for url in urls.values():
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("SELECT pg_create_logical_replication_slot('ours', 'pgoutput')")
        sources = [f"{n}={u}?slot=ours&publication=bench&mode=gtm" for n, u in urls.items()]
        proc = subprocess.Popen(
            [*CSND, "serve", *sources, "--changelog", os.path.join(work, "log-cluster"), "--decoders", "1"]
            + ["--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        address = proc.stdout.readline().split()[-1]
        seen: list[float] = []
        done = threading.Event()
        consumer = _subscriber(address, seen, done)
        gtm = PgGtm(cluster.gtm_url)
        ticker = Ticker(gtm, urls).start()
        committed = os.path.join(work, "committed.jsonl")
        try:
            subprocess.run(
                [
                    *CSND,
                    "workload",
                    "--nodes",
                    *[f"{n}={u}" for n, u in urls.items()],
                    "--writers",
                    str(writers),
                ]
                + ["--duration", str(seconds), "--out", committed],
                check=True,
                capture_output=True,
            )
            with open(committed, encoding="utf-8") as f:
                n = sum(1 for _ in f)
            deadline = time.monotonic() + 120
            while len(seen) < n and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            done.set()
            consumer.join(timeout=30)
            ticker.stop()
            gtm.close()
            _stop(proc)
    lat = sorted(seen)
    return {
        "writers": writers,
        "transactions": n,
        "transactions_per_s": n / seconds,
        "received": len(lat),
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def main() -> dict[str, Any]:
    server = start_server()
    work = tempfile.mkdtemp(prefix="csnd-serve-bench-")
    try:
        return {
            "throughput": throughput(server, work),
            "latency": latency(server, work),
            "cluster": cluster_latency(work),
        }
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def table(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for key, what in (
        ("wide_rows", "wide rows (50 a transaction)"),
        ("one_row_transactions", "one-row transactions"),
    ):
        t = r["throughput"][key]
        rows.append(
            (
                f"`csnd serve` -> `csnd subscribe`, live node, {t['rows']:,} {what}, vs `pg_recvlogical` (same WAL)",
                f"{t['csnd_rows_per_s']:,.0f} rows/s, {t['csnd_transactions_per_s']:,.0f} transactions/s vs "
                f"{t['pg_recvlogical_rows_per_s']:,.0f} rows/s (ratio {t['ratio']:.2f})",
            )
        )
    c = r.get("cluster")
    if c:
        rows.append(
            (
                f"3-server GTM cluster, `csnd workload` with {c['writers']} writers flat out, `csnd serve` live: "
                "commit to subscriber",
                f"{c['transactions_per_s']:,.1f} distributed transactions/s; p50 {c['p50_ms']:.0f} ms, "
                f"p99 {c['p99_ms']:.0f} ms",
            )
        )
    lat = r["latency"]
    rows.append(
        (
            f"commit to subscriber, one-row transactions at {lat['achieved_rate']:,.0f}/s "
            f"(asked {lat['target_rate']:,}/s)",
            f"p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms",
        )
    )
    return rows


if __name__ == "__main__":
    results = main()
    print(json.dumps(results, indent=2))
    for what, result in table(results):
        print(f"| {what} | {result} |")
