"""The GTM commit barrier's length on 3 local servers, step by step, idle and under writers.

`python -m bench.barrier_bench [--barriers N]`: a 3-server cluster (the GTM on
dn1) and `CommitBarrier.export()` -- the barrier a GTM-mode initial
snapshot is taken under -- N times, a fifth of a second apart, in three
loads, one after another in this run:

    idle      no writer: the barrier's own cost (its round trips)
    paced     3 writer processes at 60 distributed transactions/s in all
    unpaced   3 writer processes as fast as they go (both cores busy)

Each barrier's steps, from the lock asked for (`Held`): the lock held and X
read; every commit with a CSN decided; every node's snapshot exported (the
nodes at once); the GTM released -- `held`, what a writer's commit may have
waited.  Per node: `held` over the nodes.  A shared machine's load moves
every figure (a round trip waits for a core), so the 1-minute load average
is kept beside them.  The medians and the 90th percentiles go to stdout as
a table and to bench-out/barrier.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

from bench.common import out_path
from csnd.gtm.barrier import CommitBarrier, Held
from csnd.gtm.liveload import LoadOptions, run_workload
from csnd.gtm.pggtm import PgGtm
from csnd.testing.cluster import LocalCluster, start_cluster

BARRIERS = 30
NODES = 3
WRITERS = 3
PACED_RATE = 60.0
GAP_S = 0.2  # between barriers: the writers' commits in flight again


def _steps(held: Held) -> dict[str, float]:
    nodes = max(held.node_s.values())
    return {
        "held_ms": held.held_s * 1000,
        "load": os.getloadavg()[0],  # the machine's 1-minute load: every figure moves with it
        "lock_ms": held.lock_wait_s * 1000,
        "decided_ms": (held.decided_s - held.lock_wait_s) * 1000,  # waiting for commits with a CSN
        "nodes_ms": (nodes - held.decided_s) * 1000,  # every node's prepared check and export, at once
        "release_ms": (held.held_s - nodes) * 1000,
        "drained": float(len(held.drained)),
        "rounds": float(held.rounds),
    }


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"barriers": len(samples)}
    for key in samples[0]:
        values = sorted(s[key] for s in samples)
        out[key] = {
            "p50": round(statistics.median(values), 2),
            "p90": round(values[max(0, int(len(values) * 0.9) - 1)], 2),
        }
    out["per_node_ms"] = {k: round(v / NODES, 2) for k, v in out["held_ms"].items()}
    return out


def _barriers(cluster: LocalCluster, n: int) -> list[dict[str, float]]:
    samples = []
    for _ in range(n):
        with CommitBarrier(cluster.gtm_url, cluster.urls()).export() as held:
            pass
        samples.append(_steps(held))
        time.sleep(GAP_S)
    return samples


def _under_writers(cluster: LocalCluster, n: int, rate: float) -> dict[str, Any]:
    opts = LoadOptions(
        nodes=cluster.urls(),
        gtm=cluster.gtm_url,
        writers=WRITERS,
        rate=rate,
        duration=n * (GAP_S + 0.15) + 10,
        progress=False,
    )
    done: dict[str, Any] = {}
    load = threading.Thread(target=lambda: done.update(summary=run_workload(opts)), daemon=True)
    load.start()
    with PgGtm(cluster.gtm_url) as gtm:  # (the writers are committing before the first barrier)
        first = gtm.current()
        while gtm.current() < first + 30:
            if not load.is_alive():
                raise RuntimeError("the workload ended before committing")
            time.sleep(0.05)
        samples = _barriers(cluster, n)
    load.join()
    summary = done["summary"]
    if summary.errors:
        raise RuntimeError(f"workload errors: {summary.errors[:3]}")
    out = _summary(samples)
    out["writers_transactions_per_s"] = round(summary.per_second, 1)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.barrier_bench")
    parser.add_argument(
        "--barriers", type=int, default=BARRIERS, help="barriers a load (default %(default)s)"
    )
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"nodes": NODES, "writers": WRITERS}
    with start_cluster(NODES) as cluster:
        PgGtm(cluster.gtm_url).close()
        results["idle"] = _summary(_barriers(cluster, args.barriers))
        results["paced"] = _under_writers(cluster, args.barriers, PACED_RATE)
        results["unpaced"] = _under_writers(cluster, args.barriers, 0.0)
    with open(out_path("barrier.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    _print(results)
    return results


def _print(results: dict[str, Any]) -> None:
    cols = ["held_ms", "per_node_ms", "lock_ms", "decided_ms", "nodes_ms", "release_ms", "drained", "load"]
    print(f"commit barrier, {results['nodes']} nodes, median (p90); ms except drained (commits waited for)")
    print("| writers | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for load in ("idle", "paced", "unpaced"):
        r = results[load]
        cells = [f"{r[c]['p50']:g} ({r[c]['p90']:g})" for c in cols]
        rate = r.get("writers_transactions_per_s")
        print(f"| {load}{f' ({rate:g} txn/s)' if rate else ''} | " + " | ".join(cells) + " |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
