"""Fault injection in the scale-out form: kill -9 of a node agent (`csnd node`) under pgbench.

A single-mode node (a fresh database of the test server) committing one-row
upserts from pgbench; `csnd node` streams it to `csnd serve grpc://...`; at
a moment drawn from the seed the agent and its decoders are killed with -9
and started again on the same address.  The changelog must hold every
committed transaction once, in commit order, with the witness's values, and
the slot (confirmed by the agent to what the coordinator made durable) must
never be past the changelog -- sampled throughout -- and must reach the end
of the WAL once the load stops.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from csnd.core.ids import lsn_from_str
from tests.faults import witness as wit
from tests.faults.conftest import record, runs
from tests.faults.harness import Outcome, Stall, http_status, wait
from tests.fixtures.pg import PgDatabase
from tests.fixtures.witness import Row, transactions
from tests.service.servekit import CSND, Served, start_serve

pytestmark = pytest.mark.xdist_group("faults")

FAULT = "agent-kill"
REGRESSIONS: list[int] = []  # seeds that once failed


def _start_agent(pg: PgDatabase, listen: str, log: Path) -> tuple[subprocess.Popen[str], str]:
    err = open(log, "a")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *CSND,
            "node",
            f"dn1={pg.url}",
            "--listen",
            listen,
            "--slot",
            "csnd",
            "--publication",
            "fx_pub",
            "--decoders",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its own process group: a kill reaches its decoders too)
    )
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError(f"csnd node exited {proc.wait()} before it listened")
        err.write(line)
        if "listening on " in line:
            address = line.split()[-1]
            break
    # the rest of its stderr goes to the log, read on a thread so the pipe never fills
    threading.Thread(target=lambda: [err.write(x) for x in proc.stderr or []], daemon=True).start()
    return proc, address


def _witness(pg: PgDatabase) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """(xid, end LSN, changes) of each committed transaction with changes, in commit order."""
    rows = pg.execute(
        "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes('witness', NULL, NULL)"
    )
    out: list[tuple[int, int, list[dict[str, Any]]]] = []
    for t in transactions(rows)[0]:
        assert t.end_lsn is not None and all(isinstance(e, Row) for e in t.events), t
        if t.events:
            out.append((t.xid, t.end_lsn, [wit.change(r) for r in t.rows]))
    return out


def _changelog(log_dir: str) -> list[dict[str, Any]]:
    from csnd.changelog import Changelog

    with Changelog(log_dir) as log:
        return [json.loads(raw) for _, raw in log.read(0, 2**63)]


@pytest.mark.parametrize("seed", sorted({*range(1, runs() + 1), *REGRESSIONS}))
def test_agent_kill(pg: PgDatabase, tmp_path: Path, seed: int) -> None:
    rng = random.Random(f"{FAULT}/{seed}")
    o = Outcome(FAULT, seed)
    pg.execute("CREATE TABLE other (id int PRIMARY KEY, n int)")
    pg.execute("CREATE PUBLICATION fx_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding')")
    script = tmp_path / "upsert.sql"
    script.write_text(
        "\\set k random(1, 500)\n"
        "INSERT INTO other VALUES (:k, 1) ON CONFLICT (id) DO UPDATE SET n = other.n + 1;\n"
    )
    log_dir = str(tmp_path / "changelog")
    agent, address = _start_agent(pg, "127.0.0.1:0", tmp_path / "agent.log")
    served: Served = start_serve([f"grpc://{address}"], log_dir)
    load = subprocess.Popen(
        [
            pg.server.bin("pgbench"),
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            str(pg.server.port),
            "-U",
            "postgres",
            "-c",
            "2",
            "-R",
            "400",
            "-T",
            "6",
            "-f",
            str(script),
            pg.name,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    readings: list[tuple[int, int]] = []  # (confirmed LSN, newest durable CSN read after it)
    stop = threading.Event()
    fault_at: list[float] = []
    recovered_at: list[float] = []

    def sample() -> None:
        while not stop.wait(0.05):
            try:
                ((c,),) = pg.execute(
                    "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'"
                )
                newest = int(http_status(served, timeout=2)["changelog"].get("newest_csn", 0))
            except Exception:  # (the next round)
                continue
            readings.append((lsn_from_str(str(c)), newest))
            if fault_at and not recovered_at and newest > target[0]:
                recovered_at.append(time.monotonic())

    target = [0]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        wait(
            lambda: int(http_status(served)["changelog"].get("newest_csn", 0)) > 0, "the stream to flow", str
        )
        d = rng.uniform(0.0, 3.0)
        time.sleep(d)
        target[0] = lsn_from_str(pg.current_lsn())  # recovered: a transaction committed after this is durable
        o.detail = f"kill -9 csnd node after {d:.2f}s"
        fault_at.append(time.monotonic())
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
        agent, _ = _start_agent(pg, address, tmp_path / "agent.log")
        _, err = load.communicate(timeout=120)
        assert load.returncode == 0, err
        want = _witness(pg)
        o.transactions = len(want)
        last_end = max(end for _, end, _ in want)
        try:
            wait(
                lambda: _holds_last(served, want),
                "every commit in the changelog",
                lambda: http_status(served)["nodes"],
            )
            wait(
                lambda: readings and readings[-1][0] >= last_end,
                "the slot confirmed past the last commit",
                lambda: http_status(served)["nodes"],
            )
            o.recovered = bool(recovered_at)
            if recovered_at:
                o.recovery_s = round(recovered_at[0] - fault_at[0], 2)
        except Stall as e:
            o.problems.append(str(e))
        stop.set()
        sampler.join()
        code, err = served.terminate()
        if code != 0:
            o.problems.append(f"csnd serve exited {code} on SIGTERM: {err[-1500:]}")
        _check(_changelog(log_dir), want, readings, o)
    except AssertionError as e:
        o.problems.append(f"{type(e).__name__}: {e}")
    finally:
        stop.set()
        if load.poll() is None:
            load.kill()
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        if served.proc.poll() is None:
            served.kill()
    record(o, tmp_path)
    assert o.ok, "\n".join([f"{FAULT} seed {seed}: {o.detail}", *o.problems])


def _holds_last(served: Served, want: list[tuple[int, int, list[dict[str, Any]]]]) -> bool:
    """Whether the changelog holds the last commit: its csn (commit LSN) is past the one before's end."""
    newest = int(http_status(served)["changelog"].get("newest_csn", 0))
    return newest > 0 and newest >= (want[-2][1] if len(want) > 1 else 0)


