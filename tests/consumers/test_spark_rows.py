"""Flattening transaction lines into rows, against a brute-force flattening of the parsed JSON."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.consumers.spark.columns import (
    ARROW_SCHEMA,
    COLUMNS,
    NULLABLE,
    RowBuilder,
    flatten,
    source_rows,
)
from csnd.consumers.spark.lineparse import _CHANGE_SEP
from csnd.consumers.spark.lineparse import parse_any as _walk
from csnd.consumers.spark.lineparse import parse_as_written as _fast

_enc = json.JSONEncoder(ensure_ascii=False).encode


MARKER_KEYS = ("node", "schema", "table", "incremental", "chunk", "last", "since", "redo")


def brute(records: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
    """The documented row of every change: parse the line, re-dump old/new as json.dumps writes them.

    A snapshot chunk's rows carry its marker; an incremental chunk without
    changes has one row of op `snapshot` (its node's commit LSN, no values).
    """
    rows = []
    for csn, line in records:
        txn = json.loads(line)
        m = txn.get("snapshot")
        marker = {k: m.get(k) for k in MARKER_KEYS} if m and "table" in m and "chunk" in m else None
        changes = txn["changes"]
        if not changes and marker is not None and marker["incremental"] is not None:
            node = marker["node"]
            changes = [
                {
                    "node": node,
                    "cid": 0,
                    "lsn": txn["nodes"][node]["commit_lsn"],
                    "op": "snapshot",
                    "schema": marker["schema"],
                    "table": marker["table"],
                    "old": None,
                    "new": None,
                }
            ]
        for seq, ch in enumerate(changes):
            rows.append(
                {
                    "csn": csn,
                    "gid": txn["gid"],
                    "commit_time": txn["commit_time"],
                    "seq": seq,
                    "node": ch["node"],
                    "xid": txn["nodes"][ch["node"]]["xid"],
                    "cid": ch["cid"],
                    "lsn": ch["lsn"],
                    "op": ch["op"],
                    "schema": ch["schema"],
                    "table": ch["table"],
                    "old": None if ch["old"] is None else _enc(ch["old"]),
                    "new": None if ch["new"] is None else _enc(ch["new"]),
                    "unchanged": ch.get("unchanged", []),
                    "key": ch.get("key"),  # (None: a revision-1 line, without it)
                    "snapshot": marker,
                }
            )
    return rows


def as_rows(batch: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = batch.to_pylist()
    for r in out:  # (compare times as the ISO text the line holds)
        r["commit_time"] = r["commit_time"].isoformat()
    return out


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | names
    | st.floats(allow_nan=False, allow_infinity=False)
)
values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(names, kids, max_size=3), max_leaves=8
)
rowdicts = st.dictionaries(names, values, max_size=5)


@st.composite
def txn_lines(draw: st.DrawFn, csn: int) -> bytes:
    nodes = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    changes = []
    for cid in range(draw(st.integers(0, 5))):
        ch: dict[str, Any] = {
            "node": draw(st.sampled_from(nodes)),
            "cid": cid,
            "lsn": f"0/{draw(st.integers(0, 2**32)):X}",
            "op": draw(st.sampled_from(["insert", "update", "delete", "truncate"])),
            "schema": draw(names),
            "table": draw(names),
        }
        if draw(st.integers(0, 3)):  # (mostly as written now; sometimes a revision-1 line without `key`)
            ch["key"] = draw(st.lists(names, max_size=3))
        ch["old"] = draw(st.none() | rowdicts)
        ch["new"] = draw(st.none() | rowdicts)
        if draw(st.booleans()):
            ch["unchanged"] = draw(st.lists(names, max_size=3))
        changes.append(ch)
    txn = {
        "csn": csn,
        "gid": draw(st.none() | names),
        "commit_time": "2026-11-22T10:00:00.123456+00:00",
        "nodes": {n: {"xid": draw(st.integers(0, 2**32)), "commit_lsn": f"0/{csn:X}"} for n in nodes},
        "changes": changes,
    }
    marker = draw(st.none() | markers(nodes))
    if marker is not None:  # (after changes, as the writer puts it)
        txn["snapshot"] = marker
    return json.dumps(txn, ensure_ascii=False).encode()


def markers(nodes: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Section 7's snapshot markers: an incremental chunk's, an initial chunk's, a completion record's."""
    where = st.fixed_dictionaries({"node": st.sampled_from(nodes), "schema": names, "table": names})
    incremental = st.builds(
        lambda w, job, chunk, last, since, rows, redo: {
            **w,
            "incremental": job,
            "chunk": chunk,
            "last": last,
            "since": since,
            "rows": rows,
            "left_out": 0,
            **({"redo": redo} if redo else {}),
        },
        where,
        names,
        st.integers(1, 10**6),
        st.booleans(),
        st.integers(0, 2**63 - 1),
        st.integers(0, 10**4),
        st.none() | names,
    )
    initial = st.builds(
        lambda w, chunk: {**w, "chunk": chunk, "chunks": chunk + 1, "rows": 3}, where, st.integers(1, 99)
    )
    done = st.just({"done": True, "nodes": nodes, "tables": 1, "rows": 9, "first_csn": 1})
    return incremental | initial | done


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[int, bytes]]:
    csns = sorted(draw(st.sets(st.integers(1, 10**12), max_size=6)))
    return [(c, draw(txn_lines(c))) for c in csns]


