"""The clock-jump class: `csnd serve`'s wall clock set forward or back, while it runs or across a restart.

`csnd serve` runs under libfaketime (LD_PRELOAD), which offsets its wall
clock by what the file FAKETIME_TIMESTAMP_FILE holds (`+0`, then `+2d` or
`-1d`), read at every call (FAKETIME_NO_CACHE=1); the monotonic clock is
left alone (FAKETIME_DONT_FAKE_MONOTONIC=1), as a clock set by an operator
or a wrong NTP step leaves it.  The servers, the writers and the
subscribers keep the real time.

libfaketime 0.9.10 (Debian 12) breaks `time.sleep` in that mode: every
clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which CPython's sleep is,
fails EINVAL, whatever the offset (+0 too).  So a shim loaded before it
passes clock_nanosleep straight to the kernel (`_SHIM_C`, built with cc);
threading's waits, the fork server's children and gRPC behave under it
(checked with a script: a +2d and a -1d jump, a forkserver child, a gRPC
call, an Event.wait).

Retention by age is on (`--retention-hours 1`, a pass every second, small
segments: CSND_RETENTION_EVERY_S, CSND_SEGMENT_BYTES), so a service that
believed a clock set forward two days would drop every sealed segment at
once.  Besides every invariant of any class, the class checks, for a few
seconds after the jump: the changelog's oldest csn does not move (no
segment is really an hour old); /api/status, /metrics and the dashboard
answer, with no negative latency sum, lag or age; the record times in the
changelog never go backwards and never run ahead of the real time; and
serve's stderr holds no traceback at the end.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Final

from csnd.changelog import record as rec
from tests.faults.harness import Run, http_status, wait

# (Debian's libfaketime; its directory names the architecture)
FAKETIME_LIB: Final = next(
    iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), "libfaketime.so.1"
)
# (seed - 1) % 4 picks the jump and whether it happens while running or across a kill -9 and restart.
VARIANTS: Final = (("+2d", False), ("-1d", False), ("+2d", True), ("-1d", True))
SEGMENT_BYTES: Final = 64 << 10  # a run of seconds fills several
RETENTION_EVERY_S: Final = 1.0
# How long the class watches the service after the jump: several retention passes.
WATCH_S: Final = 2.5
WATCH_EVERY_S: Final = 0.25
# How far a record's time may lie past the real time it was read at (the changelog's clock
# is anchored at the wall clock of its first start; the test and the service read it apart).
AHEAD_SLACK_S: Final = 60.0

_SHIM_C: Final = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
/* libfaketime 0.9.10 fails every absolute monotonic sleep with EINVAL under
   FAKETIME_DONT_FAKE_MONOTONIC=1: the monotonic clock is not faked, so the
   kernel's own call is right. */
int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem) {
    long r = syscall(SYS_clock_nanosleep, clock, flags, req, rem);
    return r == 0 ? 0 : errno;
}
"""


def _shim(tmp: Path) -> str:
    source, lib = tmp / "sleepfix.c", tmp / "sleepfix.so"
    source.write_text(_SHIM_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(source)], check=True)
    return str(lib)


def _offset_file(run: Run) -> Path:
    return run.tmp / "faketime"


def clock_jump_setup(run: Run) -> None:
    """`csnd serve` under libfaketime (its wall clock as the offset file says), with age-based retention."""
    assert os.path.exists(FAKETIME_LIB), (
        f"{FAKETIME_LIB} is missing: install libfaketime (scripts/bootstrap.sh does, apt-get install libfaketime)"
    )
    _offset_file(run).write_text("+0\n")
    run.serve_env = {
        "LD_PRELOAD": f"{_shim(run.tmp)} {FAKETIME_LIB}",
        "FAKETIME_TIMESTAMP_FILE": str(_offset_file(run)),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "CSND_SEGMENT_BYTES": str(SEGMENT_BYTES),
        "CSND_RETENTION_EVERY_S": str(RETENTION_EVERY_S),
    }
    run.serve_args = ["--retention-hours", "1"]
    run.stderr_clean = True


def _segments(run: Run) -> list[Path]:
    return sorted(p for p in Path(run.log_dir).iterdir() if p.suffix == ".log")