def _check(
    got: list[dict[str, Any]],
    want: list[tuple[int, int, list[dict[str, Any]]]],
    readings: list[tuple[int, int]],
    o: Outcome,
) -> None:
    v = wit.Verdict()
    xids = [t["nodes"]["dn1"]["xid"] for t in got]
    counts: dict[int, int] = {}
    for x in xids:
        counts[x] = counts.get(x, 0) + 1
    v.doubled = [str(x) for x, n in counts.items() for _ in range(n - 1)]
    csns = [t["csn"] for t in got]
    if csns != sorted(set(csns)):
        v.add("the changelog is not in strictly increasing csn order")
    by_xid = {t["nodes"]["dn1"]["xid"]: t for t in got}
    for xid, end, changes in want:
        t = by_xid.get(xid)
        if t is None:
            v.lost.append(str(xid))
            v.add(f"lost xid {xid} (commit ending at {end:X})")
            continue
        ours = [
            {
                "table": c["table"],
                "op": c["op"],
                "new": c["new"],
                "old": c["old"],
                "unchanged": c.get("unchanged", []),
            }
            for c in t["changes"]
        ]
        if ours != changes:
            v.add(f"xid {xid}: changes differ: got {ours[:2]}, committed {changes[:2]}")
        if not t["csn"] < end:
            v.add(f"xid {xid}: csn {t['csn']} not before its commit's end {end:X}")
    for x in counts.keys() - {xid for xid, _, _ in want}:
        v.add(f"xid {x} in the changelog was never committed with changes")
    for x in v.doubled[:5]:
        v.add(f"xid {x} appended more than once")
    if not readings:
        v.add("no slot readings were taken")
    for confirmed, newest in readings:
        bad = [
            (end, xid)
            for xid, end, _ in want
            if end <= confirmed and by_xid.get(xid, {"csn": 2**63})["csn"] > newest
        ]
        if bad:
            v.add(
                f"slot confirmed to {confirmed:X} while the changelog's newest csn was {newest}: xid {bad[0][1]}"
            )
            break
    o.lost, o.doubled = len(v.lost), len(v.doubled)
    o.problems += v.problems
