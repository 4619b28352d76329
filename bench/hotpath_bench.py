"""The live node's hot path without a server: canned frames through the reader, the decoder pool and the sender.

`python -m bench hotpath [--transactions N] [--rows R] [--repeat K]`

A live reader (`LiveSource._copy_loop`, as `csnd serve` runs it: runs of
raw change frames, whole transactions as one event) reads pgoutput frames
from a stand-in for libpq's `get_copy_data` that hands out ready-made
frames; the events go through `DecoderPool` (2 workers, lines written by
the workers, as for a lone node in single-node mode) and `NodeSender`.
Three figures, CPU per transaction (`time.process_time`, `thread_time`):

* reader alone: the copy loop and the resume filter, no pool;
* the reader's thread with the pool's feed beside it, and the whole
  process (reader, feed, the pool's queue threads, collector and sender);
* the same without the collector's sender (`--no-sender` skips it).

No server, no disk, no gRPC: what stays is the Python the main process
runs per frame and per transaction, so a change to the hot path shows here
with far less of the machine's noise than in `python -m bench drain`.  The
best of `--repeat` runs counts.  Prints a table and writes
bench-out/hotpath.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import struct
import sys
import threading
import time
from typing import Any

from bench.common import out_path
from bench.loadkit import cpu_seconds
from csnd.decoder.pool import BatchEnd, DecoderPool
from csnd.reader import pgoutput as p
from csnd.reader.events import EventStream
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.recorded import checked_commit_times
from csnd.sender.node import NodeSender

RELID = 16384


class _CannedCopy:
    """`pgconn.get_copy_data` over frames made beforehand; the stream ends with the frames."""

    def __init__(self, frames: list[bytes]) -> None:
        self.frames = frames
        self.at = 0

    def get_copy_data(self, async_: int) -> tuple[int, memoryview]:
        at = self.at
        if at == len(self.frames):
            raise _Ended
        self.at = at + 1
        frame = self.frames[at]
        return len(frame), memoryview(frame)


class _Ended(Exception):
    pass


def make_frames(transactions: int, rows: int) -> list[bytes]:
    """A Relation, then `transactions` transactions of `rows` inserts of (int, text) each."""
    cols = [p.Column(1, "id", 23, -1), p.Column(0, "v", 25, -1)]
    frames = [p.encode_xlogdata(0, 0, 1, p.encode_relation(RELID, "public", "t", "d", cols))]
    lsn = 0x1000000
    for i in range(transactions):
        commit = lsn + 0x80 + rows
        frames.append(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(commit, 1000 + i, 700 + i)))
        for r in range(rows):
            row = [struct.pack("!i", i * rows + r), b"hello"]
            frames.append(p.encode_xlogdata(lsn + 8 + r, lsn + 8 + r, 1, p.encode_insert(RELID, row)))
        frames.append(p.encode_xlogdata(commit, commit, 1, p.encode_commit(commit, commit + 0x10, 1000 + i)))
        lsn += 0x100 + rows
    # (the reader's compiled loop drops what it read when a read fails, as at a lost
    # connection: a keepalive ends its last batch before `_Ended` does)
    frames.append(p.encode_keepalive(lsn, 1))
    return frames


def _events(frames: list[bytes]) -> EventStream:
    source = LiveSource("dn1", LiveOptions("", "bench", "bench"))
    items = source._copy_loop(_CannedCopy(frames), runs=True, pauses=None)  # type: ignore[arg-type]
    try:
        yield from checked_commit_times(((lsn, msg) for lsn, msg, _ in items), "dn1")
    except _Ended:
        return


def reader_alone(frames: list[bytes], transactions: int) -> float:
    t = time.process_time()
    for _ in _events(frames):
        pass
    return (time.process_time() - t) / transactions * 1e6


def _cpu_s(pids: list[int]) -> float:
    """The processes' CPU seconds (`loadkit.cpu_seconds`; 0 for one that is gone)."""
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def through_the_pool(
    frames: list[bytes], transactions: int, sender: bool
) -> tuple[float, float, int, float | None]:
    """(reader thread, whole process) CPU us per transaction, transactions released, and the
    decoder workers' CPU us per transaction (with the sender: read when the last is released)."""
    pool = DecoderPool("dn1", 2, binary=True)
    workers = [p.pid for p in pool._procs if p.pid is not None]
    workers_at_start = _cpu_s(workers)
    workers_us: float | None = None
    node = NodeSender("dn1", "single")
    reader_cpu: list[float] = []
    feed = pool._feed

    def timed_feed(events: Any, write_lines: bool, reports_pauses: bool) -> None:
        t0 = time.thread_time()
        feed(events, write_lines, reports_pauses)
        reader_cpu.append(time.thread_time() - t0)

    pool._feed = timed_feed  # type: ignore[method-assign]
    released = 0
    t = time.process_time()
    for lsn, item in pool.run(_events(frames), write_lines=True):
        if sender and not isinstance(item, BatchEnd):
            for txn in node.feed(lsn, item):
                released += len(txn.written.csns) if txn.written is not None else 1
            if released == transactions and workers_us is None:
                workers_us = (_cpu_s(workers) - workers_at_start) / transactions * 1e6
    whole = time.process_time() - t
    return reader_cpu[0] / transactions * 1e6, whole / transactions * 1e6, released, workers_us


