"""Tools of bench/load_bench.py: a process tree's memory and CPU from /proc, `csnd serve` as a subprocess.

A `Watch` samples `csnd serve` and every process under it -- found anew at
each sample through /proc/PID/task/*/children, so decoders restarted or
forked late are seen -- and any process added to it: RSS (VmRSS) with a
timestamp, and the peak (VmHWM) that the kernel keeps between samples.
CPU seconds (utime + stime) ride along, so a window's CPU share is a
difference of two samples.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar

CSND: Final = [sys.executable, "-m", "csnd.cli"]
# RSS sampling period.  Shorter: a brief peak is seen in the series too (VmHWM
# catches it anyway); longer: less CPU taken from the processes measured.
SAMPLE_S: Final = 0.5
CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
MB: Final = 1 << 20

# --- /proc ------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _mem_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in kB, None once the process is gone."""
    text = _read(f"/proc/{pid}/status")
    if text is None:
        return None
    got = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M))
    if "VmRSS" not in got:
        return None
    return int(got["VmRSS"]), int(got["VmHWM"])


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of `pid` (all its threads, living and exited), None once it is gone."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def reaped_cpu_seconds(pid: int) -> float:
    """cutime + cstime of `pid`: what its children that exited and were waited for had spent."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / CLK_TCK


def descendants(pid: int) -> list[int]:
    """Every living process under `pid` (children first, then theirs)."""
    out, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        out.append(child)
        todo += _children(child)
    return out


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        out += [int(x) for x in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]
    return out


@dataclass
class Proc:
    label: str
    samples: list[tuple[float, int, float]] = field(default_factory=list)  # (t, rss kB, cpu s)
    hwm_kb: int = 0

    def rss_mb(self) -> list[float]:
        return [kb / 1024 for _, kb, _ in self.samples]

    def cpu_between(self, t0: float, t1: float) -> float:
        inside = [c for t, _, c in self.samples if t0 <= t <= t1]
        return inside[-1] - inside[0] if len(inside) > 1 else 0.0

    def timeline(self, points: int = 6) -> str:
        """RSS at `points` evenly spaced samples, MB."""
        rss = self.rss_mb()
        if not rss:
            return "-"
        picks = (
            [rss[round(i * (len(rss) - 1) / (points - 1))] for i in range(points)]
            if len(rss) > points
            else rss
        )
        return " ".join(f"{x:.0f}" for x in picks)


class Watch:
    """Samples `csnd serve`'s process tree (found anew each round) and added processes, in a thread."""

    # The newest Watch made: what a scenario that failed half-way had seen (its caller reports it).
    latest: Watch | None = None

    def __init__(self, service_pid: int) -> None:
        Watch.latest = self
        self.service_pid = service_pid
        self.procs: dict[int, Proc] = {service_pid: Proc("csnd serve")}
        self._decoders = 0
        self.load_start: float | None = None  # RSS "at start" is the first sample after it
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="load-watch", daemon=True)

    def add(self, pid: int, label: str) -> None:
        with self._lock:
            self.procs[pid] = Proc(label)

    def start(self) -> Watch:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def _discover(self) -> None:
        todo = [self.service_pid]
        while todo:
            pid = todo.pop()
            for child in _children(pid):
                todo.append(child)
                if child in self.procs:
                    continue
                cmd = (_read(f"/proc/{child}/cmdline") or "").replace("\0", " ")
                if "resource_tracker" in cmd:
                    label = "resource tracker"
                elif pid == self.service_pid and "forkserver" in cmd:
                    label = "decoders' fork server"
                else:
                    self._decoders += 1
                    label = f"decoder {self._decoders}"
                self.procs[child] = Proc(label)

    def sample(self) -> None:
        with self._lock:
            self._discover()
            now = time.monotonic()
            for pid, p in self.procs.items():
                mem, cpu = _mem_kb(pid), cpu_seconds(pid)
                if mem is not None and cpu is not None:
                    p.samples.append((now, mem[0], cpu))
                    p.hwm_kb = max(p.hwm_kb, mem[1])

    def mark_load_start(self) -> float:
        """Now: the load begins (after start-up and warm-up); returns time.monotonic()."""
        self.sample()
        self.load_start = time.monotonic()
        return self.load_start

    def by_label(self, prefix: str) -> list[Proc]:
        return [p for p in self.procs.values() if p.label.startswith(prefix)]

    def service_tree(self) -> list[Proc]:
        return [p for p in self.procs.values() if not p.label.startswith("csnd subscribe")]


# --- the service ------------------------------------------------------------------------------


