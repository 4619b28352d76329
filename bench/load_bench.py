"""Memory and latency of `csnd serve` under load: the changelog, not memory, must absorb it.

The service promises (docs/design.md sections 5 and 6) that a slow consumer
only reads further behind in the changelog, that a big transaction spills
to disk instead of memory, and that an idle node holds nothing back.  Each
scenario here puts one of those under load and watches memory: it starts
`csnd serve` as a subprocess against real PostgreSQL 15 servers it starts
itself, and samples every csnd process -- the service, the decoders' fork
server and every decoder forked from it (found through /proc, see
bench/loadkit.py), and the subscribers -- every 0.5 s: RSS over time, to
show whether it is bounded or grows with the backlog, and the peak (VmHWM).

1. slow: a `csnd subscribe` whose stdout this process reads one line per
   10 ms, and one that is stopped (SIGSTOP) once it has caught up, while
   pgbench commits a steady load: the backlog of each (transactions
   appended minus lines read) beside the service's RSS.
2. fanout: N `csnd subscribe` processes (one process each, as operators run
   them) reading the same stream under a steady load: the service's RSS and
   CPU over the load, each subscriber's lag when it stops and how long they
   take to catch up.
3. bigtxn: one transaction of `txn_mb` MB of row values (INSERT ... SELECT
   generate_series, about 1 kB a row), streamed by the server in blocks and
   spilled by the sender past 64 MiB (csnd/sender/txnbuf.py): time from commit
   to the changelog and to a `csnd subscribe`, the spill bytes from
   `/api/status`.
4. idle: two servers in GTM mode with the gtm kit's ticker on both; `csnd
   workload` writers on dn1 only, dn2 idle but for the ticks: commit (the
   server's commit time in each line; the writers' record says which
   transactions to expect) to changelog (each record's append time) and to
   a subscriber, p50/p99; dn2's slot confirmed_flush_lsn sampled over time.

    python -m bench load [--small] [--only slow,fanout,bigtxn,idle] [--txn-mb 1024 ...]

The full sizes (`Scale`) take about a quarter of an hour: a backlog of
90,000 transactions (about 200 MB of changelog) behind the stopped
subscriber, 50 subscribers, a 1 GB transaction, an idle node for three
minutes.  `--small` is seconds of each, for a busy machine; each size can be
set on its own (--help).  Prints the table and writes it to
bench-out/load.md, the raw figures (every RSS sample) to bench-out/load.json.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Final

import psycopg

from bench.common import out_path
from bench.loadkit import (
    CSND,
    MB,
    Service,
    Watch,
    add_scale_flags,
    append_times,
    end_all,
    lsn_text,
    percentiles,
    scale_from,
    subscribe,
    summarise,
    wait_for,
)
from csnd.core.ids import lsn_from_str
from csnd.testing.pgserver import PgServer, start_server

# How often the slow-subscriber scenario reads /api/status.  Each read counts every
# lagging consumer's backlog in the changelog, up to 10,000 records: with two
# consumers behind, a read took up to a second of the service's time.
STATUS_EVERY_S: Final = 10.0
# How long a `csnd subscribe --limit N` may take to exit after its last line (it
# first waits up to 5 s for the service to store its acknowledgement).
EXIT_WAIT_S: Final = 30.0
# pgbench's clients (one thread): the steady load of the slow and fanout scenarios.
PGBENCH_CLIENTS: Final = 2


@dataclass(frozen=True)
class Scale:
    load_seconds: float = 180.0  # 1: how long the writer commits
    load_rate: int = 500  # 1 and 2: transactions a second
    row_chars: int = 2000  # 1 and 2: characters of the one text column a transaction inserts
    subscribers: int = 50  # 2
    fanout_seconds: float = 60.0  # 2
    txn_mb: int = 1024  # 3: MB of row values in the one transaction
    idle_seconds: float = 180.0  # 4
    idle_rate: float = 50.0  # 4: the busy node's transactions a second


FULL: Final = Scale()
SMALL: Final = Scale(
    load_seconds=20,
    load_rate=200,
    row_chars=1000,
    subscribers=5,
    fanout_seconds=10,
    txn_mb=20,
    idle_seconds=20,
)
SCENARIOS: Final = ("slow", "fanout", "bigtxn", "idle")
_SIZE_HELP: Final = {
    "load_seconds": "slow: seconds of steady load",
    "load_rate": "slow and fanout: one-row transactions a second",
    "row_chars": "slow and fanout: characters of each row's text",
    "subscribers": "fanout: csnd subscribe processes",
    "fanout_seconds": "fanout: seconds of steady load",
    "txn_mb": "bigtxn: MB of row values in the one transaction",
    "idle_seconds": "idle: seconds the busy node writes and the other idles",
    "idle_rate": "idle: the busy node's transactions a second",
}


def _table(server: PgServer, name: str) -> str:
    """A table of one text column, its publication and a slot (all named `name`); the source for serve."""
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        c.execute(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, v text)")
        c.execute(f"CREATE PUBLICATION {name} FOR TABLE {name}")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
    return f"dn1={server.url()}?slot={name}&publication={name}"


def _pgbench(
    server: PgServer, work: str, table: str, chars: int, rate: int, seconds: float, per_client: int = 0
) -> subprocess.Popen[str]:
    """pgbench at `rate` one-row transactions a second for `seconds` (or `per_client` transactions
    from each client), each row `chars` characters."""
    script = os.path.join(work, f"{table}.sql")
    with open(script, "w") as f:
        f.write(f"INSERT INTO {table} (v) VALUES (repeat(md5(random()::text), {max(1, chars // 32)}));\n")
    return subprocess.Popen(
        [server.bin("pgbench"), "-n", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
        + ["-c", str(PGBENCH_CLIENTS), "-j", "1", "-R", str(rate)]
        + (["-t", str(per_client)] if per_client else ["-T", str(int(seconds))])
        + ["-f", script, "postgres"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _exits(p: subprocess.Popen[Any], seconds: float) -> bool:
    try:
        p.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


def _committed(load: subprocess.Popen[str]) -> int:
    out, err = load.communicate()
    m = re.search(r"actually processed: (\d+)", out)
    if load.returncode != 0 or m is None:
        raise RuntimeError(f"pgbench failed: {err.strip()}")
    return int(m.group(1))


def _consumer(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next((c for c in doc.get("consumers", []) if c.get("name") == name), {})


# --- 1. a slow and a stopped subscriber ------------------------------------------------


def slow(server: PgServer, work: str, scale: Scale) -> dict[str, Any]:
    svc = Service([_table(server, "load_slow")], work, "slow", "--decoders", "2")
    watch = Watch(svc.proc.pid).start()
    lines = {"slow": 0, "stopped": 0}
    subs = {name: subscribe(svc.address, "--name", name, stdout=subprocess.PIPE) for name in lines}

    def read(name: str, pause: float) -> None:
        out = subs[name].stdout
        assert out is not None
        for _ in out:
            lines[name] += 1
            if pause:
                time.sleep(pause)

    for name, pause in (("slow", 0.01), ("stopped", 0.0)):
        watch.add(subs[name].pid, f"csnd subscribe ({name})")
        threading.Thread(target=read, args=(name, pause), daemon=True).start()
    samples: list[dict[str, Any]] = []
    procs: list[subprocess.Popen[Any]] = list(subs.values())
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            c.execute("INSERT INTO load_slow (v) VALUES ('warm-up')")
        wait_for(lambda: lines["slow"] and lines["stopped"], "both subscribers' first line")
        os.kill(subs["stopped"].pid, signal.SIGSTOP)
        t0 = watch.mark_load_start()
        load = _pgbench(server, work, "load_slow", scale.row_chars, scale.load_rate, scale.load_seconds)
        procs.append(load)
        while True:
            done = load.poll() is not None
            t_status = time.monotonic()
            doc = svc.status()
            t_status = time.monotonic() - t_status
            appended = int(doc["totals"]["transactions"])
            samples.append(
                {
                    "t": round(time.monotonic() - t0, 1),
                    "appended": appended,
                    "changelog_mb": int(doc["changelog"]["bytes"]) / MB,
                    "backlog_slow": appended - lines["slow"],
                    "backlog_stopped": appended - lines["stopped"],
                    "stopped_connected": bool(_consumer(doc, "stopped").get("connected")),
                    "status_ms": round(t_status * 1000),
                    "serve_rss_mb": watch.procs[svc.proc.pid].rss_mb()[-1],
                }
            )
            if done:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                load.wait(STATUS_EVERY_S)
        committed = _committed(load)
    finally:
        end_all(procs)
        watch.stop()
        svc.stop()
    dropped = next((s["t"] for s in samples if not s["stopped_connected"]), None)
    last, half = samples[-1], samples[len(samples) // 2]
    serve = watch.procs[svc.proc.pid]
    mid = serve.rss_mb()[: len(serve.rss_mb()) // 2]
    return {
        "committed": committed,
        "rate": scale.load_rate,
        "seconds": scale.load_seconds,
        "row_chars": scale.row_chars,
        "samples": samples,
        "stopped_dropped_after_s": dropped,
        "procs": summarise(watch),
        "notes": {
            "csnd serve": (
                f"{committed:,} one-row transactions of {scale.row_chars:,} characters in "
                f"{scale.load_seconds:.0f} s ({committed / scale.load_seconds:.0f}/s, asked {scale.load_rate}/s); "
                f"backlog slow / stopped at half time {half['backlog_slow']:,} / {half['backlog_stopped']:,}, "
                f"at the end {last['backlog_slow']:,} / {last['backlog_stopped']:,} transactions "
                f"(changelog {last['changelog_mb']:.0f} MB); RSS peak in the first half "
                f"{max(mid or [0]):.0f} MB, over the whole run {max(serve.rss_mb()):.0f} MB; /api/status "
                f"(every {STATUS_EVERY_S:.0f} s) took up to {max(x['status_ms'] for x in samples)} ms"
            ),
            "csnd subscribe (stopped)": (
                "SIGSTOP once caught up; the service dropped it after "
                + (f"{dropped:.0f} s" if dropped is not None else "more than the run")
            ),
            "csnd subscribe (slow)": "stdout read one line per 10 ms",
        },
    }


# --- 2. many subscribers ----------------------------------------------------------------


def fanout(server: PgServer, work: str, scale: Scale) -> dict[str, Any]:
    """No Status calls while it runs: each counts every lagging consumer's backlog in the changelog."""
    svc = Service([_table(server, "load_fan")], work, "fanout", "--decoders", "2")
    watch = Watch(svc.proc.pid).start()
    per_client = max(1, int(scale.load_rate * scale.fanout_seconds) // PGBENCH_CLIENTS)
    total = per_client * PGBENCH_CLIENTS + 1  # (and the warm-up)
    names = [f"fan-{i:02d}" for i in range(scale.subscribers)]
    subs = [subscribe(svc.address, "--name", n, "--limit", str(total), stdout=subprocess.PIPE) for n in names]
    lines = [0] * len(subs)
    done_at: list[float] = [0.0] * len(subs)

    def count(i: int, fd: int) -> None:
        while chunk := os.read(fd, 1 << 16):
            lines[i] += chunk.count(b"\n")
            if lines[i] >= total and not done_at[i]:
                done_at[i] = time.monotonic()  # (its exit comes later: it waits for its ack to be stored)
        done_at[i] = done_at[i] or time.monotonic()  # (ended early: a failure, reported below)

    for i, (n, p) in enumerate(zip(names, subs, strict=True)):
        watch.add(p.pid, f"csnd subscribe {n}")
        assert p.stdout is not None
        threading.Thread(target=count, args=(i, p.stdout.fileno()), daemon=True).start()
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            c.execute("INSERT INTO load_fan (v) VALUES ('warm-up')")
        wait_for(lambda: all(lines), f"{len(names)} subscribers' first line")
        t0 = watch.mark_load_start()
        committed = _committed(
            _pgbench(
                server, work, "load_fan", scale.row_chars, scale.load_rate, scale.fanout_seconds, per_client
            )
        )
        t1 = time.monotonic()
        behind = sorted(total - n for n in lines)
        wait_for(lambda: all(done_at), "every subscriber to print every transaction", seconds=900, every=0.5)
        short = [n for i, n in enumerate(names) if lines[i] < total]
        if short:
            raise RuntimeError(f"subscribers {', '.join(short)} ended before printing {total} lines")
        hung = [n for n, p in zip(names, subs, strict=True) if not _exits(p, EXIT_WAIT_S)]
    finally:
        end_all(subs)
        watch.stop()
        svc.stop()
    span = t1 - t0
    caught = sorted(d - t1 for d in done_at)
    tree = watch.service_tree()
    serve_cpu = watch.procs[svc.proc.pid].cpu_between(t0, t1) / span
    decoder_cpu = sum(p.cpu_between(t0, t1) for p in tree if p.label.startswith("decoder")) / span
    sub_cpu = sum(p.cpu_between(t0, t1) for p in watch.by_label("csnd subscribe")) / span
    notes = {
        "csnd serve": (
            f"{len(names)} subscribers, {committed:,} one-row transactions of {scale.row_chars:,} characters "
            f"in {span:.0f} s ({committed / span:.0f}/s, asked {scale.load_rate}/s); "
            f"CPU {serve_cpu * 100:.0f}% of a core (decoders {decoder_cpu * 100:.0f}%, "
            f"subscribers together {sub_cpu * 100:.0f}%)"
        ),
        "subscribers": (
            f"`csnd subscribe` processes; transactions committed but not yet printed when the load stopped: "
            f"min {behind[0]:,}, median {int(statistics.median(behind)):,}, max {behind[-1]:,}; each had "
            f"printed all {total:,} {caught[0]:.2f} s (first) to {caught[-1]:.2f} s (last) after it, "
            f"median {statistics.median(caught):.2f} s"
            + (
                f"; {len(hung)} did not exit {EXIT_WAIT_S:.0f} s after their last line ({', '.join(hung)})"
                if hung
                else ""
            )
        ),
    }
    return {
        "subscribers": len(names),
        "kind": "csnd subscribe processes",
        "committed": committed,
        "seconds": span,
        "serve_cpu_share": serve_cpu,
        "decoder_cpu_share": decoder_cpu,
        "subscriber_cpu_share": sub_cpu,
        "hung_at_exit": hung,
        "behind_at_end": dict(zip(names, [total - n for n in lines], strict=True)),
        "all_printed_after_s": caught,
        "procs": summarise(watch),
        "notes": notes,
    }


# --- 3. one big transaction -----------------------------------------------------------------

ROW_CHARS: Final = 1024  # 32 md5s a row: under the TOAST threshold, so the row is logged as is


def bigtxn(server: PgServer, work: str, scale: Scale) -> dict[str, Any]:
    svc = Service([_table(server, "load_big")], work, "bigtxn", "--decoders", "2")
    watch = Watch(svc.proc.pid).start()
    rows = scale.txn_mb * 1_000_000 // ROW_CHARS
    delivered = [0]
    spill = [0]
    t_log = t_sub = None
    sub_err = ""
    procs: list[subprocess.Popen[Any]] = []
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            c.execute("INSERT INTO load_big (v) VALUES ('warm-up')")
            wait_for(lambda: svc.newest_csn() > 0, "the first transaction")
            first = svc.newest_csn()
            sub = subscribe(svc.address, "--from-csn", str(first), "--limit", "1", stdout=subprocess.PIPE)
            procs.append(sub)
            watch.add(sub.pid, "csnd subscribe")

            def drain(fd: int) -> None:
                while chunk := os.read(fd, 1 << 20):
                    delivered[0] += len(chunk)

            assert sub.stdout is not None
            threading.Thread(target=drain, args=(sub.stdout.fileno(),), daemon=True).start()
            t0 = watch.mark_load_start()
            c.execute(
                "INSERT INTO load_big (v) SELECT repeat(md5(g::text), 32) FROM generate_series(1, %s) g",
                (rows,),
            )
            t_commit = time.monotonic()

        def logged() -> bool:
            node = svc.status()
            spill[0] = max(spill[0], int(node["nodes"][0].get("spill_bytes", 0)))
            return int(node["changelog"].get("newest_csn", 0)) > first

        t_log = wait_for(logged, "the big transaction in the changelog", seconds=3600, every=0.5)
        try:
            sub.wait(timeout=max(120.0, 3 * (t_log - t_commit)))
            t_sub = time.monotonic() if sub.returncode == 0 else None
        except subprocess.TimeoutExpired:
            sub.kill()
            sub.wait()
        if t_sub is None:
            sub_err = (sub.stderr.read().decode(errors="replace") if sub.stderr else "").strip()
        changelog_mb = int(svc.status()["changelog"]["bytes"]) / MB
    finally:
        end_all(procs)
        watch.stop()
        svc.stop()
    to_sub = f"{t_sub - t_commit:.1f} s" if t_sub is not None else "not delivered"
    return {
        "txn_mb": scale.txn_mb,
        "rows": rows,
        "insert_s": t_commit - t0,
        "commit_to_changelog_s": t_log - t_commit,
        "commit_to_subscriber_s": None if t_sub is None else t_sub - t_commit,
        "subscriber_error": sub_err[-500:],
        "delivered_mb": delivered[0] / MB,
        "changelog_mb": changelog_mb,
        "spill_mb": spill[0] / MB,
        "procs": summarise(watch),
        "notes": {
            "csnd serve": (
                f"one transaction of {rows:,} rows, {scale.txn_mb:,} MB of values ({changelog_mb:.0f} MB of "
                f"changelog); INSERT {t_commit - t0:.0f} s, commit to changelog {t_log - t_commit:.1f} s, "
                f"to subscriber {to_sub}; spilled {spill[0] / MB:.0f} MB"
            ),
            "csnd subscribe": f"received {delivered[0] / MB:.0f} MB"
            + (f"; {sub_err.splitlines()[-1][:160]}" if sub_err else ""),
        },
    }


# --- 4. an idle node beside a busy one -------------------------------------------------------


def idle(work: str, scale: Scale) -> dict[str, Any]:
    from csnd.consumers.client import Changefeed
    from csnd.gtm.liveload import LoadOptions, setup
    from csnd.gtm.pggtm import PgGtm
    from csnd.gtm.ticker import Ticker
    from csnd.testing.cluster import start_cluster

    with start_cluster(2) as cluster:
        urls = cluster.urls()
        setup(LoadOptions(nodes=urls, gtm=cluster.gtm_url, publication="load_pub"))
        for url in urls.values():
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("SELECT pg_create_logical_replication_slot('load_idle', 'pgoutput')")
        sources = [f"{n}={u}?slot=load_idle&publication=load_pub&mode=gtm" for n, u in urls.items()]
        svc = Service(sources, work, "idle", "--decoders", "1")
        watch = Watch(svc.proc.pid).start()
        gtm = PgGtm(cluster.gtm_url)
        ticker = Ticker(gtm, urls, interval=0.1).start()
        arrived: dict[int, tuple[float, float]] = {}  # csn -> (arrival, commit time), wall seconds
        slot: list[tuple[float, int, int]] = []  # (t, confirmed_flush_lsn, current WAL) on dn2
        done = threading.Event()

        def consume() -> None:
            feed = Changefeed(svc.address)
            try:
                while not done.is_set():
                    rec = feed.next(timeout=0.5)
                    if rec is not None:
                        now = time.time()
                        commit = datetime.fromisoformat(json.loads(rec[1])["commit_time"]).timestamp()
                        arrived[rec[0]] = (now, commit)
                        feed.ack(rec[0])
            finally:
                feed.close()

        def watch_slot() -> None:
            with psycopg.connect(urls["dn2"], autocommit=True) as c:
                t0 = time.monotonic()
                while not done.wait(0 if not slot else max(1.0, scale.idle_seconds / 60)):
                    row = c.execute(
                        "SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text FROM pg_replication_slots "
                        "WHERE slot_name = 'load_idle'"
                    ).fetchone()
                    assert row is not None
                    slot.append((time.monotonic() - t0, lsn_from_str(row[0]), lsn_from_str(row[1])))

        threads = [threading.Thread(target=f, daemon=True) for f in (consume, watch_slot)]
        for t in threads:
            t.start()
        committed_path = os.path.join(work, "idle-committed.jsonl")
        try:
            watch.mark_load_start()
            load = subprocess.run(
                [
                    *CSND,
                    "workload",
                    *("--nodes", f"dn1={urls['dn1']}", "--writers", "2"),
                    *("--rate", str(scale.idle_rate), "--duration", str(scale.idle_seconds)),
                    *("--publication", "load_pub", "--out", committed_path),
                ],
                capture_output=True,
                text=True,
            )
            if load.returncode != 0:
                raise RuntimeError(f"csnd workload failed: {load.stderr.strip()}")
            with open(committed_path) as f:
                expected = [json.loads(x)["csn"] for x in f if x.strip()]
            wait_for(
                lambda: all(c in arrived for c in expected), "every committed transaction at the subscriber"
            )
            dn2 = next(n for n in svc.status()["nodes"] if n["name"] == "dn2")
        finally:
            done.set()
            for t in threads:
                t.join(timeout=30)
            ticker.stop()
            gtm.close()
            watch.stop()
            svc.stop()
    appended = append_times(svc.changelog)
    to_log = percentiles(sorted((appended[c] - arrived[c][1]) * 1000 for c in expected if c in appended))
    to_sub = percentiles(sorted((arrived[c][0] - arrived[c][1]) * 1000 for c in expected))
    moved = [b[0] for a, b in itertools.pairwise(slot) if b[1] > a[1]]
    stall = max((b - a for a, b in itertools.pairwise([0.0, *moved, slot[-1][0]])), default=0.0)
    rate = len(expected) / scale.idle_seconds
    return {
        "seconds": scale.idle_seconds,
        "busy_rate": rate,
        "committed": len(expected),
        "commit_to_changelog_ms": to_log,
        "commit_to_subscriber_ms": to_sub,
        "idle_slot": [{"t": round(t, 1), "confirmed_flush_lsn": c, "wal": w} for t, c, w in slot],
        "idle_slot_moves": len(moved),
        "idle_slot_longest_still_s": stall,
        "idle_node_status": {k: dn2.get(k) for k in ("state", "stuck", "transactions", "lag_bytes")},
        "procs": summarise(watch),
        "notes": {
            "csnd serve": (
                f"GTM mode; dn1 busy ({len(expected):,} transactions, {rate:.0f}/s from 2 writers), dn2 idle "
                f"{scale.idle_seconds:.0f} s but for the ticker's marks (every 0.1 s); dn1 commit to changelog "
                f"p50 {to_log['p50']:.0f} ms, p99 {to_log['p99']:.0f} ms, to subscriber p50 {to_sub['p50']:.0f} "
                f"ms, p99 {to_sub['p99']:.0f} ms; dn2's slot confirmed_flush_lsn {lsn_text(slot[0][1])} -> "
                f"{lsn_text(slot[-1][1])}, moved in {len(moved)} of {len(slot) - 1} samples (never still for "
                f"more than {stall:.0f} s), {slot[-1][2] - slot[-1][1]:,} bytes behind its WAL end at the last; "
                f"dn2 {dn2.get('state')}, {dn2.get('transactions', 0)} transactions"
            ),
        },
    }


# --- the table ----------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(scenario, process, peak RSS MB, RSS at start / end MB, notes); many subscribers fold into one row."""
    rows = []
    for scenario, r in results.items():
        notes = r["notes"]
        if "error" in r and not r["procs"]:
            rows.append((scenario, "-", "-", "-", f"FAILED: {r['error']}"))
        subs = [p for p in r["procs"] if p["label"].startswith("csnd subscribe fan-")]
        for p in r["procs"]:
            if p in subs:
                continue
            note = notes.get(p["label"], "")
            rows.append(
                (
                    scenario,
                    p["label"],
                    f"{p['peak_mb']:.0f}",
                    f"{p['start_mb']:.0f} / {p['end_mb']:.0f}",
                    (note + "; " if note else "") + f"RSS over the run: {p['timeline']}",
                )
            )
        if subs:
            peaks = [p["peak_mb"] for p in subs]
            rows.append(
                (
                    scenario,
                    f"{len(subs)} x csnd subscribe",
                    f"max {max(peaks):.0f}",
                    f"{statistics.median(p['start_mb'] for p in subs):.0f} / "
                    f"{statistics.median(p['end_mb'] for p in subs):.0f} (median)",
                    notes.get("subscribers", "") + f"; peaks sum to {sum(peaks):.0f} MB",
                )
            )
    return rows


def markdown(rows: list[tuple[str, str, str, str, str]]) -> str:
    out = [
        "| scenario | process | peak RSS MB | RSS at start / end MB | notes |",
        "| --- | --- | --- | --- | --- |",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


ON_ONE_SERVER: Final = {"slow": slow, "fanout": fanout, "bigtxn": bigtxn}


def parse_args(argv: list[str]) -> tuple[Scale, list[str]]:
    p = argparse.ArgumentParser(prog="python -m bench load", description=__doc__.split("\n\n")[0])
    add_scale_flags(p, FULL, SMALL, _SIZE_HELP)
    p.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {', '.join(SCENARIOS)}"
    )
    a = p.parse_args(argv)
    scale = scale_from(a, FULL, SMALL)
    only = [s.strip() for s in a.only.split(",") if s.strip()]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenario {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")
    return scale, only


def main(argv: list[str] | None = None) -> dict[str, Any]:
    scale, only = parse_args(sys.argv[1:] if argv is None else argv)
    work = tempfile.mkdtemp(prefix="csnd-load-bench-")
    results: dict[str, Any] = {}
    server = start_server() if set(only) & {"slow", "fanout", "bigtxn"} else None
    try:
        for name in only:
            print(f"bench load: {name} ...", file=sys.stderr, flush=True)
            Watch.latest = None
            try:
                if name == "idle":
                    results[name] = idle(work, scale)
                else:
                    assert server is not None
                    results[name] = ON_ONE_SERVER[name](server, work, scale)
            except Exception as e:  # the next scenario still runs; what this one saw is kept
                print(f"bench load: {name} failed: {e}", file=sys.stderr, flush=True)
                seen: list[dict[str, Any]] = summarise(Watch.latest) if Watch.latest else []
                results[name] = {"error": str(e), "procs": seen, "notes": {"csnd serve": f"FAILED: {e}"}}
    finally:
        if server is not None:
            server.stop("immediate")
            shutil.rmtree(server.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    results_doc = {"scale": asdict(scale), "results": results}
    with open(out_path("load.json"), "w", encoding="utf-8") as f:
        json.dump(results_doc, f, indent=2, default=str)
    text = markdown(table(results))
    with open(out_path("load.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return results_doc


if __name__ == "__main__":
    main()
