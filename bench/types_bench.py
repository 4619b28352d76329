"""Decoder CPU per change by column type, compiled reader vs its Python twin: `python -m bench types`.

Two parts, both measured in this one run so that the drift of a shared
machine falls on both sides alike:

1. Per column type, in this process: a binary stream's inserts into a table
   of an int8 key and `WIDTH` columns of that type, decoded by
   `row_change_body` (the decoder workers' hot path), timed on the process's
   CPU clock, best of `ROUNDS`, once with the table's compiled row reader
   (`_rows.c`: the type written in C, or through its builder from C) and
   once with its Python twin (`rowreader._compile_row_reader`) -- the reader
   every row of such a table took while the compiled one wrote only eleven
   types (marked `native before`).
2. The issue's figure: `csnd replay --decoders 1` and `--decoders 2` over a
   recorded stream of `SCALING_ROWS` wide rows of such types (uuid, date,
   timestamp, float8, float4, interval, inet, int4[], text), with the Python
   row reader (`CSND_IMPL=python:csnd.decoder._rows`, as every such row was
   read before) and the compiled one, rounds alternated: rows a second, the
   median of the rounds' speedups of two decoders over one, and the
   machine's own two-process ratio beside each round (bench/decode_bench.py),
   which bounds what two decoders can show in that round.  (The decoders'
   CPU per change is part 1's figure: they run under the fork server, whose
   children a replay's `getrusage` does not see.)
"""

from __future__ import annotations

import argparse
import filecmp
import ipaddress
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final

from bench.common import out_path
from bench.decode_bench import machine_parallel_ratio
from csnd.decoder import RelationCache, rowreader, rows
from csnd.gtm import pgtypes as T
from csnd.reader.pgoutput import (
    Column,
    Relation,
    encode_begin,
    encode_commit,
    encode_insert,
    encode_relation,
    encode_xlogdata,
    parse_message,
)
from csnd.reader.streamfile import StreamHeader, StreamWriter

WIDTH: Final = 8  # columns of the type measured, beside the int8 key
CHANGES: Final = 10_000  # inserts per type and round
ROUNDS: Final = 5
SCALING_ROWS: Final = 200_000
SCALING_ROUNDS: Final = 3
# The types the compiled reader wrote before it took every table (`jsontext._COMPILED_TYPES` then).
NATIVE_BEFORE: Final = frozenset(("int2", "int4", "int8", "bool", "text", "numeric", "timestamptz", "jsonb"))

_Q = struct.Struct("!q").pack
_I = struct.Struct("!i").pack
_F = struct.Struct("!f").pack
_IV = struct.Struct("!qii").pack


def _inet(rnd: random.Random) -> bytes:
    return b"\x02\x20\x00\x04" + ipaddress.IPv4Address(rnd.getrandbits(32)).packed


# (name, oid, a random value's binary send form)
TYPES: Final[list[tuple[str, int, Callable[[random.Random], bytes]]]] = [
    ("int8", 20, lambda r: T.INT8.binary(r.randrange(-(10**12), 10**12))),
    ("int4", 23, lambda r: T.INT4.binary(r.randrange(-(10**9), 10**9))),
    ("bool", 16, lambda r: bytes([r.randrange(2)])),
    ("text", 25, lambda r: T.TEXT.binary("note " + "x" * r.randrange(5, 40))),
    ("numeric", 1700, lambda r: T.NUMERIC.binary(Decimal(r.randrange(-(10**9), 10**9)) / 100)),
    ("timestamptz", 1184, lambda r: _Q(r.randrange(10**15))),
    ("jsonb", 3802, lambda r: T.JSONB.binary({"id": r.randrange(1000), "ok": True})),
    ("timestamp", 1114, lambda r: _Q(r.randrange(10**15))),
    ("date", 1082, lambda r: _I(r.randrange(-10_000, 10_000))),
    ("uuid", 2950, lambda r: uuid.UUID(int=r.getrandbits(128)).bytes),
    ("float8", 701, lambda r: T.FLOAT8.binary(r.random() * 1e6)),
    ("bytea", 17, lambda r: r.randbytes(r.randrange(4, 32))),
    ("float4", 700, lambda r: _F(r.random() * 1e3)),
    ("interval", 1186, lambda r: _IV(r.randrange(10**11), r.randrange(-40, 40), r.randrange(24))),
    ("inet", 869, _inet),
    ("time", 1083, lambda r: _Q(r.randrange(86_400_000_000))),
    ("int4[]", 1007, lambda r: T.INT4_ARRAY.binary([r.randrange(1000) for _ in range(r.randrange(1, 6))])),
    ("text[]", 1009, lambda r: T.TEXT_ARRAY.binary(["a", "b c", "d"][: r.randrange(1, 4)])),
    ("json", 114, lambda r: f'{{"id": {r.randrange(1000)}}}'.encode()),
]


