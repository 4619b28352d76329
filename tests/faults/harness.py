"""One fault-injection run: a GTM cluster under steady writers, `csnd serve`, two subscribers, one fault.

    writers (3 processes, forked) ──► dn1 dn2 dn3 ◄── ticker thread (tick <gtm current>, flushed)
       │ committed lines        │ │ │  ▲
       ▼                        │ │ │  └─ witness slots (test_decoding), read at the end
     OUT.wN                 csnd serve (subprocess; a source may go through a Proxy)
                                │ changelog DIR, fresh per run
                 ┌──────────────┴──────────────┐
        csnd subscribe (reconnects)   csnd subscribe --name fx
                 └──── lines ─► checked against the witness

    sampler thread: every 50 ms each slot's confirmed_flush_lsn, then the
    changelog's newest durable CSN (Status): no reading may show a slot
    confirmed past a transaction the changelog does not hold yet.

A run: slots (csnd's and the witness's, fresh names), ticker, service,
subscribers, writers; once the stream flows, a moment drawn from the seed,
then the fault (the caller's function); the writers go on a little, stop;
`csnd gtm recover` resolves whatever a dead writer left; everything drains
within bounded waits (a stall is a failure that shows the service's Status);
then every invariant of docs/design.md section 6 is checked (`witness.check_*`).
Recovery time: from the fault to the moment the changelog and both
subscribers hold a transaction committed after it struck.
"""

from __future__ import annotations

import contextlib
import functools
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Final, Protocol

import psycopg

from csnd.core.ids import lsn_from_str
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.recovery import recover_in_doubt
from csnd.gtm.ticker import Ticker
from csnd.testing.cluster import LocalCluster
from tests.faults import witness as wit
from tests.faults import writer
from tests.fixtures.proxy import Proxy
from tests.service.servekit import CSND, Served, start_serve

# The black-holed source (the replication-black-hole class) gives a silent connection
# up after 3 s (default 60), and its walsender ends the old one after 5 s, so a run
# recovers in seconds, not minutes.
BLACK_HOLE_PARAMS: Final = "&receive_timeout=3&options=-c%20wal_sender_timeout%3D5s"

# Writers fork from one server that has imported them: a fresh interpreter
# per writer would cost each run seconds of start-up on a busy machine.
_FORK: Final = mp.get_context("forkserver")
_FORK.set_forkserver_preload(["tests.faults.writer"])
WRITERS: Final = 3
WRITER_RATE: Final = 40.0  # transactions a second per writer
AFTER_FAULT_S: Final = 1.5  # writers go on this long after the fault
DRAIN_S: Final = 60.0  # the longest any drain step may take; longer is a stall
PUBLICATION: Final = "fx_pub"

SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS fx_acct (id int PRIMARY KEY, balance bigint NOT NULL, note text, doc text)",
    "ALTER TABLE fx_acct ALTER COLUMN doc SET STORAGE EXTERNAL",
    "CREATE TABLE IF NOT EXISTS fx_ledger (gid text, seq int, amount bigint NOT NULL, note text, "
    "PRIMARY KEY (gid, seq))",
    "CREATE TABLE IF NOT EXISTS fx_full (id int PRIMARY KEY, v text)",
    "ALTER TABLE fx_full REPLICA IDENTITY FULL",
    "CREATE TABLE IF NOT EXISTS fx_poison (k int, CONSTRAINT fx_poison_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
    "CREATE EXTENSION IF NOT EXISTS pg_walinspect",
)


def setup_cluster(cluster: LocalCluster) -> None:
    for url in cluster.urls().values():
        with psycopg.connect(url, autocommit=True) as c:
            for ddl in SCHEMA:
                c.execute(ddl.encode())
            if (
                c.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone()
                is None
            ):
                c.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {', '.join(wit.TABLES)}".encode())


class Stall(AssertionError):
    """A drain step did not finish within DRAIN_S."""


