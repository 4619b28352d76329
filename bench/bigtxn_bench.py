"""Memory benchmark (issue: the sender): `csnd replay` of one very large transaction.

Writes a single-node stream holding one transaction of about `size_mb` MB of
row data, streamed the way PostgreSQL streams a transaction bigger than
logical_decoding_work_mem (Stream Start/Stop blocks, then Stream Commit), and
replays it while sampling the high-water RSS (VmHWM) of the main process and
of each decoder process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from bench.common import out_path
from csnd.reader.pgoutput import (
    Column,
    encode_insert,
    encode_relation,
    encode_stream_commit,
    encode_stream_start,
    encode_stream_stop,
    encode_xlogdata,
)
from csnd.reader.streamfile import StreamHeader, StreamWriter

ROW_BYTES = 2000
ROWS_PER_BLOCK = 2000


def write_big_txn(path: str, size_mb: int) -> tuple[int, int]:
    """One streamed transaction of about size_mb MB; returns (rows, bytes written)."""
    rows = size_mb * 1_000_000 // ROW_BYTES
    relid, xid = 16500, 5000
    cols = [Column(1, "id", 20, -1), Column(0, "payload", 25, -1)]
    lsn = 0x2000000
    t_us = 817_000_000_000_000
    filler = "y" * (ROW_BYTES - 40)
    with StreamWriter(path, StreamHeader(node="big", binary=False, mode="single")) as w:
        done = 0
        first = True
        while done < rows:
            w.write_frame(encode_xlogdata(0, 0, t_us, encode_stream_start(xid, first)))
            if first:
                rel = encode_relation(relid, "public", "big", "d", cols, xid=xid)
                w.write_frame(encode_xlogdata(0, 0, t_us, rel))
            first = False
            for i in range(done, min(rows, done + ROWS_PER_BLOCK)):
                lsn += ROW_BYTES + 60
                msg = encode_insert(relid, [str(i), f"row {i:012d} {filler}"], xid=xid)
                w.write_frame(encode_xlogdata(lsn, lsn, t_us, msg))
            done = min(rows, done + ROWS_PER_BLOCK)
            w.write_frame(encode_xlogdata(0, 0, t_us, encode_stream_stop()))
        commit = lsn + 100
        end = commit + 16
        w.write_frame(encode_xlogdata(commit, end, t_us, encode_stream_commit(xid, commit, end, t_us)))
    return rows, os.path.getsize(path)


def _hwm_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def run(size_mb: int) -> dict[str, float]:
    path = out_path("bigtxn.pgstream")
    print(f"bench: writing one {size_mb} MB transaction to {path} ...", file=sys.stderr)
    rows, nbytes = write_big_txn(path, size_mb)
    out = out_path("bigtxn.jsonl")
    cmd = [sys.executable, "-m", "csnd.cli", "replay", path, "--decoders", "2", "--output", out]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    peak: dict[int, int] = {}
    while proc.poll() is None:
        for pid in (proc.pid, *_children(proc.pid)):
            kb = _hwm_kb(pid)
            if kb is not None:
                peak[pid] = max(peak.get(pid, 0), kb)
        time.sleep(0.1)
    secs = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"bench: replay of the big transaction failed: {err.strip()}")
    out_bytes = os.path.getsize(out)
    os.unlink(out)  # about as large as the stream itself
    main_mb = peak.get(proc.pid, 0) / 1024
    return {
        "txn_mb": nbytes / 1e6,
        "rows": float(rows),
        "seconds": secs,
        "output_mb": out_bytes / 1e6,
        "peak_rss_mb": main_mb,
        "peak_rss_all_mb": sum(peak.values()) / 1024,
    }


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 1024))