def _relation(relid: int, type_oids: list[int]) -> Relation:
    cols = [Column(1, "id", 20, -1)] + [Column(0, f"c{i}", oid, -1) for i, oid in enumerate(type_oids)]
    msg = parse_message(encode_relation(relid, "public", "t", "d", cols), False)
    assert isinstance(msg, Relation)
    return msg


def _cpu_per_change(cache: RelationCache, relid: int, datas: list[bytes]) -> float:
    """Best of ROUNDS: CPU microseconds per `row_change_body` of each insert."""
    body = rows.row_change_body
    best = float("inf")
    for _ in range(ROUNDS):
        t0 = time.process_time()
        for lsn, data in enumerate(datas, 0x1000):
            body("I", None, relid, data, lsn, cache, True)
        best = min(best, time.process_time() - t0)
    return best / len(datas) * 1e6


def per_type() -> list[dict[str, Any]]:
    results = []
    for relid, (name, oid, make) in enumerate(TYPES, 16500):
        rnd = random.Random(relid)
        cache = RelationCache(binary=True)
        cache.apply(_relation(relid, [oid] * WIDTH), 0x100)
        table = cache.table(relid)
        datas = [
            encode_insert(relid, [T.INT8.binary(i), *(make(rnd) for _ in range(WIDTH))])[5:]
            for i in range(CHANGES)
        ]
        compiled = table.read_row
        twin = rowreader._compile_row_reader(table.json_columns, True)
        assert all(compiled(d, 1, len(d)) == twin(d, 1, len(d)) is not None for d in datas[:200]), name
        row: dict[str, Any] = {"type": name, "native_before": name in NATIVE_BEFORE}
        for side, reader in (("python_us", twin), ("compiled_us", compiled), ("python_us_2", twin)):
            table.read_row = reader
            row[side] = _cpu_per_change(cache, relid, datas)
        row["python_us"] = min(row["python_us"], row.pop("python_us_2"))
        row["compiled_code"] = bytes(compiled.args[0]).decode()[0] if hasattr(compiled, "args") else "-"
        results.append(row)
        print(
            f"bench: {name:12} python {row['python_us']:6.2f} us  compiled {row['compiled_us']:6.2f} us "
            f"a change of {WIDTH} columns",
            file=sys.stderr,
        )
    return results


# The wide row of the scaling part: the kinds of columns that took the Python reader before.
SCALING_COLUMNS: Final = [("uuid", 2950), ("date", 1082), ("timestamp", 1114), ("float8", 701),
                          ("float4", 700), ("interval", 1186), ("inet", 869), ("int4[]", 1007), ("text", 25)]  # fmt: skip


