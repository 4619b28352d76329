"""The fault suite's cluster, run count and summary table.

`CSND_FAULT_RUNS` (default 1) is how many seeds each fault class runs; `make
test` runs the default, `make faults` raises it.  Every run appends its
outcome to `faults-out/runs.jsonl` (one JSON line, one write: the xdist
workers share the file); at the end of the session the controller prints the
table (fault, runs, recovered, lost, doubled, longest recovery) and writes it
to `faults-out/summary.md`, and each failed run's evidence is in
`faults-out/<fault>-<seed>.txt`; the runs' lines move to `runs-last.jsonl`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from csnd.testing.cluster import LocalCluster, start_cluster
from tests.faults.harness import Outcome, setup_cluster

_LOADED = time.time()  # (about when the session started: this conftest is loaded before any test runs)


def runs() -> int:
    return int(os.environ.get("CSND_FAULT_RUNS", "1"))


def out_dir() -> Path:
    return Path(os.environ.get("CSND_FAULT_OUT", "faults-out"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three servers and the GTM (on dn1), kept up across the runs of a module."""
    with start_cluster(3) as c:
        setup_cluster(c)
        yield c


def record(o: Outcome, where: Path) -> None:
    """Append the run's outcome; a failed run's evidence goes to its own file."""
    d = out_dir()
    d.mkdir(parents=True, exist_ok=True)
    line = json.dumps(o.record() | {"dir": str(where), "t": time.time()}) + "\n"
    fd = os.open(d / "runs.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    if not o.ok:
        text = [f"fault {o.fault} seed {o.seed}: {o.detail}", f"files: {where}", ""]
        text += o.problems or ["did not recover"]
        (d / f"{o.fault}-{o.seed}.txt").write_text("\n".join(text) + "\n")


def table(rows: list[dict[str, Any]]) -> str:
    order: list[str] = []
    for r in rows:
        if r["fault"] not in order:
            order.append(r["fault"])
    lines = [
        "| fault | runs | recovered | lost | doubled | other failures | longest recovery (s) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in order:
        rs = [r for r in rows if r["fault"] == f]
        times = [r["recovery_s"] for r in rs if r["recovery_s"] is not None]
        other = sum(1 for r in rs if r["problems"] and not r["lost"] and not r["doubled"])
        lines.append(
            f"| {f} | {len(rs)} | {sum(1 for r in rs if r['recovered'])} | {sum(r['lost'] for r in rs)} "
            f"| {sum(r['doubled'] for r in rs)} | {other} | {max(times):.1f} |"
            if times
            else f"| {f} | {len(rs)} | 0 | {sum(r['lost'] for r in rs)} | {sum(r['doubled'] for r in rs)} "
            f"| {other} | - |"
        )
    failed = [r for r in rows if r["problems"] or not r["recovered"]]
    if failed:
        lines.append("")
        lines.append(
            "failed runs (fault, seed): " + ", ".join(f"({r['fault']}, {r['seed']})" for r in failed)
        )
    return "\n".join(lines) + "\n"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if hasattr(terminalreporter.config, "workerinput"):
        return
    path = out_dir() / "runs.jsonl"
    if not path.exists():
        return
    # (this session's runs: a session that died before its summary left its own behind)
    rows = [
        r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip()) if r["t"] >= _LOADED
    ]
    path.replace(out_dir() / "runs-last.jsonl")
    if not rows:
        return
    text = table(rows)
    (out_dir() / "summary.md").write_text(text)
    terminalreporter.section("fault injection")
    terminalreporter.write(text)
    terminalreporter.write(f"(also in {out_dir() / 'summary.md'})\n")