class Consumer(Protocol):
    """A consumer a class adds beside the two subscribers (the Spark driver's sinks): drained and checked too."""

    who: str
    drain_s: float  # how long it may take to reach the last transaction (a drain step's bound)

    def last_csn(self) -> int:
        """The csn it holds every transaction through (0: none yet)."""
        ...

    def check(self, want: list[wit.Txn], v: wit.Verdict) -> None:
        """Stops it and checks what it holds against the witness into `v`."""
        ...

    def close(self) -> None:
        """Whatever of it still runs goes."""
        ...


def wait(
    cond: Callable[[], Any],
    what: str,
    diagnose: Callable[[], Any],
    seconds: float = DRAIN_S,
    *,
    fail: bool = True,
) -> Any:
    """Until `cond()` is truthy; after `seconds`, Stall (or None with fail=False)."""
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(Exception):
            value = cond()
            if value:
                return value
        if time.monotonic() > deadline:
            if not fail:
                return None
            raise Stall(f"stalled: {seconds:.0f}s waiting for {what}; {diagnose()}")
        time.sleep(0.1)


def http_status(served: Served, timeout: float = 5) -> dict[str, Any]:
    """The service's Status document (no waiting on a service that is gone: that raises)."""
    assert served.http is not None
    with urllib.request.urlopen(served.http + "api/status", timeout=timeout) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


