"""Live latency: `csnd serve` -> `csnd subscribe` against `pg_recvlogical`, same load at the same time.

One PostgreSQL 15 server (the test server).  Two slots on it: `twin`
(test_decoding, `include-timestamp`) read by `pg_recvlogical`, and `csnd`
(pgoutput, publication `bench`) read by `csnd serve`, whose changefeed one
`csnd subscribe` prints.  Both readers run through the whole bench, so they
see the same load at the same time.  For each rate, pgbench (4 clients,
`-R RATE`) commits one-row INSERT transactions for `--seconds`; then the
bench waits until both consumers have printed every transaction pgbench
committed (delivered = committed is checked, not assumed).

Latency of a transaction = when its line reached this process through the
consumer's stdout pipe (`time.time()` as the read returned) minus the commit
timestamp the stream carries (test_decoding's `COMMIT ... (at TS)`, csnd's
`commit_time`): the same clock, this machine's.  p50 / p99 / max per rate
and consumer.

Stage by stage (where a live transaction waits inside csnd): the service's
`/metrics` histograms `csnd_commit_to_durable_seconds` (commit timestamp to
the changelog's group commit having made it durable) and
`csnd_commit_to_sent_seconds` (to the changefeed having handed it to a
subscriber's stream), scraped before and after each rate: the difference is
that rate's histogram, and its p50 / p99 are read off the buckets (bucket
upper bounds, so a bound and not an exact figure).  What is left after
"sent" is gRPC, the subscriber process and its pipe.  The changelog's group
commits per transaction (`csnd_changelog_fsyncs_total`, scraped the same
way), and with `--thread-names` the sync thread's wake-ups per group
commit: live, a group holds one transaction or a few.

CPU per transaction of every process (utime + stime from /proc) over each
rate's window: `csnd serve`, its decoders, `csnd subscribe`, the two
walsenders and `pg_recvlogical`; and their wake-ups per transaction (the
threads' voluntary context switches), which, unlike a p99, do not swing
with the machine's other load.  `--thread-names` names csnd's threads in
the per-thread figures of latency.json (py-spy dump); `--profile DIR`
records `csnd serve`'s on-CPU stacks by thread over each rate (py-spy).

`--stages` times each transaction inside `csnd serve` exactly, not by
bucket: bench/stagetrace hooks the service's reader (commit received from
the walsender), its changelog append, and its durable and sent
observations, each as seconds since the commit; p50 / p90 / p99 a stage
and rate, beside the subscriber's and `pg_recvlogical`'s arrival.  The
hook is Python in the reader's loop, a few microseconds a transaction:
near the machine's limit (5,000 a second and more here) it slows csnd
itself, so read the stages at the lower rates and the latency without it.

`--floor sync|durable|handoff|aio` times the push floor
(bench/pushfloor.py) instead of csnd: pg_recvlogical on a slot of its own
piped into a relay that does nothing but push the transactions over gRPC
as they complete, to a client that prints them, against the twin on the
same load at the same time.  It is what any changefeed served from Python
to a Python subscriber would at least cost on this machine, with no
decoding and no changelog (`durable`: and an fsync of each message before
it is sent; `handoff`: and that done by a thread of its own, which hands
the message to the stream's, as csnd's changefeed is fed): its p99 against
the goal's bar says whether the bar is within reach of that shape.
`--floor-work-us N` adds N µs of Python CPU a transaction to the relay,
standing in for csnd's own work on it: swept, it says how much work the
bar leaves.

`--beside-floor durable|handoff` runs csnd as usual and that floor as a
third consumer of the same load at the same time, and adds its figures
and one more verdict to the table: csnd's p99 within max(2x the floor's,
2 ms). The floor makes each transaction durable before it sends it, as
csnd does; `pg_recvlogical` does not (its `--fsync-interval` is whole
seconds).

    python -m bench latency [--small] [--rates 100,1000] [--seconds S] [--decoders N]
        [--thread-names] [--profile DIR] [--stages] [--beside-floor durable|handoff]
    python -m bench latency --floor sync|durable|handoff|aio [--floor-work-us N] [--small]
        [--rates R,...] [--seconds S]
    python -m bench.latency_bench ...

Prints a table and writes it to bench-out/latency.md, raw figures to
bench-out/latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from importlib import metadata
from typing import Any, Final

import psycopg

from bench import loadkit
from bench.loadkit import CLK_TCK, Service, Watch, cpu_seconds, end_all, subscribe
from bench.pushfloor import KINDS, WRITES_A_FILE
from csnd.consumers.grpcpoll import EXPERIMENTS, experiments_for
from csnd.testing.pgserver import PgServer, start_server

RATES: Final = (100, 1_000, 2_000, 5_000, 10_000)
CLIENTS: Final = 4
SECONDS: Final = 10.0
SMALL_SECONDS: Final = 4.0
DRAIN_TIMEOUT_S: Final = 300.0
STAGES: Final = ("csnd_commit_to_durable_seconds", "csnd_commit_to_sent_seconds")
# The changelog's group commits (one fsync each): per transaction, and the sync thread's
# wake-ups per group commit, the figure the thread's own cost is judged by.
FSYNCS: Final = "csnd_changelog_fsyncs_total"
SYNC_THREAD: Final = "csnd-changelog-sync"
# --stages: the hook's directory (put on PYTHONPATH for csnd's processes) and its stages in order.
STAGE_TRACE_DIR: Final = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stagetrace")
TRACED_STAGES: Final = ("received", "appended", "durable", "sent")


def trace_stages(path: str) -> None:
    """Start csnd's processes with the stage hook on, writing to `path` at exit."""
    os.environ["CSND_STAGE_TRACE"] = path
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (STAGE_TRACE_DIR, os.environ.get("PYTHONPATH")) if p
    )