def write_scaling_stream(path: str, n: int, per_txn: int = 50) -> None:
    makers = {name: make for name, _, make in TYPES}
    rnd = random.Random(7)
    relid = 16400
    lsn, t_us, xid = 0x1000000, 817_000_000_000_000, 1000
    with StreamWriter(path, StreamHeader(node="bench", binary=True, mode="single")) as w:
        msg = encode_relation(
            relid, "public", "wide", "d", _relation(relid, [o for _, o in SCALING_COLUMNS]).columns
        )
        w.write_frame(encode_xlogdata(0, 0, 0, msg))
        for start in range(0, n, per_txn):
            xid += 1
            count = min(per_txn, n - start)
            commit_lsn = lsn + 200 * count + 100
            w.write_frame(encode_xlogdata(lsn, lsn, t_us, encode_begin(commit_lsn, t_us, xid)))
            for i in range(start, start + count):
                lsn += 200
                values: list[bytes | str | None] = [T.INT8.binary(i)]
                values += [makers[name](rnd) for name, _ in SCALING_COLUMNS]
                w.write_frame(encode_xlogdata(lsn, lsn, t_us, encode_insert(relid, values)))
            lsn = commit_lsn + 16
            t_us += 1000
            w.write_frame(encode_xlogdata(commit_lsn, lsn, t_us, encode_commit(commit_lsn, lsn, t_us)))


IMPLS: Final = {"python": "python:csnd.decoder._rows", "compiled": ""}


def _replay(path: str, decoders: int, impl: str) -> dict[str, float]:
    out = out_path(f"types-{impl}-{decoders}.jsonl")
    if os.path.exists(out):
        os.unlink(out)
    env = {**os.environ, "CSND_IMPL": IMPLS[impl]}
    cmd = [sys.executable, "-m", "csnd.cli", "replay", path, "--decoders", str(decoders), "--output", out]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench: replay failed: {proc.stderr.strip()}")
    return {"seconds": secs}


def scaling(rows_n: int = SCALING_ROWS, rounds: int = SCALING_ROUNDS) -> dict[str, Any]:
    path = out_path("types-wide.pgstream")
    print(
        f"bench: writing {rows_n} wide rows of {len(SCALING_COLUMNS)} such columns to {path} ...",
        file=sys.stderr,
    )
    write_scaling_stream(path, rows_n)
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(i, d): [] for i in IMPLS for d in (1, 2)}
    machine = []
    for r in range(rounds):
        machine.append(machine_parallel_ratio())
        for impl in IMPLS:
            for decoders in (1, 2):
                print(
                    f"bench: round {r + 1}/{rounds}: {impl} rows, --decoders {decoders} ...", file=sys.stderr
                )
                runs[(impl, decoders)].append(_replay(path, decoders, impl))
    result: dict[str, Any] = {
        "rows": rows_n,
        "rounds": rounds,
        "machine_ratio_median": statistics.median(machine),
    }
    for impl in IMPLS:
        one, two = runs[(impl, 1)], runs[(impl, 2)]
        result[impl] = {
            "rows_per_s_1": rows_n / min(x["seconds"] for x in one),
            "rows_per_s_2": rows_n / min(x["seconds"] for x in two),
            "speedup_median": statistics.median(
                a["seconds"] / b["seconds"] for a, b in zip(one, two, strict=True)
            ),
        }
    result["outputs_identical"] = filecmp.cmp(
        out_path("types-python-1.jsonl"), out_path("types-compiled-2.jsonl"), shallow=False
    )
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench types", description=__doc__.split("\n")[0])
    parser.add_argument("--scaling-rows", type=int, default=SCALING_ROWS)
    parser.add_argument("--rounds", type=int, default=SCALING_ROUNDS)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"per_type": per_type(), "scaling": scaling(args.scaling_rows, args.rounds)}
    print(f"\n| column type ({WIDTH} a row) | native before | Python reader | compiled reader |")
    print("| --- | --- | --- | --- |")
    for row in results["per_type"]:
        print(
            f"| {row['type']} | {'yes' if row['native_before'] else 'no'} | {row['python_us']:.2f} us | "
            f"{row['compiled_us']:.2f} us |"
        )
    s = results["scaling"]
    for impl in IMPLS:
        x = s[impl]
        print(
            f"{impl} rows: 1 decoder {x['rows_per_s_1']:,.0f} rows/s, 2 decoders {x['rows_per_s_2']:,.0f} rows/s, "
            f"speedup (median of rounds) {x['speedup_median']:.2f}"
        )
    print(
        f"machine's own 2-process ratio {s['machine_ratio_median']:.2f}; outputs identical: {s['outputs_identical']}"
    )
    with open(out_path("types.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