@settings(max_examples=100, deadline=None)
@given(streams())
def test_flatten_equals_brute_force(records: list[tuple[int, bytes]]) -> None:
    batch = flatten(records)
    assert batch.schema == ARROW_SCHEMA
    assert as_rows(batch) == brute(records)


@settings(max_examples=50, deadline=None)
@given(streams(), st.sampled_from([(",", ":"), (" , ", " : "), (",\n", ":\t")]))
def test_other_whitespace_takes_the_general_path(
    records: list[tuple[int, bytes]], seps: tuple[str, str]
) -> None:
    """Lines not written as json.dumps writes them (other separators, key order) read the same."""
    respaced = [
        (c, json.dumps(json.loads(line), ensure_ascii=False, separators=seps).encode()) for c, line in records
    ]
    reordered = [
        (c, json.dumps(dict(reversed(json.loads(line).items())), ensure_ascii=False).encode())
        for c, line in records
    ]
    want = brute(records)
    for variant in (respaced, reordered):
        got = as_rows(flatten(variant))
        for g, w in zip(got, want, strict=True):
            for key in ("old", "new"):  # (the text differs with the spacing; the JSON does not)
                assert (g[key] is None) == (w[key] is None)
                if g[key] is not None:
                    assert json.loads(g[key]) == json.loads(w[key])
                g[key] = w[key]
        assert got == want


@settings(max_examples=50, deadline=None)
@given(streams())
def test_fast_path_agrees_with_the_general_walk(records: list[tuple[int, bytes]]) -> None:
    for _, line in records:
        text = line.decode()
        try:
            fast = _fast(text)
        except ValueError:  # (a line it cannot split by position: a column named "new", say)
            assert ', "new": ' in text or _CHANGE_SEP in text or '"snapshot": ' in text
            continue
        assert fast == _walk(text)


# Keys and values that look like the line's own structure: a column named "new"
# or "old", a jsonb array of objects keyed "node", strings holding separators.
tricky = st.sampled_from(
    ["new", "old", "node", "unchanged", "changes", '}, {"node": "', ', "new": ', '"old": ']
)
tricky_values = st.recursive(
    scalars | tricky,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(names | tricky, kids, max_size=3),
    max_leaves=8,
)


@st.composite
def tricky_lines(draw: st.DrawFn, csn: int) -> bytes:
    txn = json.loads(draw(txn_lines(csn)))
    for ch in txn["changes"]:
        for side in ("old", "new"):
            if ch[side] is not None and draw(st.booleans()):
                ch[side] = draw(st.dictionaries(names | tricky, tricky_values, min_size=1, max_size=4))
    return json.dumps(txn, ensure_ascii=False).encode()


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_rows_of_lines_that_look_like_their_own_structure(data: st.DataObject) -> None:
    csns = sorted(data.draw(st.sets(st.integers(1, 10**12), min_size=1, max_size=4)))
    records = [(c, data.draw(tricky_lines(c))) for c in csns]
    assert as_rows(flatten(records)) == brute(records)
    for _, line in records:
        text = line.decode()
        try:
            fast = _fast(text)
        except ValueError:
            continue
        assert fast == _walk(text)


