"""A chunk's change objects in one join (`render.chunk_changes`) against the stream's rendering, row by row."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.coordinator.jsonlines import json_changes
from csnd.core.compiled import twin_asked
from csnd.core.errors import DecodeError
from csnd.decoder.rows import RelationCache
from csnd.snapshot import _copysplit
from csnd.snapshot.copyrows import BinaryCopyRows, CopyFormatError
from csnd.snapshot.plan import ColumnInfo, TableInfo
from csnd.snapshot.render import _compiled_reader, _prefix, binary_chunk_text, chunk_changes, stream_bodies

LSN = 0x1_0000_2A10
_TABLE = TableInfo(
    16400,
    "public",
    'odd "name"',
    "d",
    (
        ColumnInfo("id", 23, -1, "integer", True),
        ColumnInfo("note", 25, -1, "text", False),
        ColumnInfo("doc", 3802, -1, "jsonb", False),
    ),
    ("id",),
)


def _cache(binary: bool) -> RelationCache:
    cache = RelationCache(binary=binary)
    for msg in _TABLE.relation_messages():
        cache.apply(msg, LSN)
    return cache


def _text_tuple(values: list[str | None]) -> bytes:
    parts = [b"N", struct.pack("!h", len(values))]
    for v in values:
        if v is None:
            parts.append(b"n")
        else:
            raw = v.encode()
            parts.append(b"t" + struct.pack("!i", len(raw)) + raw)
    return b"".join(parts)


_ints = st.one_of(st.integers(-(2**31), 2**31 - 1).map(str), st.sampled_from(["007", "+1", " 5"]))
_docs = st.one_of(st.none(), st.sampled_from(['{"k": 1}', "[]", '"x"', "null", '{"a": [1, {"b": "é"}]}']))
_rows = st.lists(st.tuples(_ints, st.one_of(st.none(), st.text(max_size=8)), _docs), max_size=6)


@given(rows=_rows, node=st.sampled_from(["dn1", 'n"é']))
@settings(max_examples=300)
def test_chunk_changes_are_the_streams_bodies_joined(
    rows: list[tuple[str, str | None, str | None]], node: str
) -> None:
    tuples = [_text_tuple(list(r)) for r in rows]
    cache = _cache(binary=False)
    expected = json_changes(
        node, [(0, LSN, b) for b in stream_bodies(_TABLE.relid, tuples, LSN, cache, False)], True
    )
    assert chunk_changes(node, LSN, _TABLE.relid, tuples, cache, False) == expected


def test_chunk_changes_of_binary_rows_are_the_streams() -> None:
    tuples = [
        b"N"
        + struct.pack("!h", 3)
        + b"b"
        + struct.pack("!ii", 4, i)
        + b"b"
        + struct.pack("!i", 2)
        + b"hi"
        + b"n"
        for i in (1, -7, 2**31 - 1)
    ]
    cache = _cache(binary=True)
    expected = json_changes(
        "dn1", [(0, LSN, b) for b in stream_bodies(_TABLE.relid, tuples, LSN, cache, True)], True
    )
    got = chunk_changes("dn1", LSN, _TABLE.relid, tuples, cache, True)
    assert got == expected
    assert got.count('"op": "read"') == 3


# --- a binary COPY's whole data rendered in one pass (`binary_chunk_text`, `_copysplit.render_rows`) ---

_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
_WIDE = TableInfo(
    16401,
    "public",
    "wide",
    "d",
    (
        ColumnInfo("id", 23, -1, "integer", True),
        ColumnInfo("note", 25, -1, "text", False),
        ColumnInfo("doc", 3802, -1, "jsonb", False),
        ColumnInfo("amount", 1700, -1, "numeric", False),
        ColumnInfo("at", 1184, -1, "timestamp with time zone", False),
        ColumnInfo("tag", 2950, -1, "uuid", False),
    ),
    ("id",),
)


def _numeric(digits: list[int], weight: int, sign: int, dscale: int) -> bytes:
    return struct.pack(f"!hhHH{len(digits)}H", len(digits), weight, sign, dscale, *digits)


_values = st.tuples(
    st.one_of(st.integers(-(2**31), 2**31 - 1).map(lambda i: struct.pack("!i", i)), st.binary(max_size=5)),
    st.one_of(st.text(max_size=6).map(str.encode), st.binary(max_size=4)),  # (not always UTF-8)
    st.sampled_from([b"\x01{}", b'\x01{"a": [1, "\xc3\xa9"]}', b"\x02[]", b"\x01nul", b"\x01\xff"]),
    st.one_of(
        st.builds(
            _numeric,
            st.lists(st.integers(0, 10_001), max_size=3),
            st.integers(-3, 3),
            st.sampled_from([0, 0x4000, 0xC000, 0x1234]),
            st.integers(0, 9),
        ),
        st.binary(max_size=9),
    ),
    st.one_of(st.integers(-(2**63), 2**63 - 1).map(lambda us: struct.pack("!q", us)), st.binary(max_size=3)),
    st.binary(min_size=15, max_size=17),
)


def _copy_row(values: tuple[bytes | None, ...], count: int | None = None) -> bytes:
    out = [struct.pack("!h", len(values) if count is None else count)]
    for v in values:
        out.append(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v)
    return b"".join(out)


def _checked(node: str, data: bytes, cache: RelationCache) -> tuple[bytes, int] | str:
    """The twin: split (BinaryCopyRows), the stream's row reader per row, one join (chunk_changes)."""
    parser = BinaryCopyRows()
    try:
        tuples = parser.feed(data)
        parser.finish()
        return chunk_changes(node, LSN, _WIDE.relid, tuples, cache, True).encode("utf-8"), len(tuples)
    except (CopyFormatError, DecodeError) as e:  # (a bad value: the stream's own error, naming the column)
        return str(e)


