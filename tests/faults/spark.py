"""The spark-kill fault class: a Spark driver reading the live stream and the Parquet export, killed -9.

    csnd serve --parquet-dir EXPORT ──► Spark driver (tests/faults/spark_job.py: python + its JVM)
         │                               query `source`: the csnd source ─► SINK/source/batch-N.jsonl
         └─ EXPORT/csn-*.parquet ──────► query `export`: file stream    ─► SINK/export/batch-N.jsonl

Two drivers are started warm when the run is set up (their JVMs start
beside the service and the writers); the first is told the service's
address once the stream flows, and killed -9 with its whole process group
at the run's seeded moment: anywhere once both queries have taken a batch,
or held inside one micro-batch of one query, before or after its sink took
it.  The second then starts both queries from their checkpoints.  After the
usual drain each sink must hold every transaction of the test_decoding
witness once, whole and exact (`witness.check_stream`), the live stream's
rows in (csn, seq) order within each micro-batch as the source promises,
and a batch Spark re-ran must hold what it held before.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from csnd.core.durable import replace_file
from tests.faults import witness as wit
from tests.faults.harness import Run, wait
from tests.faults.spark_job import QUERIES

# How long a driver may take to be warm: a JVM's start and first job, 20 s on a
# 2-core machine, over 2 minutes when other JVMs start beside it.
WARM_S: Final = 400.0
# How long the sinks may take to reach the last transaction once the writers stopped.
SINKS_DRAIN_S: Final = 300.0
# How long a warm driver may take to start its queries and take a first batch of each
# (the export cuts its first file 10 s after the first transaction).
FIRST_BATCH_S: Final = 180.0
# The moments a driver dies at: anywhere, or held inside a micro-batch before or after its sink took it.
MOMENTS: Final = ("anywhere", "before", "after")


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` is still there (zombies aside)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


class SparkDriver:
    """One driver process and its JVM, a process group of their own, started warm and told `go` later."""

    def __init__(self, tmp: Path, name: str, export: str, pause: str | None = None) -> None:
        self.name = name
        self.go_file = tmp / f"{name}.go"
        self.log = tmp / f"{name}.log"
        scratch = tmp / f"{name}-scratch"
        scratch.mkdir()
        cmd = [
            sys.executable, "-m", "tests.faults.spark_job", "--go", str(self.go_file),
            "--checkpoint", str(tmp / "spark-ck"), "--sink", str(tmp / "spark-sink"),
            "--export", export, "--local-dir", str(scratch),
        ]  # fmt: skip
        if pause:
            cmd += ["--pause", pause]
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                cmd,
                cwd=Path(__file__).resolve().parents[2],
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    def go(self, target: str) -> None:
        replace_file(str(self.go_file), target.encode())

    def said(self, text: str) -> bool:
        return text in self.log.read_text(errors="replace")

    def wait_warm(self) -> None:
        def warm() -> bool:
            self.check_alive()
            return self.said("spark_job: warm")

        wait(warm, f"Spark driver {self.name} to be warm", self.tail, WARM_S)

    def check_alive(self) -> None:
        assert self.proc.poll() is None, (
            f"Spark driver {self.name} exited {self.proc.returncode}: {self.tail()}"
        )

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(ln for ln in lines[-40:] if "WARN" not in ln)[-3000:]

    def kill(self) -> None:
        """kill -9 of the driver and its JVM (the process group), until none of them is left."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        wait(lambda: not _group_alive(self.proc.pid), f"Spark driver {self.name}'s processes to go", str, 30)