def test_the_writers_lines_take_the_fast_path() -> None:
    """Null and object old/new, unchanged columns, several nodes: split by position, no fallback."""
    line = (
        '{"csn": 7, "gid": "g", "commit_time": "2026-11-22T10:00:00+00:00", "nodes": {"dn1": {"xid": 9, '
        '"commit_lsn": "0/2"}, "dn2": {"xid": 4, "commit_lsn": "0/3"}}, "changes": ['
        '{"node": "dn1", "cid": 0, "lsn": "0/1", "op": "insert", "schema": "s", "table": "t", '
        '"key": ["id"], "old": null, "new": {"id": 1, "doc": {"a": [1, {"b": null}]}}}, '
        '{"node": "dn2", "cid": 1, "lsn": "0/9", "op": "update", "schema": "s", "table": "t", '
        '"key": ["id", "old"], "old": {"id": 1}, "new": {"id": 2}, "unchanged": ["doc", "blob"]}, '
        '{"node": "dn2", "cid": 2, "lsn": "0/A", "op": "delete", "schema": "s", "table": "t", '
        '"old": {"id": 2}, "new": null}]}'  # (a revision-1 change, without `key`, as an old changelog holds)
    )
    head, changes = _fast(line)
    assert head["csn"] == 7 and [c["new"] for c in changes] == [
        '{"id": 1, "doc": {"a": [1, {"b": null}]}}',
        '{"id": 2}',
        None,
    ]
    assert [c["old"] for c in changes] == [None, '{"id": 1}', '{"id": 2}']
    assert changes[1]["unchanged"] == ["doc", "blob"]
    assert [c.get("key") for c in changes] == [["id"], ["id", "old"], None]
    assert (head, changes) == _walk(line)
    assert [r["key"] for r in flatten([(7, line.encode())]).to_pylist()] == [["id"], ["id", "old"], None]


def test_old_and_new_are_the_lines_own_text() -> None:
    """A float whose text Python would write differently stays as the line has it."""
    line = (
        '{"csn": 5, "gid": null, "commit_time": "2026-11-22T10:00:00+00:00", "nodes": {"dn1": {"xid": 9, '
        '"commit_lsn": "0/2"}}, "changes": [{"node": "dn1", "cid": 0, "lsn": "0/1", "op": "update", '
        '"schema": "s", "table": "t", "old": {"k": 1e+15}, "new": {"k": 1E5, "new": "x\\"old\\": 1"}, '
        '"unchanged": ["doc"]}]}'
    )
    row = flatten([(5, line.encode())]).to_pylist()[0]
    assert row["old"] == '{"k": 1e+15}'
    assert row["new"] == '{"k": 1E5, "new": "x\\"old\\": 1"}'
    assert row["unchanged"] == ["doc"] and row["xid"] == 9 and row["gid"] is None


def test_builder_cuts_between_transactions() -> None:
    b = RowBuilder()
    line = json.loads(txn_example())
    b.add(1, txn_example())
    assert b.rows == len(line["changes"])
    first = b.take()
    assert first.num_rows == b.rows + len(line["changes"]) and b.rows == 0
    assert b.take().num_rows == 0 and b.take().schema.names == list(COLUMNS)


def txn_example() -> str:
    return json.dumps(
        {
            "csn": 1,
            "gid": "g",
            "commit_time": "2026-11-22T10:00:00+00:00",
            "nodes": {"dn1": {"xid": 1, "commit_lsn": "0/1"}},
            "changes": [
                {
                    "node": "dn1",
                    "cid": 0,
                    "lsn": "0/1",
                    "op": "insert",
                    "schema": "s",
                    "table": "t",
                    "old": None,
                    "new": {"a": 1},
                },
                {
                    "node": "dn1",
                    "cid": 0,
                    "lsn": "0/2",
                    "op": "insert",
                    "schema": "s",
                    "table": "t",
                    "old": None,
                    "new": {"a": 2},
                },
            ],
        },
        ensure_ascii=False,
    )


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"[1]", "not a transaction line"),
        (b'{"csn": 1, "gid": null, "commit_time": "x", "nodes": {}}', "no changes"),
        (b'{"csn": 2, "gid": null, "commit_time": "x", "nodes": {}, "changes": []}', "says csn 2"),
        (
            b'{"csn": 1, "gid": null, "commit_time": "x", "nodes": {}, "changes": [{"node": "dn9", "cid": 0, '
            b'"lsn": "0/1", "op": "insert", "schema": "s", "table": "t", "old": null, "new": null}]}',
            "node 'dn9'",
        ),
        (b'{"csn": 1, "changes": [', "not a transaction line"),
    ],
)
def test_bad_lines_name_the_csn(line: bytes, says: str) -> None:
    with pytest.raises(ValueError, match="csn 1") as e:
        RowBuilder().add(1, line)
    assert says in str(e.value)


