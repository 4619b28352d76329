"""The generator's value encoders against a real PostgreSQL 15.

pgoutput sends a column with the type's output function (text mode) or send
function (binary mode) -- the same functions that produce a query result in
text or binary format.  So each generated value is cast on the server from
our text form, and the raw result bytes of both formats must equal ours.
"""

from __future__ import annotations

import math
from decimal import Decimal
from random import Random
from typing import Any

import pytest

from csnd.gtm import pgtypes as T
from csnd.gtm.pgtypes import PgType
from csnd.gtm.randvalues import Values
from csnd.gtm.shapes import ColumnDef
from tests.fixtures.pg import PgDatabase

SQL_TYPE = {"_int4": "int4[]", "_text": "text[]", "varchar": "varchar(64)", "numeric": "numeric"}

EXTRA: dict[str, list[Any]] = {
    "float8": [
        0.1,
        -0.0,
        0.0,
        5e-324,
        1e300,
        math.nan,
        math.inf,
        -math.inf,
        1e15,
        1e16,
        123456789012345.0,
        42.0,
    ],
    "numeric": [Decimal("10.50"), Decimal("0.00"), Decimal("NaN"), Decimal("-123456.7890"), Decimal(10000)],
    "timestamptz": [0, -1, T.TIMESTAMP_INFINITY, T.TIMESTAMP_NEG_INFINITY, -315619200000000],
    "date": [0, -1, T.DATE_INFINITY, T.DATE_NEG_INFINITY],
    "_int4": [[], [1, None], [[1, 2], [3, None]]],
    "_text": [
        [],
        ["a b", "NULL", "null", "", 'x"y', "é", None, "a,b", "back\\s", "{x}"],
        [["a", None], ["c", "d"]],
    ],
    "jsonb": [T.JSONB_NULL, {"b": 1, "aa": [1, "x\ny"]}, "str", [], {}],
    "bytea": [b"", b"\x00\xff"],
    "int8": [(1 << 63) - 1, -(1 << 63), (1 << 53) + 1],
    "bool": [True, False],
}


def _samples(t: PgType, values: Values, n: int) -> list[Any]:
    gen = {
        "int4": values.int4,
        "int8": values.int8,
        "numeric": lambda: values.numeric(-1 if values.rng.random() < 0.5 else T.numeric_typmod(12, 2)),
        "timestamptz": values.timestamptz,
        "date": values.date,
        "text": values.short_text,
        "varchar": lambda: values.short_text(40),
        "float8": values.float8,
        "jsonb": values.jsonb,
        "_int4": values.int4_array,
        "_text": values.text_array,
        "bool": lambda: values.rng.random() < 0.5,
        "uuid": values.uuid,
        "bytea": values.bytea,
    }[t.name]
    out = [gen() for _ in range(n)] + EXTRA.get(t.name, [])
    return [v for v in out if v is not None]


@pytest.mark.parametrize("type_name", sorted(T.TYPES))
def test_encoders_match_server(pg: PgDatabase, type_name: str) -> None:
    t = T.TYPES[type_name]
    values = Values(Random(type_name), binary=True, toast_bytes=100)
    samples = _samples(t, values, 300)
    texts = [t.text(v) for v in samples]
    query = f"SELECT v::{SQL_TYPE.get(t.name, t.name)} FROM unnest(%s::text[]) WITH ORDINALITY AS u(v, i) ORDER BY i"
    with pg.connect() as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'; SET DateStyle = 'ISO'")
        cur.execute(query, (texts,), binary=False)
        res = cur.pgresult
        assert res is not None
        server_text = [res.get_value(i, 0) for i in range(res.ntuples)]
        cur.execute(query, (texts,), binary=True)
        res = cur.pgresult
        assert res is not None
        server_bin = [res.get_value(i, 0) for i in range(res.ntuples)]
    for v, text, st, sb in zip(samples, texts, server_text, server_bin, strict=True):
        assert st is not None and sb is not None
        assert bytes(st).decode() == text, f"{t.name} text form of {v!r}"
        assert bytes(sb) == t.binary(v), f"{t.name} binary form of {v!r}"


def test_json_forms() -> None:
    assert T.NUMERIC.json(Decimal("7.00")) == "7.00"
    assert T.NUMERIC.json(Decimal("NaN")) == "NaN"
    assert T.TIMESTAMPTZ.json(0) == "2000-01-01T00:00:00+00:00"
    assert T.TIMESTAMPTZ.json(1) == "2000-01-01T00:00:00.000001+00:00"
    assert T.TIMESTAMPTZ.json(-1) == "1999-12-31T23:59:59.999999+00:00"
    assert T.TIMESTAMPTZ.json(T.TIMESTAMP_INFINITY) == "infinity"
    assert T.DATE.json(-1) == "1999-12-31" and T.DATE.json(T.DATE_NEG_INFINITY) == "-infinity"
    assert T.BYTEA.json(b"\xab\x01") == "\\xab01"
    assert T.FLOAT8.json(math.nan) == "NaN" and T.FLOAT8.json(-math.inf) == "-Infinity"
    assert T.FLOAT8.json(-0.0) == -0.0
    assert T.JSONB.json(T.JSONB_NULL) is None
    assert T.INT4_ARRAY.json([[1, None]]) == [[1, None]]


def test_cells_are_mode_independent_except_wire() -> None:
    for t in T.TYPES.values():
        values = Values(Random(1), binary=True, toast_bytes=100)
        for v in _samples(t, values, 20):
            b, tx = t.cell(v, True), t.cell(v, False)
            assert isinstance(b[0], bytes) and isinstance(tx[0], str)
            assert b[1:] == tx[1:]


def test_generated_numeric_fits_typmod() -> None:
    values = Values(Random(3), binary=True, toast_bytes=100)
    typmod = T.numeric_typmod(10, 2)
    for _ in range(500):
        v = values.numeric(typmod)
        assert v.is_nan() or (v.as_tuple().exponent == -2 and abs(v) < 10**8)


def test_toast_generator_makes_big_values() -> None:
    values = Values(Random(4), binary=False, toast_bytes=3000)
    gen = values.generator(ColumnDef("body", T.TEXT), toast=True)
    sizes = [c[2] for c in (gen() for _ in range(200))]
    assert max(sizes) >= 3000 and 0 in sizes and min(s for s in sizes if s) < 100
