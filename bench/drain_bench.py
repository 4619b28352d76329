"""Backlog drain: `csnd serve` -> `csnd subscribe` against `pg_recvlogical`, same WAL, with CPU.

One PostgreSQL 15 server (the test server: fsync off).  For each shape its
two pgoutput slots are made first -- one for csnd, one for `pg_recvlogical`,
publication `bench` for all tables, as bench/serve_bench.py has them -- then
its backlog is written (server-side, a COMMIT per transaction), and only
then does either reader start:

* one-row transactions (200,000; `--small` 20,000);
* transactions of 100 rows of 6 columns (2,000; `--small` 200).

`pg_recvlogical` (csnd's own options: protocol 2, binary, streaming) drains
its slot up to the WAL end into a file (`-F 0`: no fsync), timed from its
start to its exit; its steady rate is the rate between the times the file
held 10% and 90% of its final bytes (its size read every 5 ms).

Then `csnd serve --decoders 2 --until-lsn END` (as serve_bench's backlog
row runs it) and one `csnd subscribe --limit N`, whose lines this process
counts as they come.  Every 0.1 s: `/api/status` (the transactions appended
to the changelog, and how far the reader has received the WAL) and the CPU
of every csnd process -- the service, its decoders' fork server and
decoders, found anew each time under the service's pid (bench/loadkit.py's
`Watch`), and the subscriber.  Figures:

* with start-up: N / (the service's start to the subscriber's Nth line);
* steady: the rate between the times 10% and 90% of the backlog were in the
  changelog (interpolated between polls) and at the subscriber (its lines).
  The subscriber's can exceed the changelog's: it starts late and reads what
  the changelog already holds.  The ratios divide by `pg_recvlogical`'s
  steady rate (with start-up: by its whole run's).  The JSON also has the
  same for the WAL received by csnd's reader (its received LSN; the WAL is
  uniform), but that window holds start-up: the reader fills the pipeline's
  queues while the decoders are still starting;
* CPU (utime + stime from /proc/PID/stat) per process: what it had spent
  before the first transaction was in the changelog (start-up), and in
  microseconds per transaction over the whole drain (from its start to the
  last line) and over the steady window (the polls bracketing 10% and 90%:
  the changelog's, for the subscriber its own lines).  The polls cost the
  service some CPU of its own (`--poll-s` to change their rate).
* the walsenders: each slot's `active_pid`, its CPU read every 5 ms until it
  exits; a forked backend starts at zero, so its last figure is what it spent
  on that reader.  They have no steady figure: the socket buffers let a
  walsender run megabytes ahead of a reader that is still starting.
  `pg_recvlogical`'s own CPU is from wait4.

    python -m bench drain [--small] [--one-row-txns N] [--batch-txns N] [--batch-rows N] ...
    python -m bench.drain_bench ...

Prints two tables (rates; CPU per process) and writes them to
bench-out/drain.md, the raw figures (every poll) to bench-out/drain.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

import psycopg

from bench.common import out_path, pg_recvlogical_command
from bench.loadkit import (
    Proc,
    Service,
    Watch,
    add_scale_flags,
    cpu_seconds,
    end_all,
    lsn_text,
    scale_from,
    subscribe,
)
from csnd.core.ids import lsn_from_str
from csnd.testing.pgserver import PgServer, start_server

POLL_S: Final = 0.1  # /api/status and the csnd processes' CPU
FAST_S: Final = 0.005  # the walsenders' CPU and pg_recvlogical's output size
LOW, HIGH = 0.1, 0.9  # the steady window: from 10% to 90% of the backlog
DRAIN_TIMEOUT_S: Final = 1800.0


@dataclass(frozen=True)
class Scale:
    one_row_txns: int = 200_000
    batch_txns: int = 2_000
    batch_rows: int = 100  # rows of each batch transaction (6 columns)
    decoders: int = 2
    poll_s: float = POLL_S  # how often /api/status and the csnd processes' CPU are read


FULL: Final = Scale()
SMALL: Final = Scale(one_row_txns=20_000, batch_txns=200)
_SIZE_HELP: Final = {
    "one_row_txns": "one-row transactions of the first backlog",
    "batch_txns": "transactions of the second backlog",
    "batch_rows": "rows (6 columns) of each transaction of the second backlog",
    "decoders": "csnd serve --decoders",
    "poll_s": "seconds between reads of /api/status and the csnd processes' CPU",
}


# --- /proc ------------------------------------------------------------------------------------


def cpu_at(samples: list[tuple[float, float]], t: float) -> float:
    """CPU seconds at the last sample taken by `t`; 0 before the first (the process was not there yet)."""
    last = 0.0
    for ts, cpu in samples:
        if ts > t:
            break
        last = cpu
    return last


class FastWatch:
    """A thread reading, every FAST_S, the CPU of the walsender(s) serving `slot` and a file's size.

    The walsender is the slot's `active_pid`, looked up until it appears
    (and then every 0.2 s, in case the reader reconnects).  Each pid's
    samples run until its process exits: a walsender's CPU starts at zero
    at its fork, so its last sample is what it spent serving the slot.
    """

    def __init__(self, dsn: str, slot: str, size_of: str | None = None) -> None:
        self.dsn, self.slot, self.size_of = dsn, slot, size_of
        self.cpu: dict[int, list[tuple[float, float]]] = {}
        self.sizes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fast-{slot}", daemon=True)

    def start(self) -> FastWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as c:
            next_lookup = 0.0
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= next_lookup:
                    row = c.execute(
                        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)
                    ).fetchone()
                    if row and row[0] and int(row[0]) not in self.cpu:
                        self.cpu[int(row[0])] = []
                    next_lookup = now + (0.2 if self.cpu else 0.005)
                for pid, samples in self.cpu.items():
                    cpu = cpu_seconds(pid)
                    if cpu is not None:
                        samples.append((now, cpu))
                if self.size_of is not None:
                    with contextlib.suppress(FileNotFoundError):
                        self.sizes.append((now, os.stat(self.size_of).st_size))
                self._stop.wait(FAST_S)

    def total(self) -> float:
        return sum(s[-1][1] for s in self.cpu.values() if s)

    def at(self, t: float) -> float:
        return sum(cpu_at(s, t) for s in self.cpu.values())

    def series(self, t0: float, every: float = 0.05) -> dict[str, list[tuple[float, float]]]:
        """Each walsender's (time after `t0`, CPU s), thinned to one sample per `every` seconds."""
        out: dict[str, list[tuple[float, float]]] = {}
        for pid, samples in self.cpu.items():
            kept: list[tuple[float, float]] = []
            for t, cpu in samples:
                if not kept or t - t0 - kept[-1][0] >= every or (t, cpu) == samples[-1]:
                    kept.append((round(t - t0, 3), cpu))
            out[str(pid)] = kept
        return out

    def first(self) -> float:
        """CPU at each walsender's first sample (its start-up, already spent when it was found)."""
        return sum(s[0][1] for s in self.cpu.values() if s)


