"""A recorded stream of wide rows, written without a server: for tests, the demo and the benchmarks.

A single-mode, one-node stream of inserts into a table of the column types a
replay spends most of its time on (numeric, timestamptz, text, jsonb, int4[],
float8), `rows_per_txn` to a transaction, values from a seeded generator.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Final

from csnd.gtm import pgtypes as T
from csnd.reader.pgoutput import (
    Column,
    encode_begin,
    encode_commit,
    encode_insert,
    encode_relation,
    encode_xlogdata,
)
from csnd.reader.streamfile import StreamHeader, StreamWriter

ROWS_PER_TXN: Final = 50
COLUMNS: Final = (
    ("id", T.INT8),
    ("amount", T.NUMERIC),
    ("at", T.TIMESTAMPTZ),
    ("note", T.TEXT),
    ("doc", T.JSONB),
    ("tags", T.INT4_ARRAY),
    ("score", T.FLOAT8),
)


def write_wide_stream(
    path: str, rows: int, binary: bool = True, seed: int = 1, rows_per_txn: int = ROWS_PER_TXN
) -> int:
    """A single-mode stream of `rows` wide inserts, `rows_per_txn` a transaction; returns the number of changes."""
    rnd = random.Random(seed)
    relid = 16400
    cols = [Column(1 if name == "id" else 0, name, t.oid, -1) for name, t in COLUMNS]
    lsn = 0x1000000
    xid = 1000
    t_us = 817_000_000_000_000
    with StreamWriter(path, StreamHeader(node="bench", binary=binary, mode="single")) as w:
        w.write_frame(encode_xlogdata(0, 0, 0, encode_relation(relid, "public", "wide", "d", cols)))
        for start in range(0, rows, rows_per_txn):
            xid += 1
            first = lsn
            n = min(rows_per_txn, rows - start)
            commit_lsn = lsn + 200 * n + 100
            w.write_frame(encode_xlogdata(first, first, t_us, encode_begin(commit_lsn, t_us, xid)))
            for i in range(start, start + n):
                lsn += 200
                values = (
                    i,
                    Decimal(rnd.randrange(-(10**9), 10**9)) / 100,
                    t_us + rnd.randrange(10**12),
                    f"note {i} " + "x" * rnd.randrange(10, 80),
                    {"id": i, "tags": ["a", "b"], "n": rnd.random(), "ok": bool(i % 2)},
                    [rnd.randrange(1000) for _ in range(rnd.randrange(1, 6))],
                    rnd.random() * 1e6,
                )
                wires = [t.cell(v, binary)[0] for (_, t), v in zip(COLUMNS, values, strict=True)]
                w.write_frame(encode_xlogdata(lsn, lsn, t_us, encode_insert(relid, wires)))
            lsn = commit_lsn + 16
            t_us += 1000
            w.write_frame(encode_xlogdata(commit_lsn, lsn, t_us, encode_commit(commit_lsn, lsn, t_us)))
    return rows