class Service:
    """`csnd serve` with its dashboard on free ports; stderr to a file."""

    def __init__(self, sources: list[str], work: str, name: str, *extra: str) -> None:
        self.changelog = os.path.join(work, f"log-{name}")
        self._err_path = os.path.join(work, f"serve-{name}.err")
        self._err = open(self._err_path, "w")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [
                *CSND,
                "serve",
                *sources,
                "--changelog",
                self.changelog,
                "--listen",
                "127.0.0.1:0",
                "--http",
                "127.0.0.1:0",
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        self.address = self.http = ""
        while not self.http:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"csnd serve exited before it was ready: {self.stderr()}")
            if line.startswith("csnd serve: listening on "):
                self.address = line.split()[-1]
            elif line.startswith("csnd serve: dashboard on "):
                self.http = line.split()[-1]

    def status(self) -> dict[str, Any]:
        """`/api/status`; a service that exited is an error naming its status and stderr."""
        try:
            with urllib.request.urlopen(self.http + "api/status", timeout=60) as r:
                doc: dict[str, Any] = json.load(r)
        except OSError:
            if self.proc.poll() is None:
                raise
            raise RuntimeError(f"csnd serve exited {self.proc.returncode}: {self.stderr()[-500:]}") from None
        return doc

    def newest_csn(self) -> int:
        return int(self.status()["changelog"].get("newest_csn", 0))

    def stderr(self) -> str:
        return _read(self._err_path) or ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._err.close()


def subscribe(address: str, *args: str, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CSND, "subscribe", address, *args], stdout=stdout, stderr=subprocess.PIPE)


def end_all(procs: list[subprocess.Popen[Any]]) -> None:
    """SIGTERM (after SIGCONT: a stopped process takes no SIGTERM) and wait; SIGKILL what lingers."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def wait_for(cond: Any, what: str, seconds: float = 300.0, every: float = 0.2) -> float:
    """Waits for `cond()`; returns when it held (time.monotonic())."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(every)
    return time.monotonic()


def lsn_text(x: int) -> str:
    return f"{x >> 32:X}/{x & 0xFFFFFFFF:X}"


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(len(xs) * 0.99))], "max": xs[-1]}


def append_times(directory: str) -> dict[int, float]:
    """csn -> the changelog record's append time (wall seconds), read from the segments of a stopped service."""
    from csnd.changelog import record as rec

    out: dict[int, float] = {}
    for name in sorted(os.listdir(directory)):
        if rec.parse_segment_name(name) is None:
            continue
        with open(os.path.join(directory, name), "rb") as f:
            buf = f.read()
        head = rec.decode_header(buf)
        if isinstance(head, str):
            raise RuntimeError(f"{name}: {head}")
        scan = rec.scan(buf, rec.SEGMENT_HEAD, head.prev_csn)
        out.update((c, t / 1e6) for c, t in zip(scan.csns, scan.times, strict=True))
    return out


_ORDER: Final = ("csnd serve", "decoders' fork server", "decoder", "resource tracker", "csnd subscribe")


def summarise(watch: Watch) -> list[dict[str, Any]]:
    """Each process: peak, RSS at the load's start (its first sample after) and at its last sample."""
    t0 = watch.load_start or 0.0
    out = []
    for p in sorted(watch.procs.values(), key=lambda p: [p.label.startswith(o) for o in _ORDER].index(True)):
        after = [kb / 1024 for t, kb, _ in p.samples if t >= t0]
        out.append(
            {
                "label": p.label,
                "peak_mb": p.hwm_kb / 1024,
                "start_mb": after[0] if after else 0.0,
                "end_mb": after[-1] if after else 0.0,
                "max_sampled_mb": max(p.rss_mb(), default=0.0),
                "timeline": p.timeline(),
                "samples_mb": [round(x, 1) for x in p.rss_mb()],
            }
        )
    return out


def add_scale_flags(p: argparse.ArgumentParser, full: Any, small: Any, helps: dict[str, str]) -> None:
    """`--small` and a flag per field of a benchmark's Scale dataclass (sizes given as numbers)."""
    p.add_argument("--small", action="store_true", help="seconds-long run at small sizes (a busy machine)")
    for f in full.__dataclass_fields__:
        p.add_argument(
            f"--{f.replace('_', '-')}",
            type=float,
            default=None,
            help=f"{helps[f]} (full {getattr(full, f)}, small {getattr(small, f)})",
        )


_Scale = TypeVar("_Scale")


def scale_from(a: argparse.Namespace, full: _Scale, small: _Scale) -> _Scale:
    """The Scale `add_scale_flags`' flags ask for: full or small, with each size given replacing its default."""
    fields = full.__dataclass_fields__  # type: ignore[attr-defined]
    given = {f: getattr(a, f) for f in fields if getattr(a, f) is not None}
    return replace(small if a.small else full, **{f: type(getattr(full, f))(v) for f, v in given.items()})  # type: ignore[type-var]
