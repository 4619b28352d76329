"""A subscriber's table filter: cost per line by the number of names, and a large line whole or in pieces.

    python -m bench.filter_bench

Each line is a section 7 transaction of 1-5 changes (tests' mix).  "per-name
scan" is the first test as it was: a substring search of the line per name;
"one pass" is that test now (`may_hold`: the same search up to FEW_NAMES
names, one pass with set lookups past it); "keep" the whole filter (the
test, then the cut of the lines that hold a name).  The large line (about 24 MB, 400 changes)
is filtered whole (`keep`) and in 256 KiB pieces (`keep_pieces`), with the
peak of Python's allocations (tracemalloc) of each.
"""

from __future__ import annotations

import json
import time
import tracemalloc

from csnd.service.filtering import TableFilter
from tests.service.feedkit import change, line, txn_tables

LINES = 20_000


def per_line_us(fn: object, lines: list[bytes]) -> float:
    assert callable(fn)
    start = time.perf_counter()
    for raw in lines:
        fn(raw)
    return (time.perf_counter() - start) / len(lines) * 1e6


def big_line() -> bytes:
    changes = []
    for i in range(400):
        c = change(i, "public", "acct" if i % 50 == 0 else "orders")
        c["new"]["note"] = "x" * 60_000
        changes.append(c)
    obj: dict[str, object] = {
        "csn": 1,
        "gid": None,
        "commit_time": "2026-11-22T10:00:00+00:00",
        "nodes": {},
        "changes": changes,
    }
    return json.dumps(obj, ensure_ascii=False).encode()


def main() -> None:
    lines = [line(c, txn_tables(c)) for c in range(1, LINES + 1)]
    print(f"{'names':>6} {'per-name scan us/line':>22} {'one pass us/line':>17} {'keep us/line':>13}")
    for n in (1, 8, 9, 100, 1000, 5000):
        specs = ["public.acct"] + [f"public.t{i}" for i in range(n - 1)]
        filt = TableFilter(specs)
        needles = filt._needles

        def scan(raw: bytes, needles: tuple[bytes, ...] = needles) -> bool:
            return any(x in raw for x in needles)

        old = per_line_us(scan, lines) if n <= 1000 else per_line_us(scan, lines[:2000])
        first = per_line_us(filt.may_hold, lines)
        new = per_line_us(filt.keep, lines)
        print(f"{n:>6} {old:>22.2f} {first:>17.2f} {new:>13.2f}")
    big = big_line()
    filt = TableFilter(["public.acct"])
    for how in ("whole", "pieces"):
        tracemalloc.start()
        start = time.perf_counter()
        if how == "whole":
            kept = filt.keep(bytes(big))
        else:
            pieces = (big[i : i + (256 << 10)] for i in range(0, len(big), 256 << 10))
            kept = b"".join(filt.keep_pieces(pieces, 256 << 10))
        took = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert kept is not None
        print(f"large line {len(big) >> 20} MiB, {how}: {took:.2f} s, peak {peak / (1 << 20):.1f} MiB")


if __name__ == "__main__":
    main()
