"""The snapshot's pure parts: COPY parsing against an oracle, chunk plans, records, progress, the sink's guard."""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.core.errors import SnapshotError
from csnd.service.sink import ChangelogSink
from csnd.snapshot.copyrows import SIGNATURE, BinaryCopyRows, CopyFormatError, TextCopyRows
from csnd.snapshot.lines import chunk_line, done_line, read_body, snapshot_state
from csnd.snapshot.plan import (
    ColumnInfo,
    TableInfo,
    boundaries_sql,
    chunk_copy_sql,
    chunk_pages,
    chunks_of,
    ctid_chunk_max_rows,
    ctid_chunks,
    ctid_max_pages,
    ctid_rows_estimate,
    max_rows_per_page,
    quote_literal,
    split_bounds,
)
from csnd.snapshot.progress import SnapshotProgress

Row = list[bytes | None]


def _binary_copy(rows: list[Row]) -> bytes:
    out = [SIGNATURE, struct.pack("!II", 0, 0)]
    for row in rows:
        out.append(struct.pack("!h", len(row)))
        for v in row:
            out.append(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v)
    out.append(struct.pack("!h", -1))
    return b"".join(out)


def _tuple(row: Row, kind: bytes) -> bytes:
    """The oracle: pgoutput's Insert data for `row` (`N`, count, kind + length + value or `n`)."""
    parts = [b"N", struct.pack("!h", len(row))]
    for v in row:
        parts.append(b"n" if v is None else kind + struct.pack("!i", len(v)) + v)
    return b"".join(parts)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


_rows = st.lists(st.lists(st.one_of(st.none(), st.binary(max_size=12)), min_size=1, max_size=5), max_size=8)


@given(rows=_rows, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
@settings(max_examples=200)
def test_binary_copy_rows_are_the_oracles_tuples_however_the_data_is_cut(
    rows: list[Row], cuts: list[int]
) -> None:
    parser = BinaryCopyRows()
    got = [t for block in _split(_binary_copy(rows), cuts) for t in parser.feed(block)]
    parser.finish()
    assert got == [_tuple(r, b"b") for r in rows]


def _text_escape(value: str) -> bytes:
    """COPY's text form of a value, as the server writes it."""
    table = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}
    return "".join(table.get(c, c) for c in value).encode()


_text_rows = st.lists(
    st.lists(
        st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8)),
        min_size=1,
        max_size=4,
    ),
    max_size=6,
)