@given(
    rows=st.lists(st.tuples(_values, st.lists(st.booleans(), min_size=6, max_size=6)), max_size=5),
    node=st.sampled_from(["dn1", 'n"é']),
    miscount=st.booleans(),
    cut=st.integers(0, 6),
    trailer=st.sampled_from([b"\xff\xff", b"\xff\xfe", b""]),
)
@settings(max_examples=400, deadline=None)
def test_a_binary_copy_rendered_in_one_pass_is_its_checked_path_byte_for_byte(
    rows: list[tuple[tuple[bytes, ...], list[bool]]], node: str, miscount: bool, cut: int, trailer: bytes
) -> None:
    cache = RelationCache(binary=True)
    for msg in _WIDE.relation_messages():
        cache.apply(msg, LSN)
    body = [
        _copy_row(tuple(None if null else v for v, null in zip(values, nulls, strict=True)))
        for values, nulls in rows
    ]
    if miscount and body:
        body[-1] = _copy_row(rows[-1][0][:5])  # (a row of 5 fields: the reader gives up, the twin too)
    data = _COPY_HEADER + b"".join(body) + trailer
    data = data[: len(data) - cut] if cut and cut < len(data) - len(_COPY_HEADER) else data
    expected = _checked(node, data, cache)
    try:
        got: tuple[bytes, int] | str = binary_chunk_text(node, LSN, _WIDE.relid, data, cache)
    except (CopyFormatError, DecodeError) as e:
        got = str(e)
    assert got == expected


def test_valid_rows_take_the_one_pass_and_write_what_the_checked_path_writes() -> None:
    cache = RelationCache(binary=True)
    for msg in _WIDE.relation_messages():
        cache.apply(msg, LSN)
    row = (
        struct.pack("!i", 7),
        "é\\x".encode(),
        b'\x01{"a": 1}',
        _numeric([12, 5000], 0, 0x4000, 2),
        struct.pack("!q", 10**15),
        bytes(range(16)),
    )
    data = _COPY_HEADER + _copy_row(row) + _copy_row((None,) * 6) + b"\xff\xff"
    text, rows = binary_chunk_text("dn1", LSN, _WIDE.relid, data, cache)
    assert (text, rows) == _checked("dn1", data, cache)
    assert rows == 2 and b'"amount": "-12.50"' in text and b'"note": "\xc3\xa9\\\\x"' in text
    reader = _compiled_reader(cache.table(_WIDE.relid))
    # (both modules built, as `make test` builds them: the one pass is what ran, unless a twin is asked for)
    assert (reader is None) == (twin_asked("csnd.snapshot._copysplit") or twin_asked("csnd.decoder._rows"))
    if reader is not None:
        prefix = _prefix("dn1", LSN, cache.table(_WIDE.relid)).encode()
        assert _copysplit.render_rows(*reader, data, len(_COPY_HEADER), len(data), prefix) == (
            text,
            2,
            len(data),
            1,
        )


def test_a_chunk_whose_text_outgrows_its_first_buffer_is_rendered_whole() -> None:
    """The one pass sizes its buffer from the COPY's bytes and grows it mid-loop, where it runs without
    the GIL: narrow rows (NULLs: 26 bytes each, about 300 of text), then rows whose strings take the
    escaping path back through Python, must still give the checked path's bytes."""
    cache = RelationCache(binary=True)
    for msg in _WIDE.relation_messages():
        cache.apply(msg, LSN)
    nulls = [_copy_row((None,) * 6)] * 3000
    escaped = [
        _copy_row((struct.pack("!i", i), f'q"\\{i}é'.encode(), b'\x01["\xc3\xa9"]', None, None, None))
        for i in range(500)
    ]
    data = _COPY_HEADER + b"".join(nulls + escaped + nulls) + b"\xff\xff"
    text, rows = binary_chunk_text("dn1", LSN, _WIDE.relid, data, cache)
    assert (text, rows) == _checked("dn1", data, cache)
    assert rows == 6500 and len(text) > 4 * len(data) + 4096
