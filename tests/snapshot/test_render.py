"""A chunk's change objects in one join (`render.chunk_changes`) against the stream's rendering, row by row."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.coordinator.jsonlines import json_changes
from csnd.decoder.rows import RelationCache
from csnd.snapshot.plan import ColumnInfo, TableInfo
from csnd.snapshot.render import chunk_changes, stream_bodies

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