@given(rows=_text_rows, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
@settings(max_examples=200)
def test_text_copy_rows_unescape_to_the_values(rows: list[list[str | None]], cuts: list[int]) -> None:
    data = b"".join(b"\t".join(b"\\N" if v is None else _text_escape(v) for v in row) + b"\n" for row in rows)
    parser = TextCopyRows()
    got = [t for block in _split(data, cuts) for t in parser.feed(block)]
    parser.finish()
    want = [_tuple([None if v is None else v.encode() for v in row], b"t") for row in rows]
    assert got == want


def test_octal_and_hex_escapes_and_damaged_data() -> None:
    parser = TextCopyRows()
    assert parser.feed(b"a\\101\\x42\n") == [_tuple([b"aAB"], b"t")]
    with pytest.raises(CopyFormatError):
        parser.feed(b"half a row")
        parser.finish()
    with pytest.raises(CopyFormatError, match="signature"):
        BinaryCopyRows().feed(b"NOTACOPY" + bytes(20))
    cut = BinaryCopyRows()
    cut.feed(_binary_copy([[b"x"]])[:-2])  # (no trailer)
    with pytest.raises(CopyFormatError, match="trailer"):
        cut.finish()


def _table(
    key: tuple[str, ...] = ("region", "id"), row_filter: str | None = None, partitioned: bool = False
) -> TableInfo:
    cols = (
        ColumnInfo("id", 23, -1, "integer", True),
        ColumnInfo("region", 25, -1, "text", True),
        ColumnInfo("v", 25, -1, "text", False),
    )
    return TableInfo(16400, "public", "acct", "d", cols, key, row_filter, partitioned=partitioned)


def test_chunks_cover_the_key_space_once() -> None:
    t = _table()
    chunks = chunks_of(t, [("5", "r1"), ("9", "r'2")])
    assert [(c.index, c.count, c.lo, c.hi) for c in chunks] == [
        (1, 3, None, ("5", "r1")),
        (2, 3, ("5", "r1"), ("9", "r'2")),
        (3, 3, ("9", "r'2"), None),
    ]
    assert chunk_copy_sql(chunks[1], binary=True) == (
        'COPY (SELECT "id", "region", "v" FROM ONLY "public"."acct" WHERE ("region", "id") > '
        "('5'::text, 'r1'::integer) AND (\"region\", \"id\") <= ('9'::text, 'r''2'::integer) "
        'ORDER BY "region", "id") TO STDOUT (FORMAT binary)'
    )
    whole = chunks_of(_table(key=(), row_filter="(v <> 'x')"), [])
    assert len(whole) == 1
    assert chunk_copy_sql(whole[0], binary=False) == (
        'COPY (SELECT "id", "region", "v" FROM ONLY "public"."acct" WHERE ((v <> \'x\'))) TO STDOUT'
    )
    assert quote_literal("a\\b'c") == "E'a\\\\b''c'"


@given(
    relpages=st.integers(0, 5_000),
    reltuples=st.floats(-1, 1e7, allow_nan=False),
    pages_now=st.integers(0, 6_000),
    chunk_rows=st.integers(1, 50_000),
)
def test_page_range_chunks_cover_every_page_once(
    relpages: int, reltuples: float, pages_now: int, chunk_rows: int
) -> None:
    """The oracle: every page from 0 on, the ones past the table's size too, lies in exactly one chunk."""
    chunks = ctid_chunks(_table(), relpages, reltuples, pages_now, chunk_rows)
    if relpages <= 0 or reltuples < 1:
        assert chunks is None  # (no statistics: cut by key)
        return
    assert chunks is not None and chunks[0].pages is not None and chunks[0].pages[0] == 0
    assert [(c.index, c.count) for c in chunks] == [(i + 1, len(chunks)) for i in range(len(chunks))]
    for c, after in itertools.pairwise(chunks):
        assert c.pages is not None and after.pages is not None and c.pages[1] == after.pages[0]
        assert c.pages[0] < c.pages[1]  # (never an empty range)
    last = chunks[-1].pages
    assert last is not None and last[1] is None and last[0] <= max(pages_now, 1)
    per_page = reltuples / relpages
    # (about chunk_rows rows a chunk, as the statistics tell: a page's worth more at most)
    for c in chunks[:-1]:
        assert c.pages is not None and c.pages[1] is not None
        pages = c.pages[1] - c.pages[0]
        assert pages == 1 or pages * per_page <= chunk_rows + per_page
    # whatever the statistics say, no chunk covers more pages than the bound, so none holds more rows
    # than 4 times chunk_rows (or one page's worth), of the pages the snapshot can see
    most = ctid_max_pages(chunk_rows)
    table_pages = max(pages_now, 1)
    assert sum(chunk_pages(c, table_pages) for c in chunks) == table_pages
    assert all(chunk_pages(c, table_pages) <= most for c in chunks)
    assert ctid_chunk_max_rows(chunk_rows) == most * 291 <= max(4 * chunk_rows, 291)
    assert ctid_chunks(_table(partitioned=True), relpages, reltuples, pages_now, chunk_rows) is None


def test_stale_statistics_cannot_make_a_page_range_chunk_hold_the_table() -> None:
    """Analysed while bloated (1,000 pages, 100 rows), filled since: the statistics plan one chunk of
    all 1,000 pages, which may now hold 291,000 rows; the bound cuts it to 137 pages of at most 39,867."""
    assert max_rows_per_page(8192) == 291  # (PostgreSQL's MaxHeapTuplesPerPage)
    assert ctid_max_pages(10_000) == 137 and ctid_chunk_max_rows(10_000) == 39_867 <= 4 * 10_000
    chunks = ctid_chunks(_table(), 1_000, 100.0, 1_000, 10_000) or []
    assert [c.pages for c in chunks] == [(i * 137, (i + 1) * 137) for i in range(7)] + [(959, None)]
    assert ctid_max_pages(10_000, block_size=32768) == 34  # (a bigger page holds more rows: fewer pages)
    assert ctid_max_pages(50) == 1  # (at least a page: chunk_rows below one page's worth)
    # fresh statistics of a table of ~80 rows a page: the planned ranges, under the bound
    assert [c.pages for c in ctid_chunks(_table(), 2_500, 200_000.0, 2_500, 10_000) or []][:2] == [
        (0, 125),
        (125, 250),
    ]


def test_a_page_range_table_is_estimated_by_its_pages_now() -> None:
    assert ctid_rows_estimate(100, 8_000.0, 150) == 12_000  # (grown by half since its analyse)
    assert ctid_rows_estimate(0, -1.0, 150) == 0 and ctid_rows_estimate(100, 0.0, 150) == 0
    first, last = ctid_chunks(_table(), 10, 1_000.0, 13, 700) or []
    assert (chunk_pages(first, 13), chunk_pages(last, 13)) == (7, 6)
    assert chunk_pages(chunks_of(_table(), [])[0], 13) == 0  # (a key-range chunk covers no pages)


def test_a_page_range_chunk_reads_its_pages_in_heap_order() -> None:
    first, middle, last = ctid_chunks(_table(row_filter="(v <> 'x')"), 30, 3_000.0, 30, 1_000) or []
    assert (first.pages, middle.pages, last.pages) == ((0, 10), (10, 20), (20, None))
    assert chunk_copy_sql(first, binary=True) == (
        'COPY (SELECT "id", "region", "v" FROM ONLY "public"."acct" WHERE ctid < \'(10,0)\'::tid '
        "AND ((v <> 'x'))) TO STDOUT (FORMAT binary)"
    )
    assert chunk_copy_sql(middle, binary=False) == (
        'COPY (SELECT "id", "region", "v" FROM ONLY "public"."acct" WHERE ctid >= \'(10,0)\'::tid '
        "AND ctid < '(20,0)'::tid AND ((v <> 'x'))) TO STDOUT"
    )
    assert "ctid >= '(20,0)'::tid AND ((v" in chunk_copy_sql(last, binary=False)


def test_records_say_what_they_are_and_a_cut_snapshot_shows() -> None:
    body = read_body(
        '"lsn": "0/10", "op": "insert", "schema": "public", "table": "t", "old": null, "new": {"op": "insert"}'
    )
    assert body.startswith('"lsn": "0/10", "op": "read"') and body.endswith('{"op": "insert"}')
    marker: dict[str, Any] = {
        "node": "dn1",
        "schema": "public",
        "table": "t",
        "chunk": 1,
        "chunks": 2,
        "rows": 1,
    }
    line = chunk_line(1, "dn1", 16, 0, [body], marker)
    obj = json.loads(line)
    assert list(obj) == ["csn", "gid", "commit_time", "nodes", "changes", "snapshot"]
    assert obj["nodes"] == {"dn1": {"xid": 0, "commit_lsn": "0/10"}}
    assert obj["changes"][0] == {
        "node": "dn1",
        "cid": 0,
        "lsn": "0/10",
        "op": "read",
        "schema": "public",
        "table": "t",
        "old": None,
        "new": {"op": "insert"},
    }
    assert line == json.dumps(obj, ensure_ascii=False)
    done = done_line(2, {"dn1": 16}, 0, {"nodes": ["dn1"], "tables": 1, "rows": 1, "first_csn": 1})
    assert json.loads(done)["changes"] == [] and done == json.dumps(json.loads(done), ensure_ascii=False)
    assert snapshot_state(None).state == "none"
    assert snapshot_state((1, line.encode())).state == "incomplete"
    assert snapshot_state((2, done.encode())).state == "complete"
    streamed = '{"csn": 3, "gid": null, "changes": [{"new": {"note": "\\"snapshot\\": "}}]}'
    assert snapshot_state((3, streamed.encode())).state == "none"


def test_progress_eta_on_an_injected_clock() -> None:
    now = [100.0]
    p = SnapshotProgress(clock=lambda: now[0])
    p.add_table("dn1", "public", "t", estimated=1000, chunks=4)
    assert p.tables()[0].state == "waiting" and p.tables()[0].eta_seconds == -1
    p.chunk_started("dn1", "public", "t")
    now[0] = 102.0
    p.chunk_done("dn1", "public", "t", 250)
    t = p.tables()[0]
    assert (t.state, t.rows, t.chunks_done, t.eta_seconds) == ("copying", 250, 1, 6.0)
    for _ in range(3):
        p.chunk_done("dn1", "public", "t", 300)
    t = p.tables()[0]
    assert (t.state, t.rows, t.rows_estimated, t.eta_seconds) == ("done", 1150, 1150, 0.0)


def test_the_sink_refuses_a_streamed_csn_among_the_snapshots(tmp_path: Any) -> None:
    """GTM mode: a transaction streamed after a snapshot at a CSN it took is an error, not a repeat."""
    with Changelog(str(tmp_path)) as log:
        for csn in (1, 2, 3):
            log.append(csn, b'{"csn": %d}' % csn)
        log.sync()
        sink = ChangelogSink(log, snapshot_csn=3)
        with pytest.raises(SnapshotError, match="at or below the snapshot's last csn 3"):
            sink.end_transaction(2, '{"csn": 2}')
        sink.end_transaction(7, '{"csn": 7}')
        sink.make_durable()
        assert log.durable_csn == 7
        resumed = ChangelogSink(log)  # (after a restart, without a snapshot at the end: a repeat, skipped)
        resumed.end_transaction(7, '{"csn": 7}')
        assert resumed.skipped == 1


@given(keys=st.lists(st.integers(-50, 50), unique=True, max_size=40), chunk_rows=st.integers(1, 12))
def test_the_boundary_pass_cuts_every_chunk_rows_th_key_and_counts_the_rows(
    keys: list[int], chunk_rows: int
) -> None:
    """`boundaries_sql`'s rows as the server gives them (every chunk_rows-th key in order, then the last with the
    count), read by split_bounds: the oracle is the sorted keys cut by hand."""
    ordered = sorted(keys)
    rows: list[tuple[object, ...]] = [
        (str(k), n, n if n == len(ordered) else None)
        for n, k in enumerate(ordered, 1)
        if n % chunk_rows == 0 or n == len(ordered)
    ]
    bounds, count = split_bounds(rows)
    assert count == len(ordered)
    expected = [(str(ordered[i - 1]),) for i in range(chunk_rows, len(ordered), chunk_rows)]
    assert bounds == expected  # (no bound at the last key: no empty last chunk)
    sql = boundaries_sql(_table(key=("id",)), chunk_rows)
    assert "lead(true) OVER w" in sql and "count(*)" not in sql