def stage_figures(
    samples: dict[str, list[list[float]]], start: float, end: float
) -> dict[str, dict[str, float]]:
    """Each stage's p50 / p90 / p99 ms over the transactions committed in [start, end)."""
    out: dict[str, dict[str, float]] = {}
    for stage in TRACED_STAGES:
        lat = sorted(s for t, s in samples.get(stage, []) if start <= t < end)
        if lat:
            out[stage] = {f"p{q}_ms": pct(lat, q / 100) * 1000 for q in (50, 90, 99)} | {"n": len(lat)}
    return out


class Arrivals:
    """Reads a consumer's stdout in a thread: for each line, arrival time minus its commit time."""

    def __init__(self, fd: int, commit_time: Any, name: str) -> None:
        self.latencies: list[float] = []
        self.lines = 0
        self._fd, self._commit_time = fd, commit_time
        self._cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rest = b""
        while chunk := os.read(self._fd, 1 << 16):
            now = time.time()
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            got = [now - t for t in map(self._commit_time, lines) if t is not None]
            with self._cond:
                self.latencies += got
                self.lines += len(got)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, count: int, seconds: float) -> bool:
        """True once `count` transactions have arrived; False after `seconds` or at the pipe's end."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while self.lines < count:
                left = deadline - time.monotonic()
                if left <= 0 or not self.thread.is_alive():
                    return False
                self._cond.wait(min(left, 1.0))
        return True


def csnd_commit_time(line: bytes) -> float | None:
    # the native line opens {"csn": N, "gid": ..., "commit_time": "...": no JSON parse needed
    at = line.find(b'"commit_time": "')
    if at < 0:
        return None
    start = at + 16
    return datetime.fromisoformat(line[start : line.index(b'"', start)].decode()).timestamp()


def test_decoding_commit_time(line: bytes) -> float | None:
    # COMMIT 1234 (at 2026-11-29 03:12:17.123456+00)
    if not line.startswith(b"COMMIT "):
        return None
    at = line.rfind(b"(at ")
    return datetime.fromisoformat(line[at + 4 : line.rindex(b")")].decode()).timestamp()


def arrival_figures(a: Arrivals, base: int, committed: int, got: bool) -> dict[str, Any]:
    """A consumer's figures for one rate: the `committed` transactions after its first `base`."""
    lat = a.latencies[base : base + committed]
    return {
        "delivered": a.lines - base,
        "all_delivered": got and a.lines - base == committed,
        "p50_ms": pct(lat, 0.5) * 1000,
        "p99_ms": pct(lat, 0.99) * 1000,
        "max_ms": max(lat, default=float("nan")) * 1000,
    }


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


# --- /metrics ---------------------------------------------------------------------------------