def last_csn(path: Path) -> int:
    """The csn of the last complete line of a subscriber's output (0 if none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            tail = f.read()
    except OSError:
        return 0
    lines = tail.split(b"\n")[:-1]  # (whatever follows the last newline is incomplete)
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            return int(json.loads(line)["csn"])
    return 0


@dataclass
class Subscriber:
    """`csnd subscribe` writing to a file; killed and restarted by the subscriber fault."""

    address: str
    out: Path
    name: str | None
    proc: subprocess.Popen[bytes] | None = None
    starts: list[str] = field(default_factory=list)  # the --from-csn / --name of each start

    def start(self, *args: str) -> None:
        cmd = [*CSND, "subscribe", self.address, *args]
        if self.name:
            cmd += ["--name", self.name]
        with open(self.out, "ab") as out, open(str(self.out) + ".err", "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        self.starts.append(" ".join(args) or "-")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> tuple[int, str]:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode, Path(str(self.out) + ".err").read_text(errors="replace")[-2000:]

    def lines(self) -> list[str]:
        return [x for x in self.out.read_text().splitlines() if x.strip()]

    def cut_to(self, csn: int) -> int:
        """Keep the complete lines with csn <= `csn` (after a kill -9); returns the csn of the last kept."""
        keep: list[bytes] = []
        kept = 0
        for line in self.out.read_bytes().split(b"\n")[:-1]:
            c = int(json.loads(line)["csn"])
            if c > csn:
                break
            keep.append(line + b"\n")
            kept = c
        self.out.write_bytes(b"".join(keep))
        return kept


class Ticking:
    """The GTM's ticker beside the cluster, renewable after the GTM's server restarted."""

    def __init__(self, gtm_url: str, urls: dict[str, str]) -> None:
        self.gtm_url, self.urls = gtm_url, urls
        self.gtm: PgGtm | None = None
        self.ticker: Ticker | None = None
        self.renew()

    def renew(self) -> None:
        self.stop()
        deadline = time.monotonic() + 30
        while True:
            try:
                self.gtm = PgGtm(self.gtm_url)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.ticker = Ticker(self.gtm, self.urls, interval=0.1).start()

    def stop(self) -> None:
        if self.ticker is not None:
            self.ticker.stop()
            self.ticker = None
        if self.gtm is not None:
            with contextlib.suppress(Exception):
                self.gtm.close()
            self.gtm = None


@dataclass
class Outcome:
    fault: str
    seed: int
    detail: str = ""
    recovered: bool = False
    recovery_s: float | None = None
    lost: int = 0
    doubled: int = 0
    transactions: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.recovered and not self.problems

    def record(self) -> dict[str, Any]:
        return {
            "fault": self.fault,
            "seed": self.seed,
            "detail": self.detail,
            "recovered": self.recovered,
            "recovery_s": self.recovery_s,
            "lost": self.lost,
            "doubled": self.doubled,
            "transactions": self.transactions,
            "problems": self.problems,
        }


class Run:
    """One run of one fault class with one seed; see the module docstring."""

    def __init__(
        self,
        cluster: LocalCluster,
        tmp: Path,
        fault: str,
        seed: int,
        *,
        proxied: bool = False,
        client_proxied: bool = False,
    ) -> None:
        self.cluster = cluster
        self.tmp = tmp
        self.fault = fault
        self.seed = seed
        self.rng = random.Random(f"{fault}/{seed}")
        self.tag = f"fx_{fault}_{seed}".replace("-", "_")[:40]
        self.slot = self.tag
        self.witness_slot = self.tag + "_w"
        self.urls = cluster.urls()
        self.outcome = Outcome(fault, seed)
        self.proxies: dict[str, Proxy] = {}
        if proxied:
            node = self.rng.choice(list(self.urls))
            server = cluster.server(node)
            self.proxies[node] = Proxy("127.0.0.1", server.port)
        self.client_proxied = client_proxied
        self.client_proxy: Proxy | None = None  # between the subscribers and the service, when asked
        self.served: Served | None = None
        self.ticking: Ticking | None = None
        self.writers: list[BaseProcess] = []
        self.subs: list[Subscriber] = []
        self.readings: list[tuple[dict[str, int], int]] = []  # (confirmed LSN per node, newest CSN after)
        self.target: int | None = None  # recovered: a csn past it (committed after the fault) delivered
        self.fault_at: float | None = None
        self.recovered_at: float | None = None
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._judging = threading.Lock()  # (the sampler's recovery verdict against `remark`)
        self.log_dir = str(tmp / "changelog")
        self.writer_args: list[list[str]] = [[] for _ in range(WRITERS)]
        self.victim: tuple[str, bool] | None = None  # a killed writer's gid, and whether it must commit
        self.stopped: str | None = None  # the node whose slot a stop class took away
        self.mounts: list[str] = []  # small tmpfs mounts of the run (a disk-full class), unmounted at close
        self.serve_args: list[str] = []  # added to every `csnd serve` of the run (a class's --config)
        self.serve_env: dict[str, str] = {}  # added to its environment (the clock class's libfaketime)
        self.stderr_clean = False  # a traceback in serve's last stderr fails the run (the clock class)
        self.consumers: list[Consumer] = []  # drained and checked beside the subscribers (a class's own)
        # Witness parts consumed before the end, by node (a class that must keep its WAL from removal)
        self.early_witness: dict[str, list[tuple[str, int, wit.Local]]] = {}

    # --- set-up ---------------------------------------------------------------------------

    def sources(self) -> list[str]:
        out = []
        for node, url in self.urls.items():
            if node in self.proxies:
                url = url.replace(f":{self.cluster.server(node).port}/", f":{self.proxies[node].port}/")
            extra = (
                BLACK_HOLE_PARAMS if node in self.proxies and self.fault == "replication-black-hole" else ""
            )
            out.append(f"{node}={url}?slot={self.slot}&publication={PUBLICATION}&mode=gtm{extra}")
        return out

    def start(self) -> None:
        for url in self.urls.values():
            with psycopg.connect(url, autocommit=True) as c:
                c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (self.slot,))
                c.execute(
                    "SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (self.witness_slot,)
                )
        self.ticking = Ticking(self.cluster.gtm_url, self.urls)
        self.served = start_serve(self.sources(), self.log_dir, *self.serve_args, env=self.serve_env or None)
        address = self.served.address
        if self.client_proxied:
            host, _, port = address.rpartition(":")
            self.client_proxy = Proxy(host, int(port))
            address = f"127.0.0.1:{self.client_proxy.port}"
        self.subs = [
            Subscriber(address, self.tmp / "sub.jsonl", None),
            Subscriber(address, self.tmp / "named.jsonl", "fx"),
        ]
        for s in self.subs:
            s.start()
        for i in range(WRITERS):
            self.start_writer(i)
        self._sampler = threading.Thread(target=self._sample, name="fault-sampler", daemon=True)
        self._sampler.start()

    def small_disk(self, mib: int) -> str:
        """A tmpfs of `mib` MiB of the run's own (as root), unmounted when the run closes."""
        mnt = self.tmp / f"disk{len(self.mounts)}"
        mnt.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(mnt)], check=True)
        self.mounts.append(str(mnt))
        return str(mnt)

    def start_writer(self, index: int) -> None:
        argv = ["--gtm", self.cluster.gtm_url]
        for n, u in self.urls.items():
            argv += ["--node", f"{n}={u}"]
        argv += ["--run", self.tag.replace("_", "-"), "--index", str(index), "--seed", str(self.seed)]
        argv += ["--rate", str(WRITER_RATE), "--out", str(self.tmp / f"committed.w{index}")]
        argv += self.writer_args[index]
        proc = _FORK.Process(
            target=writer.child, args=(argv, str(self.tmp / f"writer{index}.err")), daemon=True
        )
        proc.start()
        self.writers.append(proc)

    def restart_served(self) -> None:
        assert self.served is not None
        self.served = start_serve(
            self.sources(),
            self.log_dir,
            "--listen",
            self.served.address,
            *self.serve_args,
            env=self.serve_env or None,
        )

    # --- during the run ----------------------------------------------------------------------

    def committed(self) -> list[dict[str, Any]]:
        out = []
        for i in range(WRITERS):
            p = self.tmp / f"committed.w{i}"
            if p.exists():
                for line in p.read_text().split("\n")[:-1]:
                    out.append(json.loads(line))
        return out

    def newest(self) -> int:
        assert self.served is not None
        return int(http_status(self.served)["changelog"].get("newest_csn", 0))

    def wait_flowing(self) -> None:
        """Until the changelog holds some transactions (a few, not one: the service is past its start)
        and every subscriber has printed one: a subscriber that never reached the service exits 1 by
        design (docs/design.md section 8), so a fault must not strike before each has connected."""
        wait(
            lambda: (
                self.newest() > 0
                and len(self.committed()) >= 20
                and all(last_csn(s.out) > 0 for s in self.subs)
            ),
            "the stream to flow to every subscriber",
            self.diagnose,
        )

    def wait_connected(self) -> None:
        """Until every subscriber is connected to the service (whether or not anything flows yet).

        For a fault that may itself hold the stream before anything flowed: a
        writer paused with a commit CSN taken holds every node's watermark, so
        waiting for the stream to flow first would wait for the fault."""

        served = self.served
        assert served is not None

        def connected() -> int:
            return len([c for c in http_status(served).get("consumers", []) if c.get("connected")])

        wait(lambda: connected() >= len(self.subs), "every subscriber to connect", self.diagnose)

    def pause(self, low: float, high: float) -> float:
        d = self.rng.uniform(low, high)
        time.sleep(d)
        return d

    def mark_fault(self, detail: str) -> None:
        """Call just before the fault strikes."""
        self.outcome.detail = detail
        self.target = max((r["csn"] for r in self.committed()), default=0)
        self.fault_at = time.monotonic()

    def remark(self) -> None:
        """A later fault of the same run strikes now: recovery is judged by what commits after it
        (still timed from the first fault)."""
        target = max((r["csn"] for r in self.committed()), default=0)
        with self._judging:
            self.target, self.recovered_at = target, None

    def _sample(self) -> None:
        conns: dict[str, psycopg.Connection[Any]] = {}
        while not self._stop.wait(0.05):
            try:
                confirmed: dict[str, int] = {}
                for node, url in self.urls.items():
                    c = conns.get(node)
                    if c is None or c.closed:
                        c = conns[node] = psycopg.connect(url, autocommit=True, connect_timeout=2)
                    row = c.execute(
                        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                        (self.slot,),
                    ).fetchone()
                    assert row is not None and row[0] is not None
                    confirmed[node] = lsn_from_str(row[0])
                assert self.served is not None
                newest = int(http_status(self.served, timeout=2)["changelog"].get("newest_csn", 0))
            except Exception:  # a server or the service restarting: the next round
                for c in conns.values():
                    c.close()
                conns = {}
                continue
            self.readings.append((confirmed, newest))
            with self._judging:
                target = self.target
                if (
                    self.fault_at is not None
                    and self.recovered_at is None
                    and target is not None
                    and newest > target
                    and all(last_csn(s.out) > target for s in self.subs)
                    and all(c.last_csn() > target for c in self.consumers)
                ):
                    self.recovered_at = time.monotonic()
        for c in conns.values():
            c.close()

    def diagnose(self) -> str:
        try:
            assert self.served is not None
            doc = http_status(self.served)
            nodes = [
                {
                    k: n.get(k)
                    for k in (
                        "name",
                        "state",
                        "error",
                        "watermark_csn",
                        "stuck",
                        "confirmed_lsn",
                        "waiting_committing",
                        "waiting_commit",
                        "waiting_merge",
                        "restarts",
                    )
                }
                for n in doc["nodes"]
            ]
            return f"changelog {doc['changelog'].get('newest_csn')}; nodes {nodes}; consumers {doc.get('consumers')}"
        except Exception as e:
            return f"no status: {e}"

    # --- the end ------------------------------------------------------------------------------

    def stop_writers(self) -> None:
        for w in self.writers:
            if w.is_alive():
                w.terminate()  # (SIGTERM: it finishes the transaction in hand)
        for w in self.writers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
                w.join()

    def recover(self, cli: bool = False) -> str:
        """Resolve what dead writers left in doubt: `csnd gtm recover` itself, or its function in-process."""
        if cli:
            cmd = [*CSND, "gtm", "recover", "--gtm", self.cluster.gtm_url, "--wait", "5"]
            for n, u in self.urls.items():
                cmd += ["--node", f"{n}={u}"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            return r.stderr.strip()
        conns = {n: psycopg.connect(u, autocommit=True, connect_timeout=5) for n, u in self.urls.items()}
        try:
            with PgGtm(self.cluster.gtm_url) as gtm:
                return "recovery: " + recover_in_doubt(conns, gtm, settle=5).summary()
        finally:
            for c in conns.values():
                c.close()

    def drain_and_check(self) -> Outcome:
        o = self.outcome
        time.sleep(AFTER_FAULT_S)
        self.stop_writers()
        recovery = self.recover()
        assert self.served is not None
        want = wit.expected(wit.read_witness(self.urls, self.witness_slot, self.early_witness))
        o.transactions = len(want)
        top = max((t.csn for t in want), default=0)
        try:
            wait(lambda: self.newest() >= top, f"the changelog to reach csn {top}", self.diagnose)
            for sub in self.subs:
                wait(
                    functools.partial(_reached, sub.out, top),
                    f"subscriber {sub.name or '-'} to reach csn {top}",
                    self.diagnose,
                )
            for consumer in self.consumers:
                wait(
                    functools.partial(lambda c: c.last_csn() >= top, consumer),
                    f"{consumer.who} to reach csn {top}",
                    self.diagnose,
                    consumer.drain_s,
                )
            ends = {n: max((t.nodes[n].end_lsn for t in want if n in t.nodes), default=0) for n in self.urls}
            wait(
                lambda: all(self.readings and self.readings[-1][0][n] >= e for n, e in ends.items()),
                "every slot confirmed past its node's last commit",
                self.diagnose,
            )
            # (the sampler takes its readings every 50 ms: let it see the state the waits just saw)
            wait(
                lambda: self.recovered_at is not None,
                "the sampler to see the recovery",
                self.diagnose,
                5.0,
                fail=False,
            )
            o.recovered = self.fault_at is not None and self.recovered_at is not None
            if self.fault_at is not None and self.recovered_at is not None:
                o.recovery_s = round(self.recovered_at - self.fault_at, 2)
        except Stall as e:
            o.problems.append(str(e))
            if self.served.proc.poll() is not None:  # (first: the lost transactions it explains follow)
                code, err = self.served.terminate()
                (self.tmp / "serve.err").write_text(err)
                o.problems.append(f"csnd serve had exited {code} during the run: {err[-1500:]}")
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        v = wit.Verdict()
        for s in self.subs:
            code, err = s.stop()
            if code not in (0, -signal.SIGINT, 130):
                v.add(f"subscriber {s.name or '-'} exited {code}: {err}")
            wit.check_stream(f"subscriber {s.name or '-'}", s.lines(), want, v)
        for consumer in self.consumers:
            consumer.check(want, v)
        wit.check_writers(self.committed(), want, v)
        if self.victim is not None:
            gid, commits = self.victim
            if (gid in {t.gid for t in want}) != commits:
                v.add(f"the killed writer's {gid} was {'not ' if commits else ''}committed by recovery")
        self.check_slots(want, v)
        code, err = self.served.terminate()
        if code != 0:
            v.add(f"csnd serve exited {code} on SIGTERM: {err[-1500:]}")
        if self.stderr_clean and "Traceback" in err:
            v.add(f"a traceback in csnd serve's stderr: {err[-3000:]}")
        o.lost = len(set(v.lost))
        # (per consumer; one doubled anywhere counts)
        o.doubled = max(len(v.doubled) // (len(self.subs) + len(self.consumers) or 1), bool(v.doubled))
        o.problems += v.problems
        if o.problems:
            o.problems.append(f"recovery: {recovery}")
        return o

    def check_clear_stop(self) -> Outcome:
        """The end of a class whose correct outcome is a clear stop (a slot gone: a gap would follow).

        Recovered means: the service ends by itself, exit status 1, with one
        error line naming the node and the slot; a restart over its changelog
        refuses before it is ready, naming them too; and what each subscriber
        printed is a gapless prefix of the witness -- every transaction up to
        its last one, once, whole (none missing the stopped node's part), in
        order.  Lost counts a transaction missing inside that prefix; what
        committed after the stop is undelivered by design, and only counted in
        the detail."""
        o = self.outcome
        node, served = self.stopped, self.served
        assert node is not None and served is not None and self.fault_at is not None
        time.sleep(AFTER_FAULT_S)
        self.stop_writers()
        recovery = self.recover()
        stop_line = ""
        try:
            served.proc.wait(timeout=DRAIN_S)
            ended = time.monotonic()
            _out, err = served.proc.communicate(timeout=30)
            errors = [ln for ln in err.splitlines() if ln.startswith("csnd serve: error:")]
            if served.proc.returncode != 1 or len(errors) != 1:
                o.problems.append(
                    f"csnd serve exited {served.proc.returncode} with errors {errors}: {err[-1500:]}"
                )
            else:
                stop_line = errors[0]
                if f"node {node}" not in stop_line or self.slot not in stop_line:
                    o.problems.append(
                        f"the service's error does not name node {node} and slot {self.slot}: {stop_line}"
                    )
            o.recovery_s = round(ended - self.fault_at, 2)
        except subprocess.TimeoutExpired:
            o.problems.append(
                f"stalled: csnd serve still runs {DRAIN_S:.0f}s after {node}'s slot {self.slot} went "
                f"(a reconnect loop hides the gap); {self.diagnose()}"
            )
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join()
        if not o.problems:
            try:
                start_serve(self.sources(), self.log_dir, *self.serve_args).kill()
                o.problems.append(
                    f"csnd serve restarted over the changelog without {node}'s slot {self.slot}"
                )
            except AssertionError as e:
                if f"node {node}" not in str(e) or self.slot not in str(e):
                    o.problems.append(
                        f"the refused restart does not name node {node} and slot {self.slot}: {e}"
                    )
        want = wit.expected(wit.read_witness(self.urls, self.witness_slot, self.early_witness))
        o.transactions = len(want)
        v = wit.Verdict()
        delivered = 0
        for s in self.subs:
            # Each is told why with the service's own line (DATA_LOSS), and stops on it.
            if s.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    s.proc.wait(timeout=10)
            code, err = s.stop()
            told = [ln for ln in err.splitlines() if ln.startswith("csnd subscribe: error:")]
            if code != 1 or not told or f"node {node}" not in told[-1] or self.slot not in told[-1]:
                o.problems.append(
                    f"subscriber {s.name or '-'} was not told that {node}'s slot {self.slot} went "
                    f"(exit {code}): {err[-600:]}"
                )
            lines = s.lines()
            top = max((int(json.loads(x)["csn"]) for x in lines), default=0)
            delivered = max(delivered, top)
            wit.check_stream(f"subscriber {s.name or '-'}", lines, [t for t in want if t.csn <= top], v)
        wit.check_writers(self.committed(), want, v)
        self.check_slots(want, v)
        o.lost = len(set(v.lost))
        o.doubled = len(v.doubled) // max(1, len(self.subs))
        o.problems += v.problems
        after = sum(1 for t in want if t.csn > delivered)
        o.recovered = not o.problems
        o.detail += f"; stopped in {o.recovery_s}s: {stop_line[:200]}; {after} committed after, undelivered"
        if o.problems:
            o.problems.append(f"recovery: {recovery}")
        return o

    def check_slots(self, want: list[wit.Txn], v: wit.Verdict) -> None:
        """Invariant 7: no reading shows a slot confirmed past a transaction the changelog did not hold."""
        if not self.readings:
            v.add("no slot readings were taken")
        per_node = {n: sorted((t.nodes[n].end_lsn, t.csn) for t in want if n in t.nodes) for n in self.urls}
        for confirmed, newest in self.readings:
            for node, lsn in confirmed.items():
                bad = [(end, csn) for end, csn in per_node[node] if end <= lsn and csn > newest]
                if bad:
                    v.add(
                        f"slot on {node} confirmed to {lsn:X} while the changelog's newest csn was {newest}: "
                        f"transaction csn {bad[0][1]} ending at {bad[0][0]:X} was not durable"
                    )
                    return

    def close(self) -> None:
        """Whatever is still running goes; the run's slots are dropped."""
        self._stop.set()
        for consumer in self.consumers:
            consumer.close()
        for w in self.writers:
            if w.is_alive():
                w.kill()
                w.join()
        for s in self.subs:
            if s.proc is not None and s.proc.poll() is None:
                s.kill()
        if self.served is not None and self.served.proc.poll() is None:
            self.served.kill()
        if self.ticking is not None:
            self.ticking.stop()
        for p in [*self.proxies.values(), *([self.client_proxy] if self.client_proxy else [])]:
            p.close()
        with contextlib.suppress(Exception):  # (a killed writer's prepared transaction must not hold rows)
            self.recover()
        for url in self.urls.values():
            drop_slots(url, (self.slot, self.witness_slot))
        for mnt in self.mounts:
            if subprocess.run(["umount", mnt], check=False).returncode != 0:
                subprocess.run(["umount", "-l", mnt], check=False)


def drop_slots(url: str, slots: tuple[str, ...]) -> None:
    deadline = time.monotonic() + 30
    with psycopg.connect(url, autocommit=True) as c:
        while True:
            rows = c.execute(
                "SELECT slot_name, active_pid FROM pg_replication_slots WHERE slot_name = ANY(%s)",
                (list(slots),),
            ).fetchall()
            for slot, pid in rows:
                if pid is not None:
                    c.execute("SELECT pg_terminate_backend(%s)", (pid,))
                with contextlib.suppress(psycopg.Error):
                    c.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            if not rows or time.monotonic() > deadline:
                return
            time.sleep(0.1)


def _reached(path: Path, csn: int) -> bool:
    return last_csn(path) >= csn


def _repo() -> str:
    return str(Path(__file__).resolve().parents[2])


@contextlib.contextmanager
def running(cluster: LocalCluster, tmp: Path, fault: str, seed: int, **kw: Any) -> Iterator[Run]:
    run = Run(cluster, tmp, fault, seed, **kw)
    try:
        yield run
    finally:
        run.close()
