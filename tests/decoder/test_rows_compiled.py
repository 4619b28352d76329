"""`_rows.c` against its twins: the row reader compiled in Python, and `csnd.core.lines.one_change_line`."""

from __future__ import annotations

import json
import os
import random
import struct
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import TimestampError
from csnd.core.ids import PG_TIME_MAX_US, PG_TIME_MIN_US
from csnd.core.lines import node_key, one_change_line
from csnd.decoder import RelationCache, rowreader
from csnd.decoder.rows import row_change_body
from csnd.decoder.values import float4_shortest
from csnd.gtm.pgtypes import TEXT_ARRAY, float8_text, numeric_binary, numeric_text
from csnd.reader import pgoutput as p
from csnd.reader.pgoutput import Column, Relation

try:
    from csnd.decoder._rows import one_change_line as one_change_line_c
    from csnd.decoder._rows import read_row as read_row_c
except ImportError:  # (reported by test_the_compiled_row_reader_is_built)
    read_row_c = None  # type: ignore[assignment]
    one_change_line_c = None  # type: ignore[assignment]

# The types the compiled reader writes itself, with their OIDs (then some it writes through their builders).
TYPES = {
    "int2": 21,
    "int4": 23,
    "int8": 20,
    "bool": 16,
    "text": 25,
    "varchar": 1043,
    "bpchar": 1042,
    "name": 19,
    "numeric": 1700,
    "timestamptz": 1184,
    "jsonb": 3802,
    "timestamp": 1114,
    "date": 1082,
    "uuid": 2950,
    "bytea": 17,
    "float8": 701,
    "float4": 700,
    "time": 1083,
    "interval": 1186,
    "int2[]": 1005,
    "int4[]": 1007,
    "int8[]": 1016,
}
# Types it writes through the column's builders (code 'S' or '?').
BUILT = {
    "inet": 869,
    "text[]": 1009,
    "json": 114,
    "oid": 26,
}
ALL_TYPES = {**TYPES, **BUILT}
SIZES = {"int2": 2, "int4": 4, "int8": 8}
# Characters JSON escapes, or that are not ASCII, among plain ones: where a writer's escaping goes wrong.
_ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)  # (a backslash or a quote alone among them)
_TRICKY = st.sampled_from(list('ab %"\\/\n\r\t\b\f\x01\x1f\x7f\x80üé€😀\u2028'))
# timestamptz in binary, microseconds from 2000: years 1-9999, and the infinities and beyond
_TIMES = st.integers(PG_TIME_MIN_US, PG_TIME_MAX_US) | st.sampled_from([0, -1, 2**63 - 1, -(2**63)])
_DECIMALS = st.integers(0, 8).flatmap(
    lambda k: st.decimals(
        allow_nan=False, allow_infinity=False, places=k, min_value=-(10**12), max_value=10**12
    )
) | st.decimals(allow_nan=False, allow_infinity=False, min_value=-(10**30), max_value=10**30)
_NUMERIC_SPECIALS = [struct.pack("!HhHH", 0, 0, sign, 0) for sign in (0xC000, 0xD000, 0xF000)]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(_TRICKY, max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(_TRICKY, max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


def _relation(types: list[str], relid: int = 16500) -> Relation:
    columns = [Column(1 if i == 0 else 0, f'c{i} é"%', ALL_TYPES[t], -1) for i, t in enumerate(types)]
    m = p.parse_message(p.encode_relation(relid, "public", "t", "d", columns), False)
    assert isinstance(m, Relation)
    return m


def _value(kind: bytes, raw: bytes) -> bytes:
    return kind + struct.pack("!i", len(raw)) + raw


@st.composite
def _cell(draw: st.DrawFn, type_name: str) -> bytes:
    """One column's bytes in a tuple: mostly what PostgreSQL sends, sometimes anything."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return b"n"
    if choice == 1:
        return draw(st.sampled_from([b"u", b"x", b""]))  # unchanged TOAST, an unknown kind, nothing
    if choice == 2:  # any bytes as a binary or text value
        return _value(draw(st.sampled_from([b"b", b"t"])), draw(st.binary(max_size=10)))
    if type_name in SIZES:
        size = SIZES[type_name]
        n = draw(st.integers(-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1))
        if choice <= 6:
            return _value(b"b", n.to_bytes(size, "big", signed=True))
        text = draw(st.sampled_from([str(n), f"0{n}", f"+{n}", f" {n}", "-0", "0", f"{n}_0"]))
        return _value(b"t", text.encode())
    if type_name == "numeric":
        if choice <= 6:
            v = draw(_DECIMALS)
            raw = draw(st.sampled_from([numeric_binary(v), *_NUMERIC_SPECIALS, numeric_binary(v)[:-1]]))
            return _value(b"b", raw)
        return _value(
            b"t", draw(st.sampled_from([numeric_text(draw(_DECIMALS)), "NaN", "1e5", " 1"])).encode()
        )
    if type_name == "timestamptz":
        if choice <= 6:
            return _value(b"b", struct.pack("!q", draw(_TIMES)))
        return _value(b"t", b"2026-11-27 10:00:00+00")
    if type_name == "jsonb":
        doc = json.dumps(draw(_JSON), ensure_ascii=False).encode()
        doc = draw(st.sampled_from([doc, doc[:-1], b"", b"x" + doc]))
        return _value(b"b", b"\x01" + doc) if choice <= 6 else _value(b"t", doc)
    if type_name == "bool":
        if choice <= 6:
            return _value(b"b", draw(st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x01\x00"])))
        return _value(b"t", draw(st.sampled_from([b"t", b"f", b"true", b"T"])))
    if type_name in _ODD_CELLS:
        binary, texts = _ODD_CELLS[type_name]
        if choice <= 6:
            return _value(b"b", draw(binary))
        return _value(b"t", draw(texts).encode("utf-8", "surrogatepass"))
    text = draw(st.text(_TRICKY, max_size=12) | st.text(_ASCII, max_size=12) | st.text(max_size=12))
    return _value(b"b" if choice <= 6 else b"t", text.encode("utf-8", "surrogatepass"))


_ARRAY_ELEMENTS = {"int2[]": (21, "!h", 16), "int4[]": (23, "!i", 32), "int8[]": (20, "!q", 64)}


def _int_array(type_name: str, values: list[Any]) -> bytes:
    """array_send of a list (of lists: two dimensions) of ints and Nones."""
    oid, code, _ = _ARRAY_ELEMENTS[type_name]
    rows = values if values and isinstance(values[0], list) else [values]
    flat = [v for r in rows for v in r]
    if not flat:
        return struct.pack("!iiI", 0, 0, oid)
    dims = [(len(rows), 1), (len(rows[0]), 1)] if rows is values else [(len(flat), 1)]
    head = struct.pack("!iiI", len(dims), int(None in flat), oid) + b"".join(
        struct.pack("!ii", *d) for d in dims
    )
    size = struct.calcsize(code)
    return head + b"".join(
        struct.pack("!i", -1) if v is None else struct.pack("!i", size) + struct.pack(code, v) for v in flat
    )


def _int_lists(type_name: str) -> st.SearchStrategy[list[Any]]:
    bits = _ARRAY_ELEMENTS[type_name][2]
    ints = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) | st.none()
    return st.lists(ints, max_size=5) | st.integers(1, 3).flatmap(
        lambda w: st.lists(st.lists(ints, min_size=w, max_size=w), min_size=1, max_size=3)
    )


def _int_array_text(values: list[Any]) -> str:
    if values and isinstance(values[0], list):
        return "{" + ",".join(_int_array_text(v) for v in values) + "}"
    return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"


_STAMP_TEXTS = [
    "2026-11-27 10:00:00", "2026-11-27 10:00:00.5", "2026-11-27 10:00:00.123456", "2026-11-27 10:00:00.1234567",
    "2026-11-27 10:00:00+00", "2026-11-27 10:00:00.25+00:00", "2026-11-27 10:00:00-00", "2026-11-27 10:00:00+00:00:00",
    "2026-11-27 10:00:00+05:30", "2026-11-27 10:00:00+00:00:01", "2026-11-27 10:00:00+00 BC", "0044-03-15 10:00:00 BC",
    "12026-01-01 00:00:00", "infinity", "-infinity", "2026-11-27T10:00:00", "2026-11-27 10:00:00.", "٢٠٢٦-11-27 10:00:00",
]  # fmt: skip
_FLOATS = st.floats() | st.sampled_from(
    [0.0, -0.0, 5e-324, 1e16, 1e15, 0.1, float("nan"), float("inf"), -float("inf")]
)
# Per type: (binary values, text values) of PostgreSQL's own forms and near misses.
_ODD_CELLS: dict[str, tuple[st.SearchStrategy[bytes], st.SearchStrategy[str]]] = {
    "timestamp": (st.builds(struct.Struct("!q").pack, _TIMES), st.sampled_from(_STAMP_TEXTS)),
    "timestamptz": (st.builds(struct.Struct("!q").pack, _TIMES), st.sampled_from(_STAMP_TEXTS)),
    "date": (
        st.builds(struct.Struct("!i").pack, st.integers(-(2**31), 2**31 - 1) | st.integers(-800_000, 3_000_000)),
        st.sampled_from(["2026-01-01", "infinity", "-infinity", "0044-03-15 BC", "2026-1-01", "20261-01-01", "2026/01/01"]),
    ),
    "uuid": (st.binary(min_size=15, max_size=17), st.uuids().map(str) | st.text(_TRICKY, max_size=5)),
    "bytea": (
        st.binary(max_size=300),
        st.binary(max_size=20).map(lambda b: "\\x" + b.hex())
        | st.sampled_from(["\\xABCD", "\\x0", "\\x 00", "abc\\000", "\\x", "x00"]),
    ),
    "float8": (
        st.builds(struct.Struct("!d").pack, _FLOATS),
        st.builds(float8_text, _FLOATS.filter(lambda x: x == x and abs(x) != float("inf")))
        | st.sampled_from(["NaN", "Infinity", "-Infinity", "1e5", " 1", "1_0", "inf", "1e999", ".", "-0", "+.5e-3"]),
    ),
    "float4": (
        st.builds(struct.Struct("!I").pack, st.integers(0, 2**32 - 1)) | st.builds(struct.Struct("!f").pack, st.floats(width=32)),
        st.sampled_from(["0.1", "NaN", "1e39", "3.4028235e38", "3.4028234e38", "x", "-0", "1e-46"])
        | st.sampled_from(["Infinity", "-Infinity", "inf", "-1.5e-3", "+.5", "1e999", " 1", ""]),
    ),
    "interval": (
        st.binary(min_size=16, max_size=16)
        | st.tuples(
            st.integers(-(2**63), 2**63 - 1) | st.integers(-(10**11), 10**11) | st.just(0),
            st.integers(-(2**31), 2**31 - 1) | st.integers(-3, 3),
            st.integers(-(2**31), 2**31 - 1) | st.integers(-25, 25),
        ).map(lambda v: struct.pack("!qii", *v)),
        st.sampled_from(["1 day", "-00:00:01", ""]),
    ),
    "inet": (st.sampled_from([b"\x02\x20\x00\x04\x0a\x00\x00\x01", b"\x02\x08\x01\x04\x0a\x00\x00\x00"]), st.just("10.0.0.1")),
    **{
        t: (
            _int_lists(t).map(lambda v, t=t: _int_array(t, v))  # type: ignore[misc]
            | _int_lists(t).map(lambda v, t=t: _int_array(t, v)[:-1])  # type: ignore[misc]
            | _int_lists("int2[]").map(lambda v, t=t: _int_array("int4[]" if t == "int2[]" else "int2[]", v)),  # type: ignore[misc]
            st.sampled_from(["{1,NULL}", "{}", "{{1,2},{3,4}}", "[0:1]={1,2}", "{1,x}"]),
        )
        for t in ("int2[]", "int4[]", "int8[]")
    },
    "text[]": (st.lists(st.text(_TRICKY, max_size=3), max_size=3).map(TEXT_ARRAY.binary), st.just('{"a b",NULL}')),
    "time": (
        st.binary(min_size=8, max_size=8) | st.integers(0, 86_400_000_000).map(struct.Struct("!q").pack),
        st.just("24:00:00"),
    ),
    "json": (st.builds(lambda v: json.dumps(v).encode(), _JSON), st.sampled_from(['{"a": 1}', "[1,", "1e400"])),
    "oid": (st.binary(min_size=3, max_size=5), st.sampled_from(["0", "4294967295", "-1", "07"])),
}  # fmt: skip


@st.composite
def _table_and_tuple(draw: st.DrawFn) -> tuple[list[str], bytes, int]:
    types = draw(st.lists(st.sampled_from(sorted(ALL_TYPES)), min_size=1, max_size=5))
    cells = [draw(_cell(t)) for t in types]
    count = len(types) + draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
    data = b"N" + struct.pack("!h", count) + b"".join(cells)
    cut = draw(st.none() | st.integers(0, len(data)))
    if cut is not None:
        data = data[:cut]
    end = draw(st.sampled_from([len(data), len(data), max(len(data) - 1, 0)]))
    return types, data, end


def _readers(types: list[str], binary: bool) -> tuple[Any, Any]:
    cache = RelationCache(binary=binary)
    cache.apply(_relation(types), 0)
    table = cache.table(16500)
    return table.read_row, rowreader._compile_row_reader(table.json_columns, binary)


def test_the_compiled_row_reader_is_built() -> None:
    """`make test` installs with a C compiler: the decoders must not fall back unnoticed."""
    assert read_row_c is not None, "csnd.decoder._rows was not built (is a C compiler installed?)"
    compiled, _ = _readers(["int8", "int4"], True)
    if os.environ.get("CSND_IMPL", "").lower() == "python":  # (asked for the twins)
        assert not isinstance(compiled, partial)
    else:
        assert isinstance(compiled, partial) and compiled.func is read_row_c


def test_a_table_of_any_column_types_gets_the_compiled_reader() -> None:
    """Every table takes the compiled reader: a column it does not write itself goes through its builders."""
    if os.environ.get("CSND_IMPL", "").lower() == "python":
        return  # (asked for the twins: test_the_compiled_row_reader_is_built checks that)
    cache = RelationCache(binary=True)
    columns = [
        Column(1, "id", 20, -1),
        Column(0, "u", 2950, -1),
        Column(0, "iv", 1186, -1),
        Column(0, "q", 600, -1),
    ]
    m = p.parse_message(
        p.encode_relation(16501, "public", "u", "d", columns), False
    )  # int8, uuid, interval, point
    assert isinstance(m, Relation)
    cache.apply(m, 0)
    reader = cache.table(16501).read_row
    assert isinstance(reader, partial) and reader.func is read_row_c
    # (point: its text form a JSON string, its binary one built -- and refused)
    assert reader.args[0] == b"quVS"


@settings(max_examples=400, deadline=None)
@given(case=_table_and_tuple(), binary=st.booleans())
def test_the_compiled_reader_says_what_its_twin_says_or_gives_up(
    case: tuple[list[str], bytes, int], binary: bool
) -> None:
    """The same JSON and end for any tuple -- or None, which sends the caller to the checked path.

    The compiled reader may give up where the twin would not (an integer in a
    form that is not PostgreSQL's own); the checked path then writes the twin's
    text.  It gives up no more than that: on PostgreSQL's own forms the two agree.
    """
    types, data, end = case
    compiled, twin = _readers(types, binary)
    got, want = compiled(data, 1, end), twin(data, 1, end)
    assert got == want or got is None
    # (jsonb's text is checked at its ends only, a sanity check of what PostgreSQL
    # sends: one damaged inside, as `[[]`, passes both readers alike; PostgreSQL's own
    # jsonb is held to valid JSON in the test below)
    if got is not None and "jsonb" not in types:
        _assert_row_object(got[0], types)


@pytest.mark.parametrize("text", [b"nul", b"tru", b"fals", b"nulll", b"nuxl", b"te"])
def test_a_jsonb_literal_is_taken_only_whole(text: bytes) -> None:
    # ("nul", a null cut short, has a literal's two ends and is no JSON: Hypothesis found it)
    for binary in (True, False):
        compiled, twin = _readers(["jsonb"], binary)
        for cell in (_value(b"b", b"\x01" + text), _value(b"t", text)):
            row = b"N" + struct.pack("!h", 1) + cell
            assert compiled(row, 1, len(row)) is None and twin(row, 1, len(row)) is None
        whole = b"N" + struct.pack("!h", 1) + _value(b"t", b"null")
        assert compiled(whole, 1, len(whole)) == twin(whole, 1, len(whole)) is not None


def _assert_row_object(body: str, types: list[str]) -> None:
    assert list(json.loads(body)) == [f'c{i} é"%' for i in range(len(types))]


def _stamp_text(us: int, utc: bool) -> str:
    """timestamp(tz)_out in DateStyle ISO, TimeZone UTC, for years 1-9999 (strftime's %Y is not zero-padded)."""
    t = datetime(2000, 1, 1) + timedelta(microseconds=us)
    frac = f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d} {t:%H:%M:%S}{frac}{'+00' if utc else ''}"


def _float4_text(bits: int) -> str:
    """float4out's text of a float4 bit pattern (its shortest decimal, as `float4_shortest` finds it)."""
    x = struct.unpack("!f", struct.pack("!I", bits))[0]
    if x != x:
        return "NaN"
    if x in (float("inf"), -float("inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return repr(float4_shortest(x))


def _date_text(days: int) -> str:
    d = date(2000, 1, 1) + timedelta(days=days)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}"


_US = st.integers(PG_TIME_MIN_US, PG_TIME_MAX_US)
_DAYS = st.integers(-730_119, 2_921_939)  # years 1-9999
_REAL_FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [float("nan"), float("inf")]
)
# What PostgreSQL sends for types outside `_own_cell`'s own: (binary, text, values).
_OWN_CELLS: dict[str, tuple[Any, Any, st.SearchStrategy[Any]]] = {
    "timestamp": (struct.Struct("!q").pack, lambda us: _stamp_text(us, False), _US),
    "date": (struct.Struct("!i").pack, _date_text, _DAYS),
    "uuid": (lambda u: u.bytes, str, st.uuids()),
    "bytea": (bytes, lambda b: "\\x" + b.hex(), st.binary(max_size=40)),
    "float8": (struct.Struct("!d").pack, lambda x: "NaN" if x != x else float8_text(x), _REAL_FLOATS),
    "float4": (
        struct.Struct("!I").pack,
        lambda bits: _float4_text(bits),
        st.integers(0, 2**32 - 1).filter(lambda b: b & 0x7F800000 != 0x7F800000) | st.sampled_from([0x7FC00000, 0x7F800000]),
    ),
    "interval": (lambda v: struct.pack("!qii", *v), lambda v: "1 day", st.tuples(st.integers(-(10**12), 10**12), st.integers(-1000, 1000), st.integers(-100, 100))),
    "inet": (lambda b: b"\x02\x20\x00\x04" + b, lambda b: ".".join(map(str, b)), st.binary(min_size=4, max_size=4)),
    **{
        t: (lambda v, t=t: _int_array(t, v), _int_array_text, _int_lists(t))
        for t in ("int2[]", "int4[]", "int8[]")
    },
    "text[]": (TEXT_ARRAY.binary, TEXT_ARRAY.text, st.lists(st.text(_ASCII, max_size=3) | st.none(), max_size=3)),
    "time": (struct.Struct("!q").pack, lambda us: "10:00:00", st.integers(0, 86_400_000_000)),
    "json": (lambda v: json.dumps(v).encode(), json.dumps, _JSON),
    "oid": (struct.Struct("!I").pack, str, st.integers(0, 2**32 - 1)),
}  # fmt: skip


@st.composite
def _own_cell(draw: st.DrawFn, type_name: str, binary: bool) -> bytes:
    """A value as PostgreSQL sends it: binary in a binary stream, else its output function's text."""
    if draw(st.integers(0, 5)) == 0:
        return b"n"
    if type_name in SIZES:
        size = SIZES[type_name]
        n = draw(st.integers(-(2 ** (8 * size - 1)), 2 ** (8 * size - 1) - 1))
        return _value(b"b", n.to_bytes(size, "big", signed=True)) if binary else _value(b"t", str(n).encode())
    if type_name == "bool":
        v = draw(st.booleans())
        return _value(b"b", bytes([v])) if binary else _value(b"t", b"t" if v else b"f")
    if type_name == "numeric":
        if draw(st.integers(0, 9)) == 0:
            raw = draw(st.sampled_from(_NUMERIC_SPECIALS))
            return _value(b"b", raw) if binary else _value(b"t", b"NaN")
        number = draw(_DECIMALS)
        return _value(b"b", numeric_binary(number)) if binary else _value(b"t", numeric_text(number).encode())
    if type_name == "timestamptz":  # (in years 1-9999; text in TimeZone UTC)
        us = draw(_US)
        return _value(b"b", struct.pack("!q", us)) if binary else _value(b"t", _stamp_text(us, True).encode())
    if type_name == "jsonb":
        doc = json.dumps(draw(_JSON), ensure_ascii=False).encode()
        return _value(b"b", b"\x01" + doc) if binary else _value(b"t", doc)
    if type_name in _OWN_CELLS:
        to_binary, to_text, values = _OWN_CELLS[type_name]
        v = draw(values)
        return _value(b"b", to_binary(v)) if binary else _value(b"t", to_text(v).encode())
    plain = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
    text = draw(
        st.text(_ASCII, max_size=12)
        | st.text(_TRICKY.filter(lambda c: c != "\x00"), max_size=12)
        | st.text(plain, max_size=12)
    )
    return _value(b"b" if binary else b"t", text.encode())


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    types=st.lists(st.sampled_from(sorted(ALL_TYPES)), min_size=1, max_size=6),
    binary=st.booleans(),
)
def test_on_what_postgresql_sends_the_compiled_reader_never_gives_up(
    data: st.DataObject, types: list[str], binary: bool
) -> None:
    cells = [data.draw(_own_cell(t, binary)) for t in types]
    row = b"N" + struct.pack("!h", len(types)) + b"".join(cells)
    compiled, twin = _readers(types, binary)
    got = compiled(row, 1, len(row))
    assert got is not None and got == twin(row, 1, len(row)) and got[1] == len(row)
    _assert_row_object(got[0], types)


@pytest.mark.parametrize("binary", [True, False])
def test_a_decoder_writes_the_same_body_with_either_reader(binary: bool) -> None:
    types = ["int8", "int4", "bool", "text", "varchar"]
    compiled, twin = _readers(types, binary)
    cells = [
        _value(b"b", (1 << 40).to_bytes(8, "big", signed=True)),
        b"n",
        _value(b"b", b"\x01"),
        _value(b"b", 'a "quoted"\n\ttab, ü and \x7f'.encode()),
        _value(b"t", b"plain"),
    ]
    data = b"N" + struct.pack("!h", len(types)) + b"".join(cells)
    got = compiled(data, 1, len(data))
    assert got is not None and got == twin(data, 1, len(data))
    assert json.loads(got[0]) == {
        'c0 é"%': 1 << 40,
        'c1 é"%': None,
        'c2 é"%': True,
        'c3 é"%': 'a "quoted"\n\ttab, ü and \x7f',
        'c4 é"%': "plain",
    }
    cache = RelationCache(binary=binary)
    cache.apply(_relation(types), 0)
    body = row_change_body("I", None, 16500, data, 0x10, cache, binary)
    assert json.loads("{" + body + "}")["new"] == json.loads(got[0])


@pytest.mark.parametrize("text", ["a\\b", 'a"b', "a\x7fb", "a\nb", "aüb", "a\x1fb", "a/b", "", "%s"])
def test_each_character_json_escapes_is_escaped_as_the_twin_does(text: str) -> None:
    """One such character among plain ASCII: the compiled reader's own fast path must not take it as plain."""
    compiled, twin = _readers(["text"], True)
    row = b"N" + struct.pack("!h", 1) + _value(b"b", text.encode())
    got = compiled(row, 1, len(row))
    assert got is not None and got == twin(row, 1, len(row))
    assert json.loads(got[0]) == {'c0 é"%': text}


@settings(max_examples=500, deadline=None)
@given(
    node=st.text(max_size=6) | st.sampled_from(["dn1", "", 'n"1']),
    commit_lsn=st.integers(0, 2**64 - 1) | st.integers(2**64, 2**65),
    xid=st.integers(0, 2**32 - 1) | st.integers(-(2**70), 2**70),
    commit_time=st.integers(PG_TIME_MIN_US - 10, PG_TIME_MAX_US + 10)
    | st.sampled_from([0, -1, 1, PG_TIME_MIN_US, PG_TIME_MAX_US, 10**6, -(10**6), -(10**6) - 1])
    | st.integers(-(2**70), 2**70),
    body=st.text(_ASCII, max_size=20) | st.text(max_size=8),
)
def test_the_compiled_one_change_line_is_its_twins_line_or_leaves_it_to_the_twin(
    node: str, commit_lsn: int, xid: int, commit_time: int, body: str
) -> None:
    """The same text whenever it writes one; None only for a part that is not ASCII or a time out of range."""
    assert one_change_line_c is not None
    got = one_change_line_c(node_key(node), commit_lsn, xid, commit_time, body)
    in_range = PG_TIME_MIN_US <= commit_time <= PG_TIME_MAX_US
    try:
        want: str | None = one_change_line(node, commit_lsn, xid, commit_time, body)
    except TimestampError:
        want = None
        assert not in_range
    if got is None:
        plain = node_key(node).isascii() and body.isascii()
        assert not (plain and in_range and commit_lsn < 2**64 and -(2**63) <= xid < 2**63)
    else:
        assert got == want


def test_the_compiled_float4_is_its_twins_for_nearly_every_bit_pattern() -> None:
    """float4 in binary: the twin's shortest decimal, or a give-up, and a give-up only rarely (seeded sample)."""
    compiled, twin = _readers(["float4"], True)
    rnd = random.Random(42)
    gave_up = 0
    patterns = [rnd.getrandbits(32) for _ in range(20_000)] + [
        0,
        1,
        0x80000000,
        0x7F7FFFFF,
        0x00800000,
        0x7F800000,
    ]
    for bits in patterns:
        row = b"N" + struct.pack("!h", 1) + _value(b"b", struct.pack("!I", bits))
        got, want = compiled(row, 1, len(row)), twin(row, 1, len(row))
        assert got == want or got is None, hex(bits)
        gave_up += got is None
    assert gave_up <= len(patterns) // 100


def test_integers_and_timestamps_at_their_edges_are_written_as_the_twin_writes_them() -> None:
    """The digit writers that replaced printf, at the values whose digits are easiest to get wrong."""
    types = ["int2", "int4", "int8", "timestamptz", "numeric"]
    compiled, twin = _readers(types, True)
    stamps = [0, -1, 1, 999_999, 1_000_000, -(10**6) + 1, 252_455_615_999_999_999, -63_082_281_600_000_000]
    numerics = [
        Decimal("0"),
        Decimal("-0.01"),
        Decimal("10000.0001"),
        Decimal("9999"),
        Decimal("-100000000.5"),
    ]
    for i, (h, n, q) in enumerate(
        [
            (-(2**15), -(2**31), -(2**63)),
            (2**15 - 1, 2**31 - 1, 2**63 - 1),
            (0, -1, 10**18),
            (-10, 9, -(10**18)),
        ]
    ):
        cells = [
            struct.pack("!h", h),
            struct.pack("!i", n),
            struct.pack("!q", q),
            struct.pack("!q", stamps[i] if i % 2 else stamps[-1 - i]),
            numeric_binary(numerics[i]),
        ]
        data = b"N" + struct.pack("!h", len(types)) + b"".join(_value(b"b", c) for c in cells)
        got = compiled(data, 1, len(data))
        assert got is not None and got == twin(data, 1, len(data))
