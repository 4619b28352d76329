"""`_rows.c` against its twins: the row reader compiled in Python, and `csnd.core.lines.one_change_line`."""

from __future__ import annotations

import json
import os
import struct
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import TimestampError
from csnd.core.ids import PG_TIME_MAX_US, PG_TIME_MIN_US
from csnd.core.lines import node_key, one_change_line
from csnd.decoder import RelationCache, rows
from csnd.decoder.rows import row_change_body
from csnd.gtm.pgtypes import numeric_binary, numeric_text
from csnd.reader import pgoutput as p
from csnd.reader.pgoutput import Column, Relation

try:
    from csnd.decoder._rows import one_change_line as one_change_line_c
    from csnd.decoder._rows import read_row as read_row_c
except ImportError:  # (reported by test_the_compiled_row_reader_is_built)
    read_row_c = None  # type: ignore[assignment]
    one_change_line_c = None  # type: ignore[assignment]

# The types the compiled reader writes, with their OIDs.
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
}
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
    columns = [Column(1 if i == 0 else 0, f'c{i} é"%', TYPES[t], -1) for i, t in enumerate(types)]
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
    text = draw(st.text(_TRICKY, max_size=12) | st.text(_ASCII, max_size=12) | st.text(max_size=12))
    return _value(b"b" if choice <= 6 else b"t", text.encode("utf-8", "surrogatepass"))


@st.composite
def _table_and_tuple(draw: st.DrawFn) -> tuple[list[str], bytes, int]:
    types = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=5))
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
    return table.read_row, rows._compile_row_reader(table.json_columns, binary)


def test_the_compiled_row_reader_is_built() -> None:
    """`make test` installs with a C compiler: the decoders must not fall back unnoticed."""
    assert read_row_c is not None, "csnd.decoder._rows was not built (is a C compiler installed?)"
    compiled, _ = _readers(["int8", "int4"], True)
    if os.environ.get("CSND_IMPL", "").lower() == "python":  # (asked for the twins)
        assert not isinstance(compiled, partial)
    else:
        assert isinstance(compiled, partial) and compiled.func is read_row_c


def test_a_table_with_a_column_the_compiled_reader_does_not_write_gets_the_python_reader() -> None:
    cache = RelationCache(binary=True)
    columns = [Column(1, "id", 20, -1), Column(0, "u", 2950, -1)]  # int8, uuid
    m = p.parse_message(p.encode_relation(16501, "public", "u", "d", columns), False)
    assert isinstance(m, Relation)
    cache.apply(m, 0)
    assert not isinstance(cache.table(16501).read_row, partial)


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
    if type_name == "timestamptz":  # (in years 1-9999; a text stream's is left to the twin)
        return _value(b"b", struct.pack("!q", draw(st.integers(PG_TIME_MIN_US, PG_TIME_MAX_US))))
    if type_name == "jsonb":
        doc = json.dumps(draw(_JSON), ensure_ascii=False).encode()
        return _value(b"b", b"\x01" + doc) if binary else _value(b"t", doc)
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
    types=st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=6),
    binary=st.booleans(),
)
def test_on_what_postgresql_sends_the_compiled_reader_never_gives_up(
    data: st.DataObject, types: list[str], binary: bool
) -> None:
    if not binary:  # (a text stream's timestamptz is PostgreSQL's DateStyle text: the twin reads it)
        types = [t for t in types if t != "timestamptz"] or ["int8"]
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
