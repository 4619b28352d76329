"""`csnd demo`: the embedded default, a newcomer's first five minutes, end to end.

    3 local PostgreSQL 15 servers ◄── csnd workload: W writer processes, distributed
    (a GaussDB-style cluster)          transactions through the shared GTM (a sequence)
            │  pgoutput, GTM mode      csnd gtm tick: watermarks for idle nodes
            ▼
    csnd serve ── changelog ──► csnd subscribe            (JSON lines, demo-out/subscribed.jsonl)
       │  dashboard       └───► Spark foreachBatch job   (current-state copy of wl_accounts)
       └► http://127.0.0.1:PORT/

It runs for `--duration` seconds (or until Ctrl-C), shows progress on the
terminal, then proves the point: every committed transaction delivered once,
in CSN order, none lost, none doubled, and the Spark copy equal to the source
tables.  Everything it started, it stops.  Where PostgreSQL cannot start, it
says so and serves a generated cluster instead (no writers, no Spark).
`--agents` runs each node's pipeline as a node agent (`csnd node`) and has
the service merge them over gRPC: the scale-out form.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any, Final

OUT_DIR = "demo-out"
CSND = [sys.executable, "-m", "csnd.cli"]
TABLE = "public.wl_accounts"


def _say(text: str) -> None:
    print(f"csnd demo: {text}", file=sys.stderr, flush=True)


class _Procs:
    """The processes the demo started; all stopped on the way out, whatever happens."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.procs: list[tuple[str, subprocess.Popen[str]]] = []
        self._stopped: set[int] = set()

    def start(
        self, name: str, cmd: list[str], *, stdout: Any = None, env: dict[str, str] | None = None
    ) -> Any:
        log = open(os.path.join(self.out_dir, f"{name}.log"), "w", encoding="utf-8")  # noqa: SIM115
        proc = subprocess.Popen(
            cmd,
            stdout=stdout if stdout is not None else log,
            stderr=log,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops them in order
        )
        self.procs.append((name, proc))
        return proc

    def check(self) -> None:
        """A process that failed on its own (not stopped by the demo) ends the demo, saying why."""
        for name, proc in self.procs:
            if proc.poll() not in (None, 0) and proc.pid not in self._stopped:
                log = os.path.join(self.out_dir, f"{name}.log")
                lines = [ln for ln in _read(log).splitlines() if ln.strip()]
                why = lines[-1] if lines else "(nothing in its log)"
                raise RuntimeError(f"{name} exited {proc.returncode}: {why} (log: {log})")

    def stop(self, proc: subprocess.Popen[str], timeout: float = 60) -> int:
        self._stopped.add(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for _name, proc in reversed(self.procs):
            self.stop(proc, timeout=30)


def _ready_line(proc: subprocess.Popen[str], prefix: str, timeout: float = 120) -> str:
    """Wait for the line starting with `prefix` on the process's stdout."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"exited {proc.wait()} before saying {prefix!r}")
        if line.startswith(prefix):
            return line[len(prefix) :].strip()
    raise RuntimeError(f"did not say {prefix!r} within {timeout:.0f}s")


def _status(http: str) -> dict[str, Any]:
    with urllib.request.urlopen(http + "api/status", timeout=10) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


def _count_lines(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _wait(cond: Any, what: str, timeout: float, check: Any = None) -> None:
    """Until `cond()`; `check()` (the demo's processes) is asked first each time: a dead service is
    its own error, not a refused connection."""
    deadline = time.monotonic() + timeout
    while True:
        if check is not None:
            check()
        if cond():
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


# The writers' count in the workload's progress lines ("... committed N (R/s) ...") and
# in its summary ("N distributed transactions committed in S s ..."), its last line.
_COMMITTED: Final = re.compile(r"committed (\d+)|(\d+) distributed transactions committed")


def _committed_so_far(workload_log: str) -> int:
    """The writers' own count, from the workload's latest progress or summary line."""
    try:
        with open(workload_log, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return 0
    found = _COMMITTED.findall(text)
    return int(next(n for n in found[-1] if n)) if found else 0


class _Delivered:
    """The writers' transactions (those with a gid) in the subscriber's output, counted as it grows.

    The subscriber also prints transactions no writer counts (the workload's
    set-up of its tables), so counting every line could show more delivered
    than committed; a line cut short is counted once it is whole.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._offset = 0

    def update(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return self.count
        whole = data.rfind(b"\n") + 1
        self.count += sum(1 for line in data[:whole].splitlines() if b'"gid": null' not in line[:80])
        self._offset += whole
        return self.count


def progress_counts(delivered: _Delivered, committed_path: str, workload_log: str) -> tuple[int, int]:
    """(committed, delivered) for the progress line, delivered never above committed.

    Delivered is read first, then the writers' lines (each written right
    after its commit; their progress line is up to a second older): a
    transaction delivered with a writer's gid was committed, so committed is
    at least what was delivered even when its writer has not written its line yet.
    """
    got = delivered.update()
    parts = glob.glob(f"{glob.escape(committed_path)}.w*")
    written = sum(_count_lines(p) for p in parts) if parts else _committed_so_far(workload_log)
    return max(written, got), got


def _progress(t0: float, http: str, workload_log: str, committed_path: str, delivered: _Delivered) -> None:
    try:
        doc = _status(http)
    except OSError:
        return
    committed, got = progress_counts(delivered, committed_path, workload_log)
    log = doc.get("changelog", {})
    lags = ", ".join(
        f"{c.get('name') or c.get('peer')} {int(c.get('lag_transactions', 0))} tx"
        for c in doc.get("consumers", [])
    )
    nodes = " ".join(f"{n['name']}:{n['state']}" for n in doc.get("nodes", []))
    _say(
        f"{time.monotonic() - t0:5.0f}s committed {committed} · "
        f"delivered {got} · changelog csn {int(log.get('newest_csn', 0))} · "
        f"lag {lags or '-'} · {nodes}"
    )


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _check_delivery(committed_path: str, subscribed_path: str) -> tuple[int, int, int, int, bool]:
    """(committed, delivered once, lost, doubled, in CSN order) of the run."""
    committed = {json.loads(x)["gid"]: json.loads(x)["csn"] for x in _read(committed_path).splitlines()}
    seen: dict[str, int] = {}
    csns = []
    for line in _read(subscribed_path).splitlines():
        txn = json.loads(line)
        csns.append(txn["csn"])
        if txn["gid"] is not None:
            seen[txn["gid"]] = seen.get(txn["gid"], 0) + 1
    once = sum(1 for g in committed if seen.get(g) == 1)
    lost = sum(1 for g in committed if g not in seen)
    doubled = sum(1 for n in seen.values() if n > 1)
    return len(committed), once, lost, doubled, all(a < b for a, b in itertools.pairwise(csns))


def _source_rows(urls: dict[str, str]) -> dict[str, Any]:
    import psycopg

    rows: dict[str, Any] = {}
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as c:
            for id_, balance, node in c.execute("SELECT id, balance, node FROM wl_accounts"):
                rows[json.dumps([id_])] = {"id": id_, "balance": balance, "node": node}  # (the stream's key)
    return rows


def _copy_rows(dsn: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        try:
            got = c.execute('SELECT key::text, row FROM "public_wl_accounts_copy"').fetchall()
        except psycopg.errors.UndefinedTable:
            return {}
    return {json.dumps(json.loads(k)): dict(r) for k, r in got}


def run_demo(args: argparse.Namespace) -> int:
    out = os.path.abspath(vars(args).get("out") or OUT_DIR)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    procs = _Procs(out)
    try:
        from csnd.testing.cluster import start_cluster

        try:
            servers = os.path.join(out, "servers")
            os.makedirs(servers)
            cluster = start_cluster(args.nodes, base_dir=servers)
        except Exception as e:  # (any reason PostgreSQL cannot run here)
            _say(
                f"PostgreSQL cannot start here ({str(e).splitlines()[0]}); serving a generated cluster instead"
            )
            return _generated(args, out, procs)
        try:
            return _live(args, out, procs, cluster)
        finally:
            procs.stop_all()
            cluster.stop()
    except KeyboardInterrupt:
        _say("interrupted; stopping what the demo started")
        return 130
    finally:
        procs.stop_all()


def _live(args: argparse.Namespace, out: str, procs: _Procs, cluster: Any) -> int:
    import psycopg

    from csnd.gtm.liveload import LoadOptions, setup

    urls = cluster.urls()
    _say(f"started {len(urls)} PostgreSQL 15 servers: " + ", ".join(f"{n} on {u}" for n, u in urls.items()))
    setup(LoadOptions(nodes=urls, gtm=cluster.gtm_url, publication="demo_pub"))
    for url in urls.values():
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("SELECT pg_create_logical_replication_slot('csnd_demo', 'pgoutput')")
    ticker = procs.start(
        "ticker",
        [*CSND, "gtm", "tick", "--gtm", cluster.gtm_url, *[f"--node={n}={u}" for n, u in urls.items()]],
    )
    live = [f"{n}={u}?slot=csnd_demo&publication=demo_pub&mode=gtm" for n, u in urls.items()]
    sources = live
    if args.agents:
        sources = []
        for n, u in urls.items():
            agent = procs.start(
                f"agent-{n}",
                [
                    *CSND,
                    "node",
                    f"{n}={u}",
                    "--slot",
                    "csnd_demo",
                    "--publication",
                    "demo_pub",
                    "--mode",
                    "gtm",
                    "--listen",
                    "127.0.0.1:0",
                    "--decoders",
                    "1",
                ],
            )
            log = os.path.join(out, f"agent-{n}.log")
            _wait(lambda log=log: "listening on" in _read(log), f"node agent {n}", 120)
            address = _read(log).split("listening on", 1)[1].split()[0]
            sources.append(f"grpc://{address}")
            _say(f"node agent {n} (pid {agent.pid}) serves its pipeline on {address}")
    serve = procs.start(
        "serve",
        [
            *CSND,
            "serve",
            *sources,
            "--changelog",
            os.path.join(out, "changelog"),
            "--decoders",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--http",
            args.http,
        ],
        stdout=subprocess.PIPE,
    )
    address = _ready_line(serve, "csnd serve: listening on ")
    http = _ready_line(serve, "csnd serve: dashboard on ")
    _say(f"csnd serve is up: changefeed on {address}; open the dashboard at {http}")
    subscribed = os.path.join(out, "subscribed.jsonl")
    with open(subscribed, "w", encoding="utf-8") as sink:
        subscriber = procs.start(
            "subscribe", [*CSND, "subscribe", address, "--name", "demo-subscriber"], stdout=sink
        )
    spark = None
    copy_dsn = cluster.urls()["dn1"]
    if not args.no_spark:
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        spark = procs.start(
            "spark",
            [
                sys.executable,
                "-m",
                "csnd.consumers.examples.current_state",
                "--target",
                address,
                "--table",
                TABLE,
                "--checkpoint",
                os.path.join(out, "spark-checkpoint"),
                "--postgres",
                copy_dsn,
            ],
            env=env,
        )
        _say(
            "a Spark foreachBatch job keeps a current-state copy of wl_accounts (its log: demo-out/spark.log)"
        )
    committed = os.path.join(out, "committed.jsonl")
    workload = procs.start(
        "workload",
        [
            *CSND,
            "workload",
            "--nodes",
            *[f"{n}={u}" for n, u in urls.items()],
            "--writers",
            str(args.writers),
            "--rate",
            str(args.rate),
            "--duration",
            str(args.duration),
            "--out",
            committed,
        ],
    )
    _say(
        f"{args.writers} writer processes commit distributed transactions for {args.duration:.0f}s (Ctrl-C ends early)"
    )
    t0 = time.monotonic()
    delivered = _Delivered(subscribed)
    try:
        while workload.poll() is None:
            procs.check()
            _progress(t0, http, os.path.join(out, "workload.log"), committed, delivered)
            time.sleep(2)
    except KeyboardInterrupt:
        _say("Ctrl-C: stopping the writers, then checking what was delivered")
        procs.stop(workload)
    if not os.path.exists(committed):
        raise RuntimeError(f"the writers failed: see {os.path.join(out, 'workload.log')}")
    newest = max((json.loads(x)["csn"] for x in _read(committed).splitlines()), default=0)
    _say(f"writers done; waiting for csn {newest} to reach every consumer")
    _wait(
        lambda: int(_status(http)["changelog"].get("newest_csn", 0)) >= newest,
        "the changelog",
        300,
        procs.check,
    )
    _wait(lambda: _last_csn(subscribed) >= newest, "the subscriber", 300, procs.check)
    spark_equal = None
    if spark is not None:
        source = _source_rows(urls)
        try:
            _wait(lambda: _copy_rows(copy_dsn) == source, "the Spark copy to catch up", 600)
            spark_equal = True
        except RuntimeError:
            spark_equal = False
    procs.stop(subscriber)
    n, once, lost, doubled, ordered = _check_delivery(committed, subscribed)
    _say("summary:")
    _say(f"  {n} distributed transactions committed by the writers")
    _say(f"  {once} delivered exactly once each{' in CSN order' if ordered else ' (NOT in CSN order)'}")
    _say(f"  {lost} lost, {doubled} doubled")
    if spark_equal is not None:
        _say(
            f"  the Spark copy of wl_accounts {'equals' if spark_equal else 'DIFFERS FROM'} the source tables"
        )
    _say(f"  dashboard was at {http}; everything the demo wrote is in {out}")
    for p in (spark, serve, ticker):
        if p is not None:
            procs.stop(p)
    good = once == n and lost == 0 and doubled == 0 and ordered and spark_equal is not False
    return 0 if good else 1


def _last_csn(path: str) -> int:
    last = 0
    with contextlib.suppress(OSError), open(path, "rb") as f:
        for line in f:
            with contextlib.suppress(ValueError):
                last = json.loads(line)["csn"]
    return last


def _generated(args: argparse.Namespace, out: str, procs: _Procs) -> int:
    """No PostgreSQL: the same service over a generated GaussDB-style cluster's recorded streams."""
    cluster = os.path.join(out, "cluster")
    subprocess.run(
        [*CSND, "generate", "--nodes", str(args.nodes), "--transactions", "2000", "--out", cluster],
        check=True,
    )
    files = [os.path.join(cluster, f"dn{i + 1}.pgstream") for i in range(args.nodes)]
    serve = procs.start(
        "serve",
        [
            *CSND,
            "serve",
            *files,
            "--changelog",
            os.path.join(out, "changelog"),
            "--listen",
            "127.0.0.1:0",
            "--http",
            args.http,
        ],
        stdout=subprocess.PIPE,
    )
    address = _ready_line(serve, "csnd serve: listening on ")
    http = _ready_line(serve, "csnd serve: dashboard on ")
    _say(f"csnd serve is up: changefeed on {address}; open the dashboard at {http}")
    subscribed = os.path.join(out, "subscribed.jsonl")
    with open(subscribed, "w", encoding="utf-8") as sink:
        sub = subprocess.run([*CSND, "subscribe", address, "--idle-timeout", "5"], stdout=sink, check=False)
    expected = _read(os.path.join(cluster, "expected.jsonl"))
    same = sub.returncode == 0 and _read(subscribed) == expected
    n = expected.count("\n")
    _say(
        f"summary: {n} transactions generated; the subscriber's output {'equals' if same else 'DIFFERS FROM'} "
        "the generator's expected output (every transaction once, in CSN order)"
    )
    procs.stop(serve)
    return 0 if same else 1


def add_demo_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the embedded default: a local cluster, the service, a subscriber and Spark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--nodes", type=int, default=3, help="PostgreSQL servers (default 3)")
    p.add_argument("--writers", type=int, default=3, help="writer processes (default 3)")
    p.add_argument(
        "--rate", type=float, default=50.0, help="transactions/s over all writers (default 50; 0: flat out)"
    )
    p.add_argument("--duration", type=float, default=60.0, metavar="SECONDS", help="how long the writers run")
    p.add_argument("--http", default="127.0.0.1:0", metavar="HOST:PORT", help="the dashboard's address")
    p.add_argument("--agents", action="store_true", help="scale-out: each node's pipeline as a node agent")
    p.add_argument(
        "--no-spark", action="store_true", help="leave the Spark job out (it takes ~30 s to start)"
    )
    p.add_argument("--out", default=OUT_DIR, metavar="DIR", help="where everything goes (default demo-out)")