def clock_jump(run: Run) -> None:
    """The wall clock of `csnd serve` jumps; nothing it holds may go, nothing it shows may fail."""
    jump, restart = VARIANTS[(run.seed - 1) % len(VARIANTS)]
    run.wait_flowing()
    wait(lambda: len(_segments(run)) >= 2, "a sealed changelog segment", run.diagnose)
    d = run.pause(0.0, 2.0)
    served = run.served
    assert served is not None
    oldest = int(http_status(served)["changelog"]["oldest_csn"])
    assert oldest > 0, f"no oldest csn before the jump: {http_status(served)['changelog']}"
    if restart:
        run.mark_fault(f"wall clock {jump} across a kill -9 and restart after {d:.2f}s")
        served.kill()
        _offset_file(run).write_text(jump + "\n")
        run.restart_served()
    else:
        run.mark_fault(f"wall clock {jump} while running after {d:.2f}s")
        _offset_file(run).write_text(jump + "\n")
    _watch(run, oldest)
    _check_record_times(run)


def _watch(run: Run, oldest: int) -> None:
    """For WATCH_S: the oldest csn stays, and status, metrics and the dashboard answer sanely."""
    served = run.served
    assert served is not None and served.http is not None
    until = time.monotonic() + WATCH_S
    looks = 0
    while time.monotonic() < until or looks == 0:
        status = http_status(served)
        now_oldest = int(status["changelog"]["oldest_csn"])
        assert now_oldest == oldest, (
            f"retention dropped records after the clock jump: the oldest csn went from {oldest} to "
            f"{now_oldest} (retention_hours 1, nothing is really that old); {status['changelog']}"
        )
        negative = _negative_spans(status, "status")
        assert not negative, f"negative spans in /api/status after the clock jump: {negative}"
        with urllib.request.urlopen(served.http + "metrics", timeout=5) as r:
            metrics = r.read().decode()
        bad = [ln for ln in metrics.splitlines() if _negative_metric(ln)]
        assert not bad, f"negative latency or age in /metrics after the clock jump: {bad[:5]}"
        with urllib.request.urlopen(served.http, timeout=5) as r:
            assert r.status == 200, f"the dashboard answered {r.status} after the clock jump"
        looks += 1
        time.sleep(WATCH_EVERY_S)  # (a look every so often for a while, not a wait for a state)
    run.outcome.detail += f"; oldest csn {oldest} kept, {looks} looks at status, metrics and dashboard"


_SPAN_WORDS: Final = ("lag", "latency", "age", "seconds", "_s")


def _negative_spans(doc: Any, where: str) -> list[str]:
    """Every number under a key that names a span (lag, latency, age, seconds) that is below 0."""
    out: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            here = f"{where}.{k}"
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if any(w in str(k) for w in _SPAN_WORDS) and v < 0:
                    out.append(f"{here} = {v}")
            else:
                out += _negative_spans(v, here)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _negative_spans(v, f"{where}[{i}]")
    return out


def _negative_metric(line: str) -> bool:
    """A latency histogram's sum, or an age or lag gauge, below 0 (a negative span observed)."""
    if line.startswith("#") or not line.strip():
        return False
    name, _, value = line.rpartition(" ")
    if not any(w in name for w in ("_seconds_sum", "lag", "age")):
        return False
    try:
        return float(value) < 0
    except ValueError:
        return False


def _check_record_times(run: Run) -> None:
    """The changelog's record times never go backwards and never run ahead of the real time."""
    real_now_us = int(time.time() * 1_000_000)
    last = 0
    count = 0
    for seg in _segments(run):
        data = seg.read_bytes()
        off = rec.SEGMENT_HEAD
        while off < len(data):
            status, csn, t, off, *_ = rec.frame_at(data, off)
            if status != rec.OK:  # (the active segment's tail, being written)
                break
            assert t >= last, f"record csn {csn} in {seg.name} has time {t} < {last} before it"
            assert t <= real_now_us + AHEAD_SLACK_S * 1_000_000, (
                f"record csn {csn} in {seg.name} is stamped {(t - real_now_us) / 3.6e9:.1f} h ahead of "
                "the real time: the changelog believed the clock set forward"
            )
            last = t
            count += 1
    run.outcome.detail += f"; {count} record times in order"