def two_change_line(csn: int) -> bytes:
    txn = json.loads(txn_example())
    txn["csn"] = csn
    return json.dumps(txn).encode()


@pytest.mark.parametrize("field", ["lsn", "op", "schema", "table", "cid", "commit_time"])
def test_a_change_without_a_never_null_field_names_its_csn_and_the_field(field: str) -> None:
    # (Spark reads a NOT NULL column without a null check: a null there would be garbage)
    good = json.loads(two_change_line(7))
    bad = json.loads(two_change_line(8))
    if field == "commit_time":
        bad[field] = None
    else:
        bad["changes"][1][field] = None
    b = RowBuilder()
    b.add(7, json.dumps(good).encode())
    b.add(8, json.dumps(bad).encode())
    with pytest.raises(ValueError, match=f"csn 8: .*{field}"):
        b.take()


def test_only_gid_old_new_key_and_snapshot_may_be_null() -> None:
    assert (
        {f.name for f in ARROW_SCHEMA if f.nullable} == NULLABLE == {"gid", "old", "new", "key", "snapshot"}
    )
    batch = flatten([(1, two_change_line(1))])
    assert source_rows(batch) is batch


def test_rows_of_an_earlier_service_are_given_the_schema_and_nulls_refused() -> None:
    batch = flatten([(1, two_change_line(1)), (2, two_change_line(2))])
    # (a service of an earlier version: the same columns, every one nullable)
    loose = pa.schema([f.with_nullable(True) for f in ARROW_SCHEMA])
    earlier = pa.RecordBatch.from_arrays(batch.columns, schema=loose)
    rows = source_rows(earlier)
    assert rows is not None and rows.schema.equals(ARROW_SCHEMA) and rows.equals(batch)
    lsn = ARROW_SCHEMA.get_field_index("lsn")
    holed = earlier.set_column(lsn, loose.field(lsn), pa.array(["0/1", None, "0/3", "0/4"], pa.string()))
    assert source_rows(holed) is None
    # (a NOT NULL flag does not make pyarrow refuse a null: the counts are checked)
    strict = pa.RecordBatch.from_arrays(holed.columns, schema=ARROW_SCHEMA)
    assert source_rows(strict) is None
    assert source_rows(batch.drop_columns(["key"])) is None


def test_rows_of_a_service_before_the_snapshot_column_get_it_null() -> None:
    batch = flatten([(1, two_change_line(1))])
    older = pa.RecordBatch.from_arrays(
        batch.columns[:-1], schema=pa.schema([f.with_nullable(True) for f in ARROW_SCHEMA][:-1])
    )
    rows = source_rows(older)
    assert rows is not None and rows.schema.equals(ARROW_SCHEMA) and rows.equals(batch)
    assert rows.column("snapshot").null_count == rows.num_rows


def test_an_incremental_chunk_that_kept_no_row_still_has_its_marker_row() -> None:
    """The table's last chunk is often empty, and it is the one that says the table is done."""
    txn = json.loads(two_change_line(9))
    txn["changes"] = []
    txn["snapshot"] = {"node": "dn1", "schema": "s", "table": "t", "incremental": "j1", "chunk": 4,
                       "last": True, "since": 7, "rows": 0, "left_out": 0}  # fmt: skip
    for line in (json.dumps(txn).encode(), json.dumps(txn, indent=1).encode()):  # (typed and general paths)
        (row,) = flatten([(9, line)]).to_pylist()
        assert (row["op"], row["lsn"], row["schema"], row["table"], row["old"], row["new"]) == (
            "snapshot", "0/1", "s", "t", None, None
        )  # fmt: skip
        assert row["snapshot"] == {"node": "dn1", "schema": "s", "table": "t", "incremental": "j1",
                                   "chunk": 4, "last": True, "since": 7, "redo": None}  # fmt: skip
    txn["snapshot"]["since"] = "soon"
    with pytest.raises(ValueError, match="csn 9: its snapshot marker cannot be a column value"):
        flatten([(9, json.dumps(txn).encode())])
