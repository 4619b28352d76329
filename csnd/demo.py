"""`csnd demo`: the embedded default, needing nothing else running.

1. start a throwaway PostgreSQL 15 (as the tests do) and run a small but
   nasty workload on it: concurrency, savepoints, a streamed big transaction,
   TOAST, every replica identity, DDL, two-phase commit, logical messages;
2. capture it live with the reader (`csnd record`), confirming the slot only
   to what is fsynced;
3. replay the capture through the whole pipeline (decoder processes, sender,
   merge) and summarise the transaction JSON lines;
4. generate a synthetic 3-node GaussDB-style cluster and replay the global,
   CSN-ordered merge of it, checked against the generator's expected output;
5. run the same cluster scale-out: one `csnd node` agent process per node,
   merged by the coordinator over gRPC, checked the same way.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

from csnd.core.ids import lsn_from_str, lsn_to_str
from csnd.testing import pgworkload
from csnd.testing.pgserver import start_server

OUT_DIR = "demo-out"


def _say(text: str) -> None:
    print(f"csnd demo: {text}", file=sys.stderr, flush=True)


def _summarise(path: str) -> dict[str, Any]:
    txns = 0
    ops: collections.Counter[str] = collections.Counter()
    tables: collections.Counter[str] = collections.Counter()
    csns: list[int] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            txns += 1
            csns.append(doc["csn"])
            for ch in doc["changes"]:
                ops[ch["op"]] += 1
                tables[f"{ch['schema']}.{ch['table']}"] += 1
    return {
        "transactions": txns,
        "changes": sum(ops.values()),
        "ops": dict(ops),
        "tables": dict(tables),
        "csn_ordered": all(a < b for a, b in zip(csns, csns[1:], strict=False)),
    }


def _replay(sources: list[str], output: str, decoders: int) -> float:
    from csnd.cli import main as cli_main

    # A replay of node agents refuses to write over an earlier output (the
    # agents may stream live slots); the demo makes every file afresh.
    for stale in (output, f"{output}.partial"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale)
    t0 = time.monotonic()
    rc = cli_main(["replay", *sources, "--decoders", str(decoders), "--output", output])
    if rc != 0:
        raise SystemExit(rc)
    return time.monotonic() - t0


def run_demo(args: argparse.Namespace) -> int:
    from csnd.reader.live import LiveOptions, LiveSource
    from csnd.reader.record import record

    os.makedirs(OUT_DIR, exist_ok=True)
    decoders = max(1, min(2, os.cpu_count() or 1))
    _say("starting a throwaway PostgreSQL 15 (wal_level=logical) ...")
    server = start_server()
    try:
        dsn = server.dsn()
        pgworkload.setup(dsn)
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(b"SELECT pg_create_logical_replication_slot('csnd_demo', 'pgoutput')")
        _say(f"server on port {server.port}; running the workload (2 rounds) ...")
        pgworkload.run(dsn, rounds=2)
        with psycopg.connect(dsn, autocommit=True) as c:
            row = c.execute(b"SELECT pg_current_wal_lsn()::text").fetchone()
        end = lsn_from_str(str(row[0])) if row else 0
        capture = os.path.join(OUT_DIR, "dn1.pgstream")
        _say(f"capturing the slot live up to {lsn_to_str(end)} into {capture} ...")
        src = LiveSource("dn1", LiveOptions(server.url(), "csnd_demo", "csnd_pub", until_lsn=end))
        summary = record(src, capture)
        _say(
            f"recorded {summary.transactions} transactions, {summary.frames} frames, "
            f"{summary.bytes / 1e3:.0f} kB; slot confirmed to {lsn_to_str(summary.confirmed_lsn)}"
        )
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)

    out = os.path.join(OUT_DIR, "dn1.jsonl")
    secs = _replay([capture], out, decoders)
    s = _summarise(out)
    _say(f"replayed the capture with {decoders} decoder processes in {secs:.2f}s -> {out}")
    _say(
        f"  {s['transactions']} transactions, {s['changes']} changes {s['ops']}, CSN-ordered: {s['csn_ordered']}"
    )
    with open(out, encoding="utf-8") as f:
        first = f.readline().strip()
    _say(f"  first line: {first[:300]}{'...' if len(first) > 300 else ''}")

    cluster = os.path.join(OUT_DIR, "cluster")
    _say("generating a synthetic 3-node GaussDB-style cluster (2000 global transactions) ...")
    from csnd.gtm.generate import generate_cluster

    generate_cluster(cluster, nodes=3, transactions=2000, seed=1, binary=True)
    merged = os.path.join(OUT_DIR, "cluster.jsonl")
    files = [os.path.join(cluster, f"dn{i}.pgstream") for i in (1, 2, 3)]
    secs = _replay(files, merged, decoders)
    s = _summarise(merged)
    with (
        open(merged, encoding="utf-8") as a,
        open(os.path.join(cluster, "expected.jsonl"), encoding="utf-8") as b,
    ):
        same = a.read() == b.read()
    _say(f"merged 3 nodes in {secs:.2f}s -> {merged}")
    _say(f"  {s['transactions']} transactions, {s['changes']} changes, CSN-ordered: {s['csn_ordered']}")
    _say(f"  identical to the generator's expected global stream: {same}")
    same_remote = _scale_out(cluster, files)
    return 0 if same and same_remote and s["csn_ordered"] else 1


def _scale_out(cluster: str, files: list[str]) -> bool:
    """5. the same cluster with every node pipeline in its own `csnd node` process, merged over gRPC."""
    _say("scale-out: starting one node agent per node (csnd node ... --listen 127.0.0.1:0) ...")
    agents: list[subprocess.Popen[str]] = []
    urls = []
    try:
        for path in files:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "csnd.cli",
                    "node",
                    path,
                    "--listen",
                    "127.0.0.1:0",
                    "--decoders",
                    "1",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            agents.append(proc)
            assert proc.stderr is not None
            line = proc.stderr.readline().strip()
            _say(f"  {line}")
            urls.append("grpc://" + line.rsplit(" ", 1)[-1])
        merged = os.path.join(OUT_DIR, "cluster-grpc.jsonl")
        secs = _replay(urls, merged, 1)
        with (
            open(merged, encoding="utf-8") as a,
            open(os.path.join(cluster, "expected.jsonl"), encoding="utf-8") as b,
        ):
            same = a.read() == b.read()
        _say(f"merged {len(urls)} node agents over gRPC in {secs:.2f}s -> {merged}")
        _say(f"  identical to the generator's expected global stream: {same}")
        return same
    finally:
        for proc in agents:
            proc.terminate()
            proc.wait(timeout=10)