def crossing(points: list[tuple[float, float]], level: float) -> float | None:
    """When the rising series of (t, value) first reached `level`, interpolated between samples."""
    prev: tuple[float, float] | None = None
    for t, v in points:
        if v >= level:
            if prev is None or v == prev[1]:
                return t
            return prev[0] + (level - prev[1]) / (v - prev[1]) * (t - prev[0])
        prev = (t, v)
    return None


def per_txn_us(cpu_s: float, txns: int) -> float | None:
    return cpu_s / txns * 1e6 if txns > 0 else None


# --- the backlog ------------------------------------------------------------------------------

SHAPES: Final = ("one_row", "batch")


def write_backlogs(server: PgServer, scale: Scale) -> dict[str, dict[str, Any]]:
    """Slots first, then each shape's WAL: {shape: {slots, end LSN, transactions, rows, seconds}}."""
    out: dict[str, dict[str, Any]] = {}
    with psycopg.connect(server.dsn(), autocommit=True) as c:
        # (no autovacuum: it would work through the new rows while the readers drain)
        c.execute("CREATE TABLE one_row (id bigint PRIMARY KEY, v int) WITH (autovacuum_enabled = off)")
        c.execute(
            "CREATE TABLE batch (id bigint PRIMARY KEY, a int, n numeric(12,2), t timestamptz, s text, j jsonb) "
            "WITH (autovacuum_enabled = off)"
        )
        c.execute("CREATE PUBLICATION bench FOR ALL TABLES")
        n, rows = scale.one_row_txns, scale.batch_rows
        loops = {
            "one_row": (
                n,
                1,
                f"FOR i IN 0..{n - 1} LOOP INSERT INTO one_row VALUES (i, i); COMMIT; END LOOP;",
            ),
            "batch": (
                scale.batch_txns,
                rows,
                f"FOR i IN 0..{scale.batch_txns - 1} LOOP INSERT INTO batch SELECT g, g % 1000, g * 1.5, now(), "
                f"md5(g::text), jsonb_build_object('g', g, 'h', md5(g::text)) FROM generate_series(i * {rows}, "
                f"i * {rows} + {rows - 1}) g; COMMIT; END LOOP;",
            ),
        }
        for shape in SHAPES:
            txns, per, body = loops[shape]
            slots = {"csnd": f"csnd_{shape}", "pg_recvlogical": f"twin_{shape}"}
            for slot in slots.values():
                c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
            start = _current(c)
            t0 = time.monotonic()
            c.execute(f"DO $$ BEGIN {body} END $$")
            end = _current(c)
            out[shape] = {
                "slots": slots,
                "transactions": txns,
                "rows_per_transaction": per,
                "write_s": time.monotonic() - t0,
                "start_lsn": start,
                "wal_bytes": end - start,
                "end_lsn": end,
            }
        c.execute("CHECKPOINT")  # (not one of its own in the middle of a drain)
    return out


