"""The decoder's per-change cost, in one process: `python -m bench.rowbody_bench [--against REV]`.

`csnd replay`'s decoder rounds (bench/decode_bench.py) take minutes and
measure the whole pipeline; a change to what a decoder renders per change
(a key list, a new field) is measured here instead: `row_change_body`, the
workers' hot path, over the changes of a recorded stream, timed alone, best
of R rounds (the least disturbed by other load on a shared machine), for
the wide rows of `csnd.testing.widestream` and for narrow two-column rows,
where a fixed per-change cost weighs most.

`--against REV` loads `csnd/decoder/rows.py` as it was at git revision REV beside
the working tree's and alternates their rounds, so the drift of a shared
machine falls on both alike: the before/after figure of a change to the
decoder.  Prints µs per change and the bytes of one body.  On a machine
busy with other work the times still move by a fifth between rounds;
`--instructions` counts instead (valgrind's cachegrind, as
bench/decode_bench.py does): each module renders the changes once and three
times in processes of their own, and the difference over twice the changes
is its instructions a change, the same on every run to a fraction of a per
cent.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from csnd.decoder import rows
from csnd.gtm import pgtypes as T
from csnd.reader.pgoutput import (
    Change,
    Column,
    Relation,
    XLogData,
    encode_begin,
    encode_commit,
    encode_insert,
    encode_relation,
    encode_xlogdata,
    parse_frame,
    parse_message,
)
from csnd.reader.streamfile import StreamFileReader
from csnd.testing.widestream import write_wide_stream


def _changes(path: str) -> tuple[list[Relation], list[tuple[Any, ...]]]:
    """The Relation messages and the wired changes (`decode_batch`'s input) of a recorded stream."""
    relations: list[Relation] = []
    changes: list[tuple[Any, ...]] = []
    with StreamFileReader(path) as reader:
        for _, payload in reader:
            frame = parse_frame(payload)
            if not isinstance(frame, XLogData):
                continue
            msg = parse_message(frame.payload, False)
            lsn = frame.data_start
            if isinstance(msg, Relation):
                relations.append(msg)
            elif isinstance(msg, Change):
                changes.append((lsn, msg.kind, msg.xid, msg.relid, msg.data))
    return relations, changes


def _write_narrow(path: str, rows: int) -> None:
    """Inserts of (id int8 key, name text), 50 a transaction."""
    from csnd.reader.streamfile import StreamHeader, StreamWriter

    cols = [Column(1, "id", T.INT8.oid, -1), Column(0, "name", T.TEXT.oid, -1)]
    lsn, t_us = 0x1000000, 817_000_000_000_000
    with StreamWriter(path, StreamHeader(node="bench", binary=True, mode="single")) as w:
        w.write_frame(encode_xlogdata(0, 0, 0, encode_relation(16401, "public", "narrow", "d", cols)))
        for start in range(0, rows, 50):
            commit = lsn + 200 * 50 + 100
            w.write_frame(encode_xlogdata(lsn, lsn, t_us, encode_begin(commit, t_us, 1000 + start)))
            for i in range(start, min(start + 50, rows)):
                lsn += 200
                wires = [T.INT8.cell(i, True)[0], T.TEXT.cell(f"name {i}", True)[0]]
                w.write_frame(encode_xlogdata(lsn, lsn, t_us, encode_insert(16401, wires)))
            lsn = commit + 16
            w.write_frame(encode_xlogdata(commit, lsn, t_us, encode_commit(commit, lsn, t_us)))


def _rows_at(rev: str) -> ModuleType:
    """`csnd.decoder.rows` as it was at git revision `rev`, as a module of its own."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = subprocess.run(
        ["git", "-C", root, "show", f"{rev}:csnd/decoder/rows.py"], check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(f"rows_at_{rev}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its annotations look their module up)
    exec(compile(source, f"{rev}:csnd/decoder/rows.py", "exec"), module.__dict__)  # (our own file)
    return module


def _round(
    module: ModuleType, relations: list[Relation], changes: list[tuple[Any, ...]]
) -> tuple[float, str]:
    """Seconds to render every change as a worker does (`row_change_body` each), and the last body."""
    cache = module.RelationCache(binary=True)
    for r in relations:
        cache.apply(r)
    body = module.row_change_body
    out = ""
    t0 = time.perf_counter()
    for lsn, kind, xid, relid, data in changes:
        out = body(kind, xid, relid, data, lsn, cache, True)
    return time.perf_counter() - t0, out


def measure(path: str, rounds: int, modules: dict[str, ModuleType]) -> dict[str, dict[str, float]]:
    """Per module: the best round's µs a change and the bytes of a body; the modules' rounds alternate."""
    relations, changes = _changes(path)
    best = dict.fromkeys(modules, float("inf"))
    size = dict.fromkeys(modules, 0)
    for _ in range(rounds):
        for name, module in modules.items():
            secs, body = _round(module, relations, changes)
            best[name] = min(best[name], secs)
            size[name] = len(body)
    return {
        name: {
            "changes": len(changes),
            "us_per_change": best[name] / len(changes) * 1e6,
            "body_bytes": size[name],
        }
        for name in modules
    }


def _instructions(path: str, rev: str | None, times: int) -> int:
    """Instructions (cachegrind's I refs) of a process rendering the changes of `path` `times` times."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    cmd += [sys.executable, "-m", "bench.rowbody_bench", "--render", path, "--times", str(times)]
    cmd += ["--against", rev] if rev else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = re.search(r"I\s+refs:\s+([\d,]+)", proc.stderr)
    if proc.returncode or found is None:
        raise SystemExit(f"bench: rendering under valgrind failed: {proc.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def count(path: str, revs: dict[str, str | None]) -> dict[str, float]:
    """Per module (name -> its git revision, None: the tree's): instructions a change."""
    n = len(_changes(path)[1])
    return {
        name: (_instructions(path, rev, 3) - _instructions(path, rev, 1)) / (2 * n)
        for name, rev in revs.items()
    }


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    ap = argparse.ArgumentParser(prog="python -m bench.rowbody_bench", description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--against", metavar="REV", help="also measure csnd/decoder/rows.py as it was at this git revision"
    )
    ap.add_argument(
        "--instructions", action="store_true", help="count instructions (valgrind) instead of timing"
    )
    ap.add_argument("--render", metavar="FILE", help=argparse.SUPPRESS)  # (the process --instructions counts)
    ap.add_argument("--times", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.render:
        module = _rows_at(args.against) if args.against else rows
        relations, changes = _changes(args.render)
        for _ in range(args.times):
            _round(module, relations, changes)
        return {}
    revs: dict[str, str | None] = {"tree": None}
    modules = {"tree": rows}
    if args.against:
        revs = {args.against: args.against, "tree": None}
        modules = {args.against: _rows_at(args.against), "tree": rows}
    out: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as d:
        wide, narrow = os.path.join(d, "wide.pgstream"), os.path.join(d, "narrow.pgstream")
        write_wide_stream(wide, args.rows)
        _write_narrow(narrow, args.rows)
        for shape, path in (("wide", wide), ("narrow", narrow)):
            if args.instructions:
                counted = count(path, revs)
                out[shape] = {name: {"instructions_per_change": c} for name, c in counted.items()}
                for name, c in counted.items():
                    print(f"{shape:>6} {name:>8}: {c:,.0f} instructions a change")
                continue
            out[shape] = results = measure(path, args.rounds, modules)
            for name, r in results.items():
                print(
                    f"{shape:>6} {name:>8}: {r['us_per_change']:.3f} µs a change (best of {args.rounds}, "
                    f"{int(r['changes']):,} changes), {int(r['body_bytes'])} bytes a body"
                )
    return out


if __name__ == "__main__":
    main()