def run(transactions: int, rows: int, repeat: int) -> dict[str, Any]:
    # as `csnd serve` tunes its interpreter (csnd.cli._tune_interpreter)
    sys.setswitchinterval(0.02)
    gc.set_threshold(100_000, *gc.get_threshold()[1:])
    frames = make_frames(transactions, rows)
    alone = min(reader_alone(frames, transactions) for _ in range(repeat))
    pooled = min(
        (through_the_pool(frames, transactions, sender=False) for _ in range(repeat)), key=lambda r: r[1]
    )
    full = min(
        (through_the_pool(frames, transactions, sender=True) for _ in range(repeat)), key=lambda r: r[1]
    )
    if full[2] != transactions:
        raise RuntimeError(f"the sender released {full[2]} of {transactions} transactions")
    return {
        "transactions": transactions,
        "rows_per_transaction": rows,
        "repeat": repeat,
        "threads_at_start": threading.active_count(),
        "us_per_txn": {
            "reader_alone": alone,
            "reader_thread_with_pool": pooled[0],
            "process_with_pool": pooled[1],
            "reader_thread_with_pool_and_sender": full[0],
            "process_with_pool_and_sender": full[1],
            "decoder_workers": full[3],
        },
    }


def markdown(r: dict[str, Any]) -> str:
    u = r["us_per_txn"]
    rows = [
        ("reader alone (copy loop, resume filter)", u["reader_alone"]),
        ("the reader's thread, with the pool's feed", u["reader_thread_with_pool"]),
        ("the whole process: reader, pool (2 workers), collector", u["process_with_pool"]),
        ("the whole process, with the sender", u["process_with_pool_and_sender"]),
        ("the 2 decoder workers (processes of their own), in that run", u.get("decoder_workers") or 0.0),
    ]
    head = f"{r['transactions']:,} transactions of {r['rows_per_transaction']} rows, best of {r['repeat']}"
    out = [f"| hot path ({head}) | CPU us per transaction |", "| --- | --- |"]
    out += [f"| {name} | {us:.1f} |" for name, us in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench hotpath", description=__doc__.split("\n\n")[0])
    ap.add_argument("--transactions", type=int, default=100_000, help="transactions (default 100,000)")
    ap.add_argument("--rows", type=int, default=1, help="inserts per transaction (default 1)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each figure; the best counts (default 3)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    results = run(args.transactions, args.rows, args.repeat)
    with open(out_path("hotpath.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    text = markdown(results)
    print(text, end="")
    return results


if __name__ == "__main__":
    main()
