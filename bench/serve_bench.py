"""The service end to end: a live node -> `csnd serve` -> a subscriber.

* steady load: `pgbench` writes flat out for STEADY_SECONDS (one-row
  transactions, or 50 wide rows a transaction) while `csnd serve` -> a
  subscriber and `pg_recvlogical` on a twin slot both stream live.  Each
  consumer's rate is rows / (from the load's start until it has received
  everything); ratio = csnd's rate / pg_recvlogical's.  1.00 means csnd
  delivered everything as soon as the walsender did: it is not the
  bottleneck of a loaded database.
* backlog: WAL written beforehand, drained by `csnd serve` to a `csnd
  subscribe` that prints every line, against `pg_recvlogical` draining a
  twin slot over the same WAL.  Each run includes csnd's start-up (about
  0.6 s for the two processes).  This is the walsender's top speed against
  csnd's: how fast a consumer that fell behind catches up.
* latency: one-row transactions committed at a steady rate while the
  service runs (after a first transaction has come through: start-up is
  the backlog row's business); for each, the time from its commit (the
  server's commit timestamp) to its arrival at a subscriber (this process,
  through `csnd.consumers.client.Changefeed`), p50 and p99.

    python -m bench.serve_bench
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

import psycopg

from bench.common import pg_recvlogical_command, pg_recvlogical_seconds
from csnd.core.ids import lsn_from_str
from csnd.testing.pgserver import start_server

WIDE_ROWS: Final = 100_000
ONE_ROW_TXNS: Final = 20_000
LATENCY_RATE: Final = 2_000  # transactions a second
STEADY_SECONDS: Final = 10
STEADY_CLIENTS: Final = 4
STEADY_SCRIPTS: Final = {
    "one_row_transactions": (1, "INSERT INTO steady_one (v) VALUES (1);\n"),
    "wide_rows": (
        50,
        "INSERT INTO steady_wide (n, t, s, j) SELECT g * 1.5, now(), md5(g::text), "
        "jsonb_build_object('g', g) FROM generate_series(1, 50) g;\n",
    ),
}
LATENCY_SECONDS: Final = 10.0
CSND = [sys.executable, "-m", "csnd.cli"]


def _current(c: psycopg.Connection[Any]) -> int:
    row = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return lsn_from_str(str(row[0]))


def _serve(url: str, slot: str, changelog: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            *CSND,
            "serve",
            f"dn1={url}?slot={slot}&publication=bench",
            "--changelog",
            changelog,
            "--listen",
            "127.0.0.1:0",
            "--decoders",
            "2",
            *extra,
        ],
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
    url = server.url()
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
        twin = pg_recvlogical_seconds(server, f"twin_{slot}", "bench", end)
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


def steady(server: Any, work: str) -> dict[str, Any]:
    """Both consumers live while pgbench writes flat out; see the module docstring."""
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        c.execute("CREATE TABLE steady_one (id bigserial PRIMARY KEY, v int)")
        c.execute(
            "CREATE TABLE steady_wide (id bigserial PRIMARY KEY, n numeric(12,2), t timestamptz, s text, j jsonb)"
        )
    return {kind: _steady_run(server, work, kind) for kind in STEADY_SCRIPTS}


def _steady_run(server: Any, work: str, kind: str) -> dict[str, Any]:
    rows_per_txn, script = STEADY_SCRIPTS[kind]
    ours, twin = f"ours_steady_{rows_per_txn}", f"twin_steady_{rows_per_txn}"
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        for slot in (ours, twin):
            c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    proc, address = _serve(server.url(), ours, os.path.join(work, f"log-{ours}"))
    arrivals: list[float] = []
    done = threading.Event()
    consumer = _consumer(address, lambda _line: arrivals.append(time.perf_counter()), done)
    recv = subprocess.Popen(
        [*pg_recvlogical_command(server, twin, "bench"), "-f", "/dev/null"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    script_path = os.path.join(work, f"{kind}.sql")
    with open(script_path, "w") as f:
        f.write(script)
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            # warm up: both consumers streaming before the clock starts
            c.execute(script)
            _wait(lambda: len(arrivals) >= 1, "csnd's first transaction")
            _wait(lambda: _sent_lsn(c, twin) >= _current(c), "pg_recvlogical streaming")
            t0 = time.perf_counter()
            load = subprocess.run(
                [
                    server.bin("pgbench"),
                    "-n",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(server.port),
                    "-U",
                    "postgres",
                    "-c",
                    str(STEADY_CLIENTS),
                    "-j",
                    "2",
                    "-M",
                    "prepared",
                    "-T",
                    str(STEADY_SECONDS),
                    "-f",
                    script_path,
                    "postgres",
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            load_s = time.perf_counter() - t0
            committed = int(re.search(r"actually processed: (\d+)", load.stdout).group(1))  # type: ignore[union-attr]
            end = _current(c)
            _wait(lambda: _sent_lsn(c, twin) >= end, "pg_recvlogical to receive everything", every=0.002)
            twin_s = time.perf_counter() - t0
            _wait(
                lambda: len(arrivals) >= committed + 1, "csnd's subscriber to receive everything", every=0.01
            )
            ours_s = arrivals[committed] - t0
    finally:
        done.set()
        consumer.join(timeout=30)
        recv.terminate()
        recv.wait(timeout=30)
        _stop(proc)
    rows = committed * rows_per_txn
    return {
        "clients": STEADY_CLIENTS,
        "load_s": load_s,
        "transactions": committed,
        "rows": rows,
        "csnd_s": ours_s,
        "pg_recvlogical_s": twin_s,
        "csnd_rows_per_s": rows / ours_s,
        "csnd_transactions_per_s": committed / ours_s,
        "pg_recvlogical_rows_per_s": rows / twin_s,
        "csnd_behind_at_end_s": ours_s - twin_s,
        "ratio": twin_s / ours_s,
    }


def _sent_lsn(c: psycopg.Connection[Any], slot: str) -> int:
    """How far the walsender streaming `slot` has sent (0 before it is streaming)."""
    row = c.execute(
        "SELECT s.sent_lsn::text FROM pg_stat_replication s "
        "JOIN pg_replication_slots r ON r.active_pid = s.pid WHERE r.slot_name = %s",
        (slot,),
    ).fetchone()
    return lsn_from_str(str(row[0])) if row and row[0] else 0


def _wait(cond: Any, what: str, seconds: float = 300, every: float = 0.05) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


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
            # the service's start-up is not a commit's latency: start once one came through
            c.execute("INSERT INTO lat VALUES (-1)")
            _wait(lambda: len(seen) >= 1, "the first transaction at the subscriber")
            seen.clear()
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


def _consumer(address: str, note: Callable[[bytes], None], done: threading.Event) -> threading.Thread:
    """A consumer in this process: `note(line)` as each transaction arrives, then its acknowledgement."""
    from csnd.consumers.client import Changefeed

    def consume() -> None:
        feed = Changefeed(address)
        try:
            while not done.is_set():
                rec = feed.next(timeout=0.5)
                if rec is not None:
                    note(rec[1])
                    feed.ack(rec[0])
        finally:
            feed.close()

    t = threading.Thread(target=consume, daemon=True)
    t.start()
    return t


def _subscriber(address: str, seen: list[float], done: threading.Event) -> threading.Thread:
    """For each transaction, now minus its commit time."""

    def note(line: bytes) -> None:
        seen.append(time.time() - datetime.fromisoformat(json.loads(line)["commit_time"]).timestamp())

    return _consumer(address, note, done)


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
            [
                *CSND,
                "serve",
                *sources,
                "--changelog",
                os.path.join(work, "log-cluster"),
                "--decoders",
                "1",
                "--listen",
                "127.0.0.1:0",
            ],
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
                    "--duration",
                    str(seconds),
                    "--out",
                    committed,
                ],
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
        # (latency before the steady load: not measured while autovacuum works through its 2M rows)
        return {
            "throughput": throughput(server, work),
            "latency": latency(server, work),
            "steady": steady(server, work),
            "cluster": cluster_latency(work),
        }
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


_KINDS: Final = (
    ("wide_rows", "50 wide rows a transaction"),
    ("one_row_transactions", "one-row transactions"),
)


def _rate_row(section: str, what: str, t: dict[str, Any]) -> tuple[str, str]:
    """A row of `section` ("steady" or "throughput") against pg_recvlogical, for rows of kind `what`."""
    if section == "steady":
        label = (
            f"steady load: pgbench ({t['clients']} clients, {t['load_s']:.0f} s, {what}) flat out; "
            "`csnd serve` -> subscriber and `pg_recvlogical` both live"
        )
        extra = f"; {t['csnd_behind_at_end_s']:.1f} s behind when the load stopped"
    else:
        label = (
            f"backlog: `csnd serve` -> `csnd subscribe` from start-up, {t['rows']:,} rows ({what}) "
            "written beforehand, vs `pg_recvlogical` (same WAL)"
        )
        extra = ""
    return (
        label,
        f"{t['csnd_rows_per_s']:,.0f} rows/s, {t['csnd_transactions_per_s']:,.0f} transactions/s vs "
        f"{t['pg_recvlogical_rows_per_s']:,.0f} rows/s (ratio {t['ratio']:.2f}{extra})",
    )


def table(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        _rate_row(section, what, r[section][key])
        for section in ("steady", "throughput")
        for key, what in _KINDS
    ]
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