class SparkSinks:
    """The two queries' sinks as a consumer of the run: how far they got, and the check of what they hold."""

    who = "the Spark sinks"
    # (a restarted query's first batches, and then the batches it is behind, take Spark seconds each)
    drain_s = SINKS_DRAIN_S

    def __init__(self, run: Run) -> None:
        self.run = run
        self.root = run.tmp / "spark-sink"
        self.export = str(run.tmp / "export")
        self.moment = run.rng.choice(MOMENTS)
        self.pause: str | None = None
        if self.moment != "anywhere":
            # (the export cuts a file every 10 s under this load: its first batches only)
            query = run.rng.choice(QUERIES)
            batch = run.rng.randrange(0, 4 if query == "source" else 2)
            self.pause = f"{query}:{batch}:{self.moment}"
        self.first = SparkDriver(run.tmp, "spark1", self.export, self.pause)
        self.second = SparkDriver(run.tmp, "spark2", self.export)
        self.drivers = [self.first, self.second]

    def _query_csn(self, query: str) -> int:
        try:
            with open(self.root / query / "_progress.json") as f:
                return int(json.load(f)["csn"])
        except (OSError, ValueError, KeyError):
            return 0

    def last_csn(self) -> int:
        """The csn both sinks hold through (each takes its micro-batches in CSN order)."""
        return min(self._query_csn(q) for q in QUERIES)

    def strike(self) -> None:
        """The fault: the first driver killed -9 at the seeded moment, the second started on its checkpoints."""
        run = self.run
        assert run.served is not None
        self.first.go(run.served.address)

        def ready() -> bool:
            self.first.check_alive()
            if self.pause is not None:
                return (self.root / self.pause.split(":")[0] / "paused").exists()
            return self.last_csn() > 0

        wait(ready, "the Spark driver's first batches", lambda: self.first.tail(), FIRST_BATCH_S)
        d = run.pause(0.0, 2.0) if self.pause is None else 0.0
        held = (
            f"held {self.pause.replace(':', ' batch ', 1).replace(':', ' ')} its sink" if self.pause else ""
        )
        run.mark_fault(f"kill -9 the Spark driver {held or f'after {d:.2f}s'}")
        self.first.kill()
        self.second.go(run.served.address)

    def check(self, want: list[wit.Txn], v: wit.Verdict) -> None:
        for driver in self.drivers:  # (what they held is on disk whole; nothing more comes)
            driver.kill()
        for query in QUERIES:
            self._check_query(query, want, v)

    def _check_query(self, query: str, want: list[wit.Txn], v: wit.Verdict) -> None:
        who = f"Spark query {query}"
        directory = self.root / query
        names = sorted(p.name for p in directory.glob("batch-*.jsonl") if not p.name.endswith(".rerun.jsonl"))
        lines: list[str] = []
        for name in names:
            rows = _read(directory / name)
            rerun = directory / name.replace(".jsonl", ".rerun.jsonl")
            if rerun.exists() and sorted(map(_key, _read(rerun))) != sorted(map(_key, rows)):
                v.add(f"{who}: {name} re-run after the kill held other rows than the first run")
            keys = [(r["csn"], r["seq"]) for r in rows]
            if query == "source" and keys != sorted(set(keys)):
                v.add(f"{who}: {name}'s rows are not in strict (csn, seq) order: {_disorder(keys)}")
            lines += _transactions(sorted(rows, key=lambda r: (r["csn"], r["seq"])))
        wit.check_stream(who, lines, want, v)

    def close(self) -> None:
        for driver in self.drivers:
            if driver.proc.poll() is None or _group_alive(driver.proc.pid):
                with contextlib.suppress(Exception):
                    driver.kill()


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True)


def _disorder(keys: list[tuple[int, int]]) -> str:
    for a, b in itertools.pairwise(keys):
        if b <= a:
            return f"{b} after {a}"
    return "?"


def _transactions(rows: list[dict[str, Any]]) -> list[str]:
    """The rows of one micro-batch as section 7 transaction lines, one per csn, for `witness.check_stream`.

    The rows carry no commit LSN: a node's `commit_lsn` here is its last
    change's LSN, which must be before the commit's end as well."""
    out: list[dict[str, Any]] = []
    for r in rows:
        if not out or out[-1]["csn"] != r["csn"]:
            out.append({"csn": r["csn"], "gid": r["gid"], "changes": [], "nodes": {}})
        t = out[-1]
        t["changes"].append(
            {
                "node": r["node"],
                "cid": r["cid"],
                "table": r["table"],
                "op": r["op"],
                "new": json.loads(r["new"]) if r["new"] is not None else None,
                "old": json.loads(r["old"]) if r["old"] is not None else None,
                "unchanged": r["unchanged"],
            }
        )
        t["nodes"][r["node"]] = {"xid": r["xid"], "commit_lsn": r["lsn"]}
    return [json.dumps(t) for t in out]


def spark_kill_setup(run: Run) -> None:
    """The service exports Parquet too; both drivers are started, and warm before the run starts."""
    run.serve_args = [*run.serve_args, "--parquet-dir", str(run.tmp / "export")]
    sinks = SparkSinks(run)
    run.consumers.append(sinks)
    # (before the writers start: a JVM that starts for minutes must not leave the sinks minutes behind)
    for driver in sinks.drivers:
        driver.wait_warm()


def spark_kill(run: Run) -> None:
    """kill -9 of the Spark driver and its JVM at a seeded moment; the warm second one resumes."""
    run.wait_flowing()
    (sinks,) = [c for c in run.consumers if isinstance(c, SparkSinks)]
    sinks.strike()