def _current(c: psycopg.Connection[Any]) -> int:
    row = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return lsn_from_str(str(row[0]))


# --- pg_recvlogical ---------------------------------------------------------------------------


def drain_pg_recvlogical(server: PgServer, work: str, slot: str, end: int, txns: int) -> dict[str, Any]:
    out_file = os.path.join(work, f"{slot}.out")
    cmd = [
        *pg_recvlogical_command(server, slot, "bench"),
        "-E",
        lsn_text(end),
        "-F",
        "0",
        "-f",
        out_file,
    ]
    fast = FastWatch(server.dsn(), slot, size_of=out_file).start()
    with open(os.path.join(work, f"{slot}.err"), "w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        t1 = time.monotonic()
    proc.returncode = os.waitstatus_to_exitcode(status)
    time.sleep(FAST_S * 4)  # (a last look at the walsender: gone, or its final figure)
    fast.stop()
    if proc.returncode != 0:
        with open(os.path.join(work, f"{slot}.err")) as f:
            raise RuntimeError(f"pg_recvlogical exited {proc.returncode}: {f.read().strip()[-500:]}")
    size = os.path.getsize(out_file)
    os.unlink(out_file)
    sizes = [(t, float(s)) for t, s in fast.sizes]
    lo, hi = crossing(sizes, LOW * size), crossing(sizes, HIGH * size)
    steady = (HIGH - LOW) * txns / (hi - lo) if lo is not None and hi is not None and hi > lo else None
    ws_steady = (
        fast.at(hi) - fast.at(lo) if steady is not None and lo is not None and hi is not None else None
    )
    return {
        "seconds": t1 - t0,
        "transactions_per_s": txns / (t1 - t0),
        "steady_transactions_per_s": steady,
        "steady_window_s": [None if lo is None else lo - t0, None if hi is None else hi - t0],
        "output_bytes": size,
        "walsender_pids": list(fast.cpu),
        "walsender_cpu_s": fast.total(),
        "walsender_cpu_at_first_sample_s": fast.first(),
        "walsender_samples": fast.series(t0),
        "walsender_us_per_txn": per_txn_us(fast.total(), txns),
        "walsender_steady_us_per_txn": None
        if ws_steady is None
        else per_txn_us(ws_steady, round((HIGH - LOW) * txns)),
        "pg_recvlogical_cpu_s": usage.ru_utime + usage.ru_stime,
        "pg_recvlogical_us_per_txn": per_txn_us(usage.ru_utime + usage.ru_stime, txns),
    }


# --- csnd -------------------------------------------------------------------------------------


class LineCounter:
    """Counts a pipe's lines in a thread, noting when the count first reached each of `levels`."""

    def __init__(self, fd: int, levels: dict[str, int]) -> None:
        self.count = 0
        self.reached: dict[str, tuple[float, int]] = {}  # level name -> (time, count then)
        self._fd, self._levels = fd, levels
        self.thread = threading.Thread(target=self._run, name="lines", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while chunk := os.read(self._fd, 1 << 16):
            self.count += chunk.count(b"\n")
            for name, level in self._levels.items():
                if name not in self.reached and self.count >= level:
                    self.reached[name] = (time.monotonic(), self.count)


def _poll(
    svc: Service, watch: Watch, lines: LineCounter, t0: float, wal: tuple[int, int, int]
) -> dict[str, Any]:
    """One look: /api/status, then every csnd process's CPU (times relative to `t0`).

    `wal` is (start LSN, end LSN, transactions): "read" is how far the
    reader has received that WAL, in transactions (the WAL is uniform).
    """
    t_ask = time.monotonic()
    doc = svc.status()
    t_got = time.monotonic()
    watch.sample()
    t = time.monotonic()
    node = (doc.get("nodes") or [{}])[0]
    return {
        "t": t - t0,
        "t_status": (t_ask + t_got) / 2 - t0,
        "status_ms": (t_got - t_ask) * 1000,
        "appended": int(doc.get("totals", {}).get("transactions", 0)),
        "newest_csn": int(doc["changelog"].get("newest_csn", 0)),
        "released": int(node.get("transactions", 0)),
        "received_lsn": int(node.get("received_lsn", 0)),
        "read": min(1.0, max(0.0, (int(node.get("received_lsn", 0)) - wal[0]) / (wal[1] - wal[0]))) * wal[2],
        "node_state": node.get("state", ""),
        "lines": lines.count,
        "cpu": {str(pid): cpu_at([(s[0], s[2]) for s in p.samples], t) for pid, p in watch.procs.items()},
    }


def drain_csnd(
    server: PgServer, work: str, slot: str, wal: tuple[int, int, int], decoders: int, poll_s: float
) -> dict[str, Any]:
    """`csnd serve` -> `csnd subscribe` over `slot`'s WAL: `wal` is (start LSN, end LSN, transactions)."""
    end, txns = wal[1], wal[2]
    fast = FastWatch(server.dsn(), slot).start()
    t0 = time.monotonic()
    svc = Service(
        [f"dn1={server.url()}?slot={slot}&publication=bench"],
        work,
        slot,
        "--decoders",
        str(decoders),
        "--until-lsn",
        lsn_text(end),
    )
    t_ready = time.monotonic()
    watch = Watch(svc.proc.pid)
    sub = subscribe(svc.address, "--limit", str(txns), stdout=subprocess.PIPE)
    watch.add(sub.pid, "csnd subscribe")
    assert sub.stdout is not None
    levels = {"first": 1, "low": round(LOW * txns), "high": round(HIGH * txns), "all": txns}
    lines = LineCounter(sub.stdout.fileno(), levels)
    polls: list[dict[str, Any]] = []
    try:
        while "all" not in lines.reached:
            tick = time.monotonic()
            if tick > t0 + DRAIN_TIMEOUT_S:
                raise RuntimeError(
                    f"the subscriber had {lines.count:,} of {txns:,} lines after {DRAIN_TIMEOUT_S} s"
                )
            if not lines.thread.is_alive() and "all" not in lines.reached:
                err = sub.stderr.read().decode(errors="replace") if sub.stderr else ""
                raise RuntimeError(f"csnd subscribe ended after {lines.count:,} lines: {err.strip()[-500:]}")
            polls.append(_poll(svc, watch, lines, t0, wal))
            time.sleep(max(0.0, poll_s - (time.monotonic() - tick)))
        t_end = lines.reached["all"][0]
        polls.append(_poll(svc, watch, lines, t0, wal))  # (every process's CPU once the last line is in)
    finally:
        end_all([sub])
        svc.stop()
        fast.stop()
    return _csnd_figures(watch, fast, lines, polls, t0, t_ready, t_end, txns)


def _csnd_figures(
    watch: Watch,
    fast: FastWatch,
    lines: LineCounter,
    polls: list[dict[str, Any]],
    t0: float,
    t_ready: float,
    t_end: float,
    txns: int,
) -> dict[str, Any]:
    """Rates and CPU per transaction; times in `polls` and in the result are relative to `t0`."""
    whole = t_end - t0
    log_lo, log_hi, log_steady = _steady(polls, "appended", txns)
    got_lo, got_hi, got_steady = _steady(polls, "read", txns)
    (s_lo, c_lo), (s_hi, c_hi) = lines.reached["low"], lines.reached["high"]
    sub_steady = (c_hi - c_lo) / (s_hi - s_lo) if s_hi > s_lo else None
    # CPU windows: the polls bracketing 10% and 90% (the changelog's, or the subscriber's lines)
    win_log = _window(polls, "appended", txns)
    win_sub = _window(polls, "lines", txns)
    # start-up: each process's CPU at the last poll before anything was in the changelog
    first = next((i for i, p in enumerate(polls) if p["appended"] > 0), len(polls))
    before = polls[first - 1]["cpu"] if first > 0 else {}
    procs: list[dict[str, Any]] = []
    for pid, p in watch.procs.items():
        samples = [(s[0], s[2]) for s in p.samples]
        total = cpu_at(samples, t0 + polls[-1]["t"])
        key = "lines" if p.label.startswith("csnd subscribe") else "appended"
        win = win_sub if key == "lines" else win_log
        steady_cpu = steady_n = None
        if win is not None:
            a, b = polls[win[0]], polls[win[1]]
            steady_cpu = b["cpu"].get(str(pid), 0.0) - a["cpu"].get(str(pid), 0.0)
            steady_n = b[key] - a[key]
        row = _proc_row(p, pid, total, steady_cpu, steady_n, txns)
        procs.append({**row, "startup_cpu_s": before.get(str(pid), 0.0)})
    # (the walsender: over its life, a forked backend's; see the module docstring)
    walsender = {
        "pids": list(fast.cpu),
        "cpu_s": fast.total(),
        "cpu_at_first_sample_s": fast.first(),
        "us_per_txn": per_txn_us(fast.total(), txns),
        "samples": fast.series(t0),
    }
    first_line = lines.reached.get("first")
    return {
        "seconds": whole,
        "ready_s": t_ready - t0,
        "first_appended_s": next((p["t_status"] for p in polls if p["appended"] > 0), None),
        "first_line_s": None if first_line is None else first_line[0] - t0,
        "transactions_per_s": txns / whole,
        "read_steady_transactions_per_s": got_steady,
        "read_window_s": [got_lo, got_hi],
        "changelog_steady_transactions_per_s": log_steady,
        "changelog_window_s": [log_lo, log_hi],
        "subscriber_steady_transactions_per_s": sub_steady,
        "subscriber_window_s": [s_lo - t0, s_hi - t0],
        "changelog_all_s": crossing([(p["t_status"], float(p["appended"])) for p in polls], float(txns)),
        "cpu_window_polls": {"changelog": win_log, "subscriber": win_sub},
        "status_ms_max": max(p["status_ms"] for p in polls),
        "status_ms_mean": sum(p["status_ms"] for p in polls) / len(polls),
        "procs": procs,
        "walsender": walsender,
        "polls": polls,
    }


def _steady(
    polls: list[dict[str, Any]], key: str, txns: int
) -> tuple[float | None, float | None, float | None]:
    """When `key` crossed 10% and 90% of `txns` (interpolated between polls), and the rate between."""
    points = [(p["t_status"], float(p[key])) for p in polls]
    lo, hi = crossing(points, LOW * txns), crossing(points, HIGH * txns)
    if lo is None or hi is None or hi <= lo:
        return lo, hi, None
    return lo, hi, (HIGH - LOW) * txns / (hi - lo)


def _window(polls: list[dict[str, Any]], key: str, txns: int) -> tuple[int, int] | None:
    """Indexes of the first polls at which `key` had reached 10% and 90% of `txns`; None if one poll."""
    a = next((i for i, p in enumerate(polls) if p[key] >= LOW * txns), None)
    b = next((i for i, p in enumerate(polls) if p[key] >= HIGH * txns), None)
    if a is None or b is None or b <= a or polls[b][key] <= polls[a][key]:
        return None
    return a, b


def _proc_row(
    p: Proc, pid: int, total: float, steady_cpu: float | None, steady_n: int | None, txns: int
) -> dict[str, Any]:
    return {
        "label": p.label,
        "pids": [pid],
        "cpu_s": total,
        "us_per_txn": per_txn_us(total, txns),
        "steady_cpu_s": steady_cpu,
        "steady_txns": steady_n,
        "steady_us_per_txn": None if steady_cpu is None or not steady_n else per_txn_us(steady_cpu, steady_n),
    }


# --- the tables -------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def _what(shape: dict[str, Any]) -> str:
    per = shape["rows_per_transaction"]
    kind = "one-row transactions" if per == 1 else f"transactions of {per} rows (6 columns)"
    return f"{shape['transactions']:,} {kind}"


def rate_rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name in SHAPES:
        r = results["shapes"][name]
        pg, cs = r["pg_recvlogical"], r["csnd"]
        rows.append(
            (
                _what(r),
                f"{_f(pg['transactions_per_s'])} ({pg['seconds']:.2f} s); steady {_f(pg['steady_transactions_per_s'])}",
                f"changelog {_f(cs['changelog_steady_transactions_per_s'])} (ratio "
                f"{_ratio(cs['changelog_steady_transactions_per_s'], pg['steady_transactions_per_s'])}); "
                f"subscriber {_f(cs['subscriber_steady_transactions_per_s'])} (ratio "
                f"{_ratio(cs['subscriber_steady_transactions_per_s'], pg['steady_transactions_per_s'])})",
                f"{_f(cs['transactions_per_s'])} ({cs['seconds']:.2f} s: listening after {cs['ready_s']:.2f} s, "
                f"first in the changelog {_f(cs['first_appended_s'], 2)} s, first line {_f(cs['first_line_s'], 2)} s; "
                f"ratio {_ratio(cs['transactions_per_s'], pg['transactions_per_s'])})",
            )
        )
    return rows


_ORDER: Final = ("csnd serve", "decoders' fork server", "decoder", "resource tracker", "csnd subscribe")


def cpu_rows(results: dict[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name in SHAPES:
        r = results["shapes"][name]
        what, pg, cs = _what(r), r["pg_recvlogical"], r["csnd"]
        procs = sorted(cs["procs"], key=lambda p: [p["label"].startswith(o) for o in _ORDER].index(True))
        for p in procs:
            rows.append(
                (
                    what,
                    p["label"],
                    _f(p["startup_cpu_s"], 2),
                    _f(p["us_per_txn"], 1),
                    _f(p["steady_us_per_txn"], 1),
                )
            )
        steady = [p["steady_us_per_txn"] for p in procs]
        rows.append(
            (
                what,
                "**csnd, all of the above**",
                f"**{_f(sum(p['startup_cpu_s'] for p in procs), 2)}**",
                f"**{_f(sum(p['us_per_txn'] or 0.0 for p in procs), 1)}**",
                f"**{_f(sum(x for x in steady if x is not None), 1) if None not in steady else '-'}**",
            )
        )
        rows.append((what, "walsender serving csnd", "-", _f(cs["walsender"]["us_per_txn"], 1), "-"))
        rows.append((what, "walsender serving pg_recvlogical", "-", _f(pg["walsender_us_per_txn"], 1), "-"))
        rows.append((what, "pg_recvlogical", "-", _f(pg["pg_recvlogical_us_per_txn"], 1), "-"))
    return rows


def markdown(results: dict[str, Any]) -> str:
    out = [
        "| backlog (same WAL) | pg_recvlogical, transactions/s: whole run; steady 10-90% | csnd steady 10-90%: in the changelog; at the subscriber, "
        "transactions/s (ratio to pg_recvlogical's steady) | csnd from the service's start to the last line "
        "at the subscriber, transactions/s (ratio to pg_recvlogical's whole run) |",
        "| --- | --- | --- | --- |",
    ]
    out += ["| " + " | ".join(r) + " |" for r in rate_rows(results)]
    out += [
        "",
        "| backlog | process | CPU s before the first transaction was in the changelog | CPU µs per "
        "transaction, whole drain (start-up included) | CPU µs per transaction, steady 10-90% |",
        "| --- | --- | --- | --- | --- |",
    ]
    out += ["| " + " | ".join(r) + " |" for r in cpu_rows(results)]
    return "\n".join(out) + "\n"


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> Scale:
    p = argparse.ArgumentParser(prog="python -m bench drain", description=__doc__.split("\n\n")[0])
    add_scale_flags(p, FULL, SMALL, _SIZE_HELP)
    return scale_from(p.parse_args(argv), FULL, SMALL)


def run(scale: Scale) -> dict[str, Any]:
    server = start_server()
    work = tempfile.mkdtemp(prefix="csnd-drain-bench-")
    try:
        print("bench drain: writing the backlogs ...", file=sys.stderr, flush=True)
        shapes = write_backlogs(server, scale)
        for name in SHAPES:
            s = shapes[name]
            print(f"bench drain: {name}: pg_recvlogical ...", file=sys.stderr, flush=True)
            s["pg_recvlogical"] = drain_pg_recvlogical(
                server, work, s["slots"]["pg_recvlogical"], s["end_lsn"], s["transactions"]
            )
            print(f"bench drain: {name}: csnd serve -> csnd subscribe ...", file=sys.stderr, flush=True)
            wal = (s["start_lsn"], s["end_lsn"], s["transactions"])
            s["csnd"] = drain_csnd(server, work, s["slots"]["csnd"], wal, scale.decoders, scale.poll_s)
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return {
        "scale": asdict(scale),
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "shapes": shapes,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    results = run(parse_args(sys.argv[1:] if argv is None else argv))
    with open(out_path("drain.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    text = markdown(results)
    with open(out_path("drain.md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return results


if __name__ == "__main__":
    main()