def scrape(http: str) -> dict[str, dict[float, float]]:
    """The stage histograms' cumulative buckets: {name: {upper bound: count}} (empty if absent)."""
    with urllib.request.urlopen(http + "metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, dict[float, float]] = {name: {} for name in STAGES}
    for line in text.splitlines():
        for name in STAGES:
            if line.startswith(name + "_bucket{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                out[name][float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def fsyncs(http: str) -> float:
    """The changelog's group-commit fsyncs so far (`csnd_changelog_fsyncs_total`; 0 if absent)."""
    with urllib.request.urlopen(http + "metrics", timeout=30) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith((FSYNCS + " ", FSYNCS + "{")):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def group_commits(row: dict[str, Any], synced: float) -> dict[str, float | None]:
    """Group commits per transaction, and the sync thread's wake-ups per group commit (named threads only)."""
    committed = row["committed"]
    sync = row["serve_threads"].get(SYNC_THREAD)
    return {
        "per_txn": synced / committed if committed else 0.0,
        "sync_wakeups_per_group": sync[1] * committed / synced if sync is not None and synced else None,
    }


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` of the observations between two scrapes."""
    bounds = sorted(after)
    if not bounds:
        return None
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return None
    for b, c in zip(bounds, counts, strict=True):
        if c >= q * total:
            return b
    return bounds[-1]


# --- the load ---------------------------------------------------------------------------------


def setup(server: PgServer, ours: tuple[str, str] = ("csnd", "pgoutput")) -> None:
    """The table, the publication, the twin's slot and `ours` (slot name, plugin)."""
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        c.execute("CREATE TABLE lat (id bigserial PRIMARY KEY, v int) WITH (autovacuum_enabled = off)")
        c.execute("CREATE PUBLICATION bench FOR ALL TABLES")
        c.execute("SELECT pg_create_logical_replication_slot('twin', 'test_decoding')")
        c.execute("SELECT pg_create_logical_replication_slot(%s, %s)", ours)


def recvlogical(server: PgServer, slot: str, stdout: int) -> subprocess.Popen[bytes]:
    """pg_recvlogical on `slot`, each transaction's lines with its commit timestamp, to `stdout`."""
    cmd = [server.bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(server.port)]
    cmd += ["-U", "postgres", "-d", "postgres", "--slot", slot, "--start"]
    cmd += ["-o", "include-timestamp=on", "-F", "0", "-f", "-"]
    return subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.DEVNULL)


def pgbench(server: PgServer, work: str, rate: int, seconds: float) -> int:
    """pgbench at `rate` one-row transactions a second; returns the transactions it committed."""
    script = os.path.join(work, "insert.sql")
    with open(script, "w") as f:
        f.write("INSERT INTO lat (v) VALUES (1);\n")
    cmd = [server.bin("pgbench"), "-n", "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    cmd += [
        "-c",
        str(CLIENTS),
        "-j",
        "2",
        "-R",
        str(rate),
        "-T",
        str(round(seconds)),
        "-f",
        script,
        "postgres",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pgbench at {rate}/s failed: {done.stderr.strip()[-500:]}")
    for line in done.stdout.splitlines():
        if line.startswith("number of transactions actually processed:"):
            return int(line.split(":")[1].split("/")[0])
    raise RuntimeError(f"pgbench printed no transaction count: {done.stdout[-500:]}")


class CpuWindow:
    """utime + stime of named processes at a window's start and end; and their threads' wake-ups.

    A wake-up is a voluntary context switch (the thread blocked and was woken
    again), counted per thread from /proc/PID/task/TID/status.  Live, when one
    transaction comes at a time, wake-ups per transaction count the hand-offs
    between threads, and unlike a latency they do not swing with the
    machine's other load.  Threads that ended within the window are missed.
    """

    def __init__(self, pids: dict[str, int], named: tuple[str, ...] = ()) -> None:
        self.pids = pids
        self.start = {k: cpu_seconds(p) or 0.0 for k, p in pids.items()}
        self.threads_start = {k: thread_stats(p) for k, p in pids.items()}
        # Python threads are all "python" to the kernel: their names, for these processes, from py-spy
        self.names = {k: python_thread_names(pids[k]) for k in named}

    def per_txn_us(self, txns: int) -> dict[str, float]:
        return {k: ((cpu_seconds(p) or 0.0) - self.start[k]) / txns * 1e6 for k, p in self.pids.items()}

    def wakeups_per_txn(self, txns: int) -> dict[str, float]:
        out = {}
        for k, p in self.pids.items():
            before = self.threads_start[k]
            now = thread_stats(p)
            out[k] = sum(w - before.get(tid, ("", 0.0, 0))[2] for tid, (_, _, w) in now.items()) / txns
        return out

    def threads_per_txn(self, name: str, txns: int) -> dict[str, tuple[float, float]]:
        """One process's threads by name: (µs of CPU, wake-ups) per transaction over the window."""
        before = self.threads_start[name]
        names = self.names.get(name, {})
        out: dict[str, tuple[float, float]] = {}
        for tid, (kernel_name, cpu, wakes) in thread_stats(self.pids[name]).items():
            comm = names.get(tid, kernel_name)
            _, cpu0, wakes0 = before.get(tid, (comm, 0.0, 0))
            us, w = out.get(comm, (0.0, 0.0))
            out[comm] = (us + (cpu - cpu0) / txns * 1e6, w + (wakes - wakes0) / txns)
        return out


ThreadStats = dict[int, tuple[str, float, int]]


def _py_spy() -> str | None:
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    return spy if os.path.exists(spy) else None


def profile_serve(pid: int, seconds: float, directory: str, rate: int) -> subprocess.Popen[bytes]:
    """py-spy on `csnd serve` over a rate's load: on-CPU stacks by thread, collapsed, to DIR/serve-RATE.txt."""
    spy = _py_spy()
    if spy is None:
        raise RuntimeError("--profile needs py-spy (pip install py-spy)")
    os.makedirs(directory, exist_ok=True)
    out = os.path.join(directory, f"serve-{rate}.txt")
    cmd = [spy, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--rate", "250"]
    cmd += ["--threads", "--nonblocking", "--format", "raw", "--output", out]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def python_thread_names(pid: int) -> dict[int, str]:
    """{tid: Python thread name} of a Python process, by `py-spy dump` ({} without py-spy)."""
    spy = _py_spy()
    if spy is None:
        return {}
    try:
        text = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[int, str] = {}
    for line in text.splitlines():  # Thread 6687 (idle): "csnd-merger"
        if line.startswith("Thread ") and '"' in line:
            tid = line.split()[1]
            if tid.isdigit():
                out[int(tid)] = line.split('"')[1]
    return out


def thread_stats(pid: int) -> ThreadStats:
    """{tid: (name, CPU seconds, voluntary context switches)} of a process's living threads."""
    out: ThreadStats = {}
    task = f"/proc/{pid}/task"
    try:
        tids = os.listdir(task)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{task}/{tid}/stat", encoding="ascii") as f:
                stat = f.read()
            with open(f"{task}/{tid}/status", encoding="ascii") as f:
                status = f.read()
        except OSError:
            continue  # (ended meanwhile)
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        wakes = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        out[int(tid)] = (comm, cpu, wakes)
    return out


def _walsenders(server: PgServer) -> dict[str, int]:
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        rows = c.execute("SELECT slot_name, active_pid FROM pg_replication_slots").fetchall()
    return {f"walsender ({name})": int(pid) for name, pid in rows if pid}


def with_switch_interval(seconds: float | None) -> None:
    """Start csnd's processes with this switch interval instead of csnd.cli's (None: csnd's own)."""
    if seconds is None:
        loadkit.CSND[:] = [sys.executable, "-m", "csnd.cli"]
        return
    code = f"import sys, csnd.cli as c; c.SWITCH_INTERVAL_S = {seconds!r}; sys.exit(c.main())"
    loadkit.CSND[:] = [sys.executable, "-c", code]


def run(
    rates: list[int],
    seconds: float,
    decoders: int | None,
    switch_s: float | None = None,
    thread_names: bool = False,
    profile: str | None = None,
    stages: bool = False,
    beside_floor: str | None = None,
) -> dict[str, Any]:
    """`beside_floor`: a push floor of this kind (bench.pushfloor) as a third consumer of the same load."""
    with_switch_interval(switch_s)
    work = tempfile.mkdtemp(prefix="csnd-latency-bench-")
    stage_file = os.path.join(work, "stages.json")
    if stages:
        trace_stages(stage_file)
    server = start_server()
    windows: list[tuple[dict[str, Any], float, float]] = []  # (row, first commit, last commit)
    procs: list[subprocess.Popen[Any]] = []
    svc: Service | None = None
    results: dict[str, Any] = {
        "rates": [],
        "clients": CLIENTS,
        "seconds": seconds,
        "switch_interval_s": switch_s,
        "cpus": os.cpu_count(),
        "beside_floor": beside_floor,
    }
    try:
        setup(server)
        twin = recvlogical(server, "twin", subprocess.PIPE)
        procs.append(twin)
        floor: tuple[Arrivals, str] | None = None  # (as `consumers` below, when one runs beside)
        floor_pids: dict[str, int] = {}
        if beside_floor is not None:
            with psycopg.connect(server.dsn(), autocommit=True) as c:
                c.execute("SELECT pg_create_logical_replication_slot('floor', 'test_decoding')")
            relay, client = start_floor(server, beside_floor, work, procs)
            assert client.stdout is not None
            floor = (
                Arrivals(client.stdout.fileno(), test_decoding_commit_time, "floor"),
                "the push floor's client",
            )
            floor_pids = {"floor relay": relay.pid, "floor client": client.pid}
        extra = ["--decoders", str(decoders)] if decoders is not None else []
        svc = Service([f"dn1={server.url()}?slot=csnd&publication=bench"], work, "lat", *extra)
        sub = subscribe(svc.address, stdout=subprocess.PIPE)
        procs.append(sub)
        assert twin.stdout is not None and sub.stdout is not None
        # {figures' name: (arrivals, the process that prints them)}
        consumers = {
            "csnd": (Arrivals(sub.stdout.fileno(), csnd_commit_time, "csnd"), "csnd subscribe"),
            "pg_recvlogical": (
                Arrivals(twin.stdout.fileno(), test_decoding_commit_time, "pg_recvlogical"),
                "pg_recvlogical",
            ),
        }
        if floor is not None:
            consumers["floor"] = floor
        # start-up is not a commit's latency: measure once one transaction came through each
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            c.execute("INSERT INTO lat (v) VALUES (0)")
        for a, what in consumers.values():
            if not a.wait_for(1, 120):
                raise RuntimeError(f"{what} printed no first transaction within 120 s: {svc.stderr()[-500:]}")
        watch = Watch(svc.proc.pid)
        watch.sample()
        for rate in rates:
            print(f"bench latency: {rate:,}/s for {seconds:.0f} s ...", file=sys.stderr, flush=True)
            base = {name: a.lines for name, (a, _) in consumers.items()}
            pids = {"csnd serve": svc.proc.pid, "csnd subscribe": sub.pid, "pg_recvlogical": twin.pid}
            pids.update(floor_pids)
            watch.sample()
            pids.update({p.label: pid for pid, p in watch.procs.items() if p.label.startswith("decoder")})
            pids.update(_walsenders(server))
            cpu = CpuWindow(pids, named=("csnd serve", "csnd subscribe") if thread_names else ())
            window_start = time.time()
            before = scrape(svc.http)
            synced_before = fsyncs(svc.http)
            spy = profile_serve(svc.proc.pid, seconds, profile, rate) if profile else None
            committed = pgbench(server, work, rate, seconds)
            window_end = time.time()
            if spy is not None:
                spy.wait()
            got = {
                name: a.wait_for(base[name] + committed, DRAIN_TIMEOUT_S)
                for name, (a, _) in consumers.items()
            }
            after = scrape(svc.http)
            synced = fsyncs(svc.http) - synced_before
            row: dict[str, Any] = {
                "rate": rate,
                "committed": committed,
                "cpu_us_per_txn": cpu.per_txn_us(committed),
                "wakeups_per_txn": cpu.wakeups_per_txn(committed),
                "subscriber_threads": cpu.threads_per_txn("csnd subscribe", committed),
                "serve_threads": cpu.threads_per_txn("csnd serve", committed),
            }
            for name, (a, _) in consumers.items():
                row[name] = arrival_figures(a, base[name], committed, got[name])
            row["stages"] = {
                name: {
                    "p50_ms_at_most": _ms(bucket_quantile(before[name], after[name], 0.5)),
                    "p99_ms_at_most": _ms(bucket_quantile(before[name], after[name], 0.99)),
                }
                for name in STAGES
            }
            row["group_commits"] = group_commits(row, synced)
            results["rates"].append(row)
            windows.append((row, window_start, window_end))
            print(f"bench latency: {json.dumps(_brief(row))}", file=sys.stderr, flush=True)
    finally:
        end_all(procs)
        if svc is not None:
            svc.stop()
        server.stop("immediate")
        if stages and os.path.exists(stage_file):  # (written by csnd serve as it stopped)
            with open(stage_file, encoding="utf-8") as f:
                samples = json.load(f)
            for row, start, end in windows:
                row["stage_trace"] = stage_figures(samples, start, end)
                print(f"bench latency: {row['rate']:,}/s stages: {_brief_stages(row)}", file=sys.stderr)
        shutil.rmtree(server.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    results["loadavg_at_end"] = os.getloadavg()
    return results


# --- the push floor ---------------------------------------------------------------------------


def start_floor(
    server: PgServer, kind: str, work: str, procs: list[subprocess.Popen[Any]], work_us: float = 0.0
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The push floor (bench.pushfloor): pg_recvlogical on slot `floor` piped into the relay, and
    the relay's client, whose stdout is read for timing: (relay, client).  Every process is added
    to `procs`.  `work_us`: the relay's CPU a transaction (its --work-us)."""
    read_end, write_end = os.pipe()
    try:
        procs.append(recvlogical(server, "floor", write_end))
        relay = subprocess.Popen(
            [sys.executable, "-m", "bench.pushfloor", "relay", kind]
            + ([os.path.join(work, "floor.log")] if kind in WRITES_A_FILE else [])
            + (["--work-us", str(work_us)] if work_us else []),
            stdin=read_end,
            stderr=subprocess.PIPE,
        )
        procs.append(relay)
    finally:
        os.close(read_end)
        os.close(write_end)
    assert relay.stderr is not None
    port = relay.stderr.readline().strip().decode()
    if not port.isdigit():
        raise RuntimeError(f"the push floor's relay did not start: {port!r}")
    env = dict(os.environ)
    if kind != "aio":  # (the poller `csnd subscribe` chooses: csnd.consumers.grpcpoll)
        experiments = experiments_for(env, metadata.version("grpcio"))
        if experiments is not None:
            env[EXPERIMENTS] = experiments
    client = subprocess.Popen(
        [sys.executable, "-m", "bench.pushfloor", "client", kind, port], stdout=subprocess.PIPE, env=env
    )
    procs.append(client)
    return relay, client


def run_floor(rates: list[int], seconds: float, kind: str, work_us: float = 0.0) -> dict[str, Any]:
    """The push floor instead of csnd, against the twin on the same load at the same time."""
    work = tempfile.mkdtemp(prefix="csnd-latency-floor-")
    server = start_server()
    procs: list[subprocess.Popen[Any]] = []
    results: dict[str, Any] = {
        "floor": kind,
        "work_us": work_us,
        "rates": [],
        "clients": CLIENTS,
        "seconds": seconds,
    }
    try:
        setup(server, ours=("floor", "test_decoding"))
        twin = recvlogical(server, "twin", subprocess.PIPE)
        procs.append(twin)
        relay, client = start_floor(server, kind, work, procs, work_us)
        assert twin.stdout is not None and client.stdout is not None
        consumers = {
            "floor": Arrivals(client.stdout.fileno(), test_decoding_commit_time, "floor"),
            "pg_recvlogical": Arrivals(twin.stdout.fileno(), test_decoding_commit_time, "pg_recvlogical"),
        }
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            c.execute("INSERT INTO lat (v) VALUES (0)")
        for name, a in consumers.items():
            if not a.wait_for(1, 120):
                raise RuntimeError(f"the {name} consumer printed no first transaction within 120 s")
        pids = {"floor relay": relay.pid, "floor client": client.pid, "pg_recvlogical": twin.pid}
        for rate in rates:
            print(
                f"bench latency: floor ({floor_name(results)}), {rate:,}/s for {seconds:.0f} s ...",
                file=sys.stderr,
                flush=True,
            )
            base = {name: a.lines for name, a in consumers.items()}
            cpu = CpuWindow(pids)
            committed = pgbench(server, work, rate, seconds)
            row: dict[str, Any] = {
                "rate": rate,
                "committed": committed,
                "cpu_us_per_txn": cpu.per_txn_us(committed),
                "wakeups_per_txn": cpu.wakeups_per_txn(committed),
            }
            for name, a in consumers.items():
                got = a.wait_for(base[name] + committed, DRAIN_TIMEOUT_S)
                row[name] = arrival_figures(a, base[name], committed, got)
            results["rates"].append(row)
    finally:
        end_all(procs)
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    results["loadavg_at_end"] = os.getloadavg()
    return results


def floor_name(results: dict[str, Any]) -> str:
    """The floor's kind, and its work a transaction when it has any: "handoff, 200 µs a transaction"."""
    kind: str = results["floor"]
    work_us = results.get("work_us") or 0
    return kind + (f", {work_us:g} µs a transaction" if work_us else "")


def floor_markdown(results: dict[str, Any]) -> str:
    out = [
        f"| rate (pgbench -R, 4 clients) | committed | push floor ({floor_name(results)}) p50 / p99 ms "
        "(delivered) | "
        "pg_recvlogical p50 / p99 ms (delivered) | the goal's p99 bar, max(2x, 2 ms) | floor within it, "
        "all delivered | wake-ups a transaction: relay / client / `pg_recvlogical` | CPU µs a transaction: "
        "relay / client |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results["rates"]:
        f, p = r["floor"], r["pg_recvlogical"]
        wakes, cpu = r["wakeups_per_txn"], r["cpu_us_per_txn"]
        bar = bar_ms(p)
        within = within_bar(f, p)
        out.append(
            f"| {r['rate']:,}/s | {r['committed']:,} | {f['p50_ms']:.2f} / {f['p99_ms']:.2f} ({f['delivered']:,}) "
            f"| {p['p50_ms']:.2f} / {p['p99_ms']:.2f} ({p['delivered']:,}) | {bar:.2f} | "
            f"{'yes' if within else 'no'} | "
            + " / ".join(f"{wakes[k]:.1f}" for k in ("floor relay", "floor client", "pg_recvlogical"))
            + f" | {cpu['floor relay']:.0f} / {cpu['floor client']:.0f} |"
        )
    return "\n".join(out) + "\n"


def _brief_stages(row: dict[str, Any]) -> str:
    got = row.get("stage_trace", {})
    parts = [f"{k} {v['p50_ms']:.2f}/{v['p90_ms']:.2f}/{v['p99_ms']:.2f}" for k, v in got.items()]
    c, p = row["csnd"], row["pg_recvlogical"]
    parts.append(f"subscriber {c['p50_ms']:.2f}/-/{c['p99_ms']:.2f}")
    parts.append(f"pg_recvlogical {p['p50_ms']:.2f}/-/{p['p99_ms']:.2f}")
    return "; ".join(parts) + " (ms after commit, p50/p90/p99)"


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "rate": row["rate"],
        "committed": row["committed"],
        **{
            k: f"{row[k]['p50_ms']:.1f}/{row[k]['p99_ms']:.1f}/{row[k]['max_ms']:.1f} ms, {row[k]['delivered']}"
            for k in ("csnd", "pg_recvlogical", "floor")
            if k in row
        },
        "stages": {k: (v["p50_ms_at_most"], v["p99_ms_at_most"]) for k, v in row["stages"].items()},
        "group commits a txn, sync thread wake-ups a group": (
            round(row["group_commits"]["per_txn"], 2),
            row["group_commits"]["sync_wakeups_per_group"],
        ),
        "subscribe us/wakeups a txn": (
            round(row["cpu_us_per_txn"]["csnd subscribe"]),
            round(row["wakeups_per_txn"]["csnd subscribe"], 2),
        ),
    }


# --- the table --------------------------------------------------------------------------------


def bar_ms(yardstick: dict[str, Any]) -> float:
    """The goal's p99 bar against a yardstick's figures: max(2 x its p99, 2 ms)."""
    return max(2 * float(yardstick["p99_ms"]), 2.0)


def within_bar(figures: dict[str, Any], yardstick: dict[str, Any]) -> bool:
    """Every transaction delivered, and the p99 at most the bar against `yardstick` (`bar_ms`)."""
    return bool(figures["all_delivered"]) and figures["p99_ms"] <= bar_ms(yardstick)


def goal_met(row: dict[str, Any]) -> bool:
    """The issue's bar: csnd's p99 <= max(2 x pg_recvlogical's p99, 2 ms), every transaction delivered."""
    return within_bar(row["csnd"], row["pg_recvlogical"])


def within_floor(row: dict[str, Any]) -> bool:
    """The same bar with the push floor beside it as the yardstick: csnd's p99 <= max(2 x the floor's, 2 ms)."""
    return within_bar(row["csnd"], row["floor"])


def _stage(v: float | None) -> str:
    return "-" if v is None else f"<= {v:g}"


def table(results: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for r in results["rates"]:
        c, p, s = r["csnd"], r["pg_recvlogical"], r["stages"]
        dur, sent = s["csnd_commit_to_durable_seconds"], s["csnd_commit_to_sent_seconds"]
        cpu = r["cpu_us_per_txn"]
        wakes = r.get("wakeups_per_txn", {})
        csnd_cpu = sum(v for k, v in cpu.items() if k.startswith(("csnd", "decoder")))
        rows.append(
            (
                f"{r['rate']:,}/s",
                f"{r['committed']:,}",
                f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f} ({c['delivered']:,})",
                f"{p['p50_ms']:.1f} / {p['p99_ms']:.1f} ({p['delivered']:,})",
                "yes" if goal_met(r) else "no",
                f"{_stage(dur['p50_ms_at_most'])} / {_stage(dur['p99_ms_at_most'])}",
                f"{_stage(sent['p50_ms_at_most'])} / {_stage(sent['p99_ms_at_most'])}",
                f"{csnd_cpu:.0f} ({cpu.get('csnd subscribe', 0.0):.0f})",
                " / ".join(
                    f"{wakes.get(k, 0.0):.1f}" for k in ("csnd serve", "csnd subscribe", "pg_recvlogical")
                ),
            )
        )
        if "floor" in r:  # (a push floor beside: two more columns, after the others)
            f = r["floor"]
            rows[-1] += (
                f"{f['p50_ms']:.1f} / {f['p99_ms']:.1f} ({f['delivered']:,})",
                "yes" if within_floor(r) else "no",
            )
    return rows


def markdown(results: dict[str, Any]) -> str:
    out = [
        "| rate (pgbench -R, 4 clients) | committed | csnd p50 / p99 ms (delivered) | pg_recvlogical p50 / p99 ms "
        "(delivered) | p99 within max(2x, 2 ms), all delivered | commit to durable p50 / p99 ms (bucket) | "
        "commit to sent p50 / p99 ms (bucket) | csnd CPU µs per transaction (of it `csnd subscribe`) | "
        "wake-ups per transaction: `csnd serve` / `csnd subscribe` / `pg_recvlogical` |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    beside = results.get("beside_floor")
    if beside:
        out[0] += (
            f" push floor ({beside}) p50 / p99 ms (delivered) | csnd's p99 within max(2x the floor's, 2 ms), "
            "all delivered |"
        )
        out[1] += " --- | --- |"
    out += ["| " + " | ".join(r) + " |" for r in table(results)]
    traced = [r for r in results["rates"] if r.get("stage_trace")]
    if traced:
        out += [
            "",
            "| rate | "
            + " | ".join(f"{s} p50 / p90 / p99 ms" for s in TRACED_STAGES)
            + " | subscriber p50 / p99 ms | pg_recvlogical p50 / p99 ms |",
            "| --- |" + " --- |" * (len(TRACED_STAGES) + 2),
        ]
        for r in traced:
            st = r["stage_trace"]
            cells = [
                f"{st[s]['p50_ms']:.2f} / {st[s]['p90_ms']:.2f} / {st[s]['p99_ms']:.2f}" if s in st else "-"
                for s in TRACED_STAGES
            ]
            c, p = r["csnd"], r["pg_recvlogical"]
            cells += [f"{c['p50_ms']:.2f} / {c['p99_ms']:.2f}", f"{p['p50_ms']:.2f} / {p['p99_ms']:.2f}"]
            out.append(f"| {r['rate']:,}/s | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help=f"{SMALL_SECONDS:g} s a rate instead of {SECONDS:g}")
    p.add_argument("--rates", default=",".join(map(str, RATES)), help="comma-separated transactions/s")
    p.add_argument(
        "--seconds", type=float, default=None, help=f"seconds of load a rate (default {SECONDS:g})"
    )
    p.add_argument("--decoders", type=int, default=None, help="csnd serve --decoders (default: its own)")
    p.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="seconds: csnd's processes run with this sys.setswitchinterval (default: csnd.cli's)",
    )
    p.add_argument(
        "--thread-names",
        action="store_true",
        help="name csnd's Python threads in the per-thread figures (py-spy dump, which pauses them once)",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="py-spy `csnd serve` over each rate's load: collapsed on-CPU stacks by thread, DIR/serve-RATE.txt",
    )
    p.add_argument(
        "--stages",
        action="store_true",
        help="time each transaction at each stage inside csnd serve (bench/stagetrace): p50/p90/p99 a stage",
    )
    p.add_argument(
        "--floor",
        choices=KINDS,
        default=None,
        help="time the push floor instead of csnd (bench/pushfloor.py): pg_recvlogical piped into a relay "
        "that only pushes the transactions over gRPC as they complete, to a client that prints them; sync: "
        "threads, as csnd's changefeed; durable: the same, each message fsynced to a file before it is sent; "
        "handoff: durable, a thread of its own reading and syncing and handing each message to the stream's "
        "thread, as csnd's changefeed is fed; aio: grpc.aio",
    )
    p.add_argument(
        "--beside-floor",
        choices=("durable", "handoff"),
        default=None,
        help="also run the push floor of this kind on the same load at the same time, a third consumer, "
        "and say whether csnd's p99 is within max(2x the floor's, 2 ms): the goal with a yardstick that, as "
        "csnd, makes each transaction durable before it is sent",
    )
    p.add_argument(
        "--floor-work-us",
        type=float,
        default=0.0,
        metavar="US",
        help="with --floor sync|durable|handoff: the relay spins this many µs of Python CPU a transaction "
        "(the GIL held) before it writes it, standing in for csnd's own work on it",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from bench.common import out_path

    a = parse_args(sys.argv[1:] if argv is None else argv)
    seconds = a.seconds if a.seconds is not None else SMALL_SECONDS if a.small else SECONDS
    if a.floor is not None and a.beside_floor is not None:
        raise SystemExit(
            "bench latency: --floor runs a floor instead of csnd, --beside-floor beside it: one of them"
        )
    if a.floor is not None:
        if a.floor_work_us and a.floor == "aio":
            raise SystemExit("bench latency: --floor-work-us is for --floor sync, durable and handoff")
        results = run_floor([int(x) for x in a.rates.split(",")], seconds, a.floor, a.floor_work_us)
        name = f"latency-floor-{a.floor}" + (f"-{a.floor_work_us:g}us" if a.floor_work_us else "")
        with open(out_path(f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2, default=str)
        text = floor_markdown(results)
        with open(out_path(f"{name}.md"), "w", encoding="utf-8") as f:
            f.write(text)
        print(text, end="")
        return results
    results = run(
        [int(x) for x in a.rates.split(",")],
        seconds,
        a.decoders,
        a.switch_interval,
        a.thread_names,
        a.profile,
        a.stages,
        a.beside_floor,
    )
    with open(out_path("latency.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    text = markdown(results)
    with open(out_path("latency.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return results


if __name__ == "__main__":
    main()
