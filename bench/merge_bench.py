"""Merge benchmarks (issue: the coordinator).

* merged changes per second of `csnd replay` over generated clusters of 1, 2
  and 3 nodes with the same number of global transactions, in one run;
* the merge's own cost per transaction: `CsnMerge` alone, fed prepared
  batches in memory (no decoding, no output), for 1, 2 and 3 nodes.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time

from bench.common import out_path
from csnd.coordinator import CsnMerge, NodeBatch, TxnEnd
from csnd.gtm import generate_cluster

TRANSACTIONS = 4000
MERGE_ONLY_TXNS = 100_000


def replay_rate(nodes: int) -> dict[str, float]:
    d = out_path(f"merge-{nodes}", "x")[:-2]
    shutil.rmtree(d, ignore_errors=True)
    summary = generate_cluster(d, nodes, TRANSACTIONS, seed=7, binary=True)
    files = [f"{d}/dn{i + 1}.pgstream" for i in range(nodes)]
    out = f"{d}/out.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "csnd.cli", "replay", *files, "--output", out], capture_output=True, text=True
    )
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench: replay of {nodes} nodes failed: {proc.stderr.strip()}")
    with open(out, "rb") as a, open(f"{d}/expected.jsonl", "rb") as b:
        if a.read() != b.read():
            raise SystemExit(f"bench: replay of {nodes} nodes differs from expected.jsonl")
    with open(out, encoding="utf-8") as f:
        txns = sum(1 for _ in f)
    return {
        "seconds": secs,
        "changes": summary.changes,
        "transactions": txns,
        "changes_per_s": summary.changes / secs,
    }


def _prepared(nodes: int, txns: int) -> list[tuple[str, NodeBatch]]:
    """Each node's batches in its own CSN order, interleaved as they might arrive."""
    rnd = random.Random(nodes)
    names = [f"dn{i + 1}" for i in range(nodes)]
    per_node: dict[str, list[NodeBatch]] = {n: [] for n in names}
    body = '"lsn": "0/1", "op": "insert", "new": {"id": 1}'
    for csn in range(1, txns + 1):
        k = 1 if nodes == 1 or rnd.random() > 0.4 else rnd.randint(2, nodes)
        for n in rnd.sample(names, k):
            changes = [(0, csn * 10 + j, body) for j in range(4)]
            per_node[n].append(NodeBatch(csn, f"g{csn}", csn, csn * 10, csn * 10 + 5, csn, 0, changes, True))
    queues = {n: iter(b) for n, b in per_node.items()}
    out: list[tuple[str, NodeBatch]] = []
    live = list(names)
    while live:
        n = rnd.choice(live)
        b = next(queues[n], None)
        if b is None:
            live.remove(n)
        else:
            out.append((n, b))
    return out


def merge_cost(nodes: int) -> dict[str, float]:
    feed = _prepared(nodes, MERGE_ONLY_TXNS)
    names = [f"dn{i + 1}" for i in range(nodes)]
    merge = CsnMerge(names, max_pending_batches=1 << 30, max_pending_bytes=1 << 40)
    emitted = 0
    t0 = time.perf_counter()
    for i, (node, batch) in enumerate(feed):
        merge.add_batch(node, batch)
        if i % 64 == 0:
            emitted += sum(1 for ev in merge.pop_events() if isinstance(ev, TxnEnd))
    for n in names:
        merge.node_ended(n)
    emitted += sum(1 for ev in merge.pop_events() if isinstance(ev, TxnEnd))
    secs = time.perf_counter() - t0
    assert emitted == MERGE_ONLY_TXNS, emitted
    return {"us_per_txn": secs / MERGE_ONLY_TXNS * 1e6, "batches": float(len(feed))}


def main() -> dict[str, object]:
    results: dict[str, object] = {}
    for nodes in (1, 2, 3):
        print(f"bench: generated {nodes}-node cluster through csnd replay ...", file=sys.stderr)
        results[f"replay_{nodes}"] = replay_rate(nodes)
        results[f"merge_only_{nodes}"] = merge_cost(nodes)
    print(results, file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
