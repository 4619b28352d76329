"""What an initial snapshot reads: the published tables, cut into key-range (or page-range) chunks, as SQL.

    pg_publication_tables ─► TableInfo (columns, identity key flags, chunk key, row filter)
                                 │  one pass over the chunk key: every CHUNK_ROWS-th key
                                 ▼
                             Chunk (table, i of n, (lo, hi] key range) ─► chunk_copy_sql

A chunk is a half-open range of the table's primary key, `lo < key <= hi`
(the first open below, the last open above), so the chunks of a table cover
it exactly once whatever the key's values; a table without a primary key is
one chunk.  The boundaries come from one ordered pass over the key (an
index-only scan where the index allows it) inside the exported snapshot, so
they are the snapshot's own keys.  With `split = "ctid"` (the default) a
chunk is instead a range of the table's heap pages (`ctid_chunks`), where it
can be (PostgreSQL 14 or later, not partitioned, with statistics): no pass
before the first chunk, each read by a TID range scan in heap order, about
`chunk_rows` rows as the statistics tell and never more pages than
`ctid_max_pages` allows, whatever they tell.  Key values travel as their
text with a cast to the column's type (COPY takes no parameters).

The Relation (and Type) messages a table's rows are rendered with are made
here as pgoutput would send them (`relation_messages`), so the decoder's
`RelationCache` resolves each column exactly as it does for the stream.

Pure: the queries are built here and run by `csnd.snapshot.copier`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from csnd.reader.pgoutput import Column, Relation, TypeMsg

# Rows per chunk (one changelog transaction each).  Larger chunks mean fewer
# queries and records, but more memory per chunk in flight (its rendered
# rows are held until it is appended: ~300 bytes a narrow row, so 10,000 rows
# is a few MB) and a coarser progress figure.  bench/snapshot_bench.py: 2,000
# rows a chunk copied 36,000 rows/s, 10,000 and 50,000 about 42,500 (one reader).
CHUNK_ROWS: Final = 10_000

# pgoutput sends a Type message for the column types from here on (FirstGenbkiObjectId).
FIRST_NON_BUILTIN_OID: Final = 10_000
PG_CATALOG: Final = "pg_catalog"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """A SQL string literal of `text`, whatever standard_conforming_strings says."""
    body = text.replace("'", "''")
    if "\\" in body:
        return "E'" + body.replace("\\", "\\\\") + "'"
    return "'" + body + "'"


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type_oid: int
    typmod: int
    type_sql: str  # format_type(atttypid, atttypmod): the type as SQL writes it
    identity: bool  # part of the replica identity (pgoutput's key flag)


@dataclass(frozen=True)
class TypeInfo:
    """A column type pgoutput announces with a Type message: the base type's namespace and name."""

    type_oid: int
    base_namespace: str
    base_name: str


@dataclass(frozen=True)
class TableInfo:
    relid: int
    schema: str
    name: str
    replident: str  # 'd', 'n', 'f' or 'i', as pg_class.relreplident
    columns: tuple[ColumnInfo, ...]
    key: tuple[str, ...]  # primary-key columns, in key order; () : no key, one chunk
    row_filter: str | None = None  # the publication's row filter (pg_publication_tables.rowfilter)
    estimated_rows: int = 0  # pg_class.reltuples, for progress (0: unknown)
    partitioned: bool = False  # a partitioned table (publish_via_partition_root): read with its partitions
    types: tuple[TypeInfo, ...] = ()

    @property
    def label(self) -> str:
        """`schema.table` as status and errors name it."""
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"

    def key_sql(self) -> str:
        return ", ".join(quote_ident(k) for k in self.key)

    def key_types(self) -> list[str]:
        by_name = {c.name: c.type_sql for c in self.columns}
        return [by_name[k] for k in self.key]

    def relation_messages(self) -> list[Relation | TypeMsg]:
        """The Type messages and the Relation message pgoutput sends for this table, in that order."""
        msgs: list[Relation | TypeMsg] = []
        for t in self.types:
            namespace = "" if t.base_namespace == PG_CATALOG else t.base_namespace
            msgs.append(TypeMsg(None, t.type_oid, namespace, t.base_name))
        cols = tuple(Column(1 if c.identity else 0, c.name, c.type_oid, c.typmod) for c in self.columns)
        msgs.append(Relation(None, self.relid, self.schema, self.name, self.replident, cols))
        return msgs


@dataclass(frozen=True)
class Chunk:
    """Rows `lo < key <= hi` of a table (None: unbounded on that side); chunk `index` of `count`, from 1.

    `pages`, when set (`split = "ctid"`), is the chunk instead: the rows in heap pages
    `first <= page < end` (end None: to the table's end), in heap order; `lo` and `hi` are None.
    """

    table: TableInfo
    index: int
    count: int
    lo: tuple[str, ...] | None
    hi: tuple[str, ...] | None
    pages: tuple[int, int | None] | None = None


def boundaries_sql(table: TableInfo, chunk_rows: int = CHUNK_ROWS) -> str:
    """Every `chunk_rows`-th key of the table in key order and the last key, each with its number.

    Each row: the key's columns as text, its row number, and on the last
    key's row its number again, the table's row count (null on the others;
    `split_bounds` reads them).  The last key comes too, so the same pass
    counts the rows: progress shows the copy against the true total.
    """
    key = table.key_sql()
    texts = ", ".join(f"{quote_ident(k)}::text" for k in table.key)
    where = f" WHERE ({table.row_filter})" if table.row_filter else ""
    # (the last key is the one without a next: `lead` looks one row ahead as the scan streams, where
    # `count(*) OVER ()` held every key in a tuplestore first -- the pass took a third less time)
    return (
        f"SELECT {texts}, csnd_n, CASE WHEN csnd_last THEN csnd_n END FROM (SELECT {key}, "
        f"row_number() OVER w AS csnd_n, (lead(true) OVER w) IS NULL AS csnd_last "
        f"FROM {_from(table)}{where} WINDOW w AS (ORDER BY {key})) AS k "
        f"WHERE csnd_n % {int(chunk_rows)} = 0 OR csnd_last ORDER BY csnd_n"
    )


def split_bounds(rows: list[tuple[object, ...]]) -> tuple[list[tuple[str, ...]], int]:
    """The chunks' upper bounds and the row count from `boundaries_sql`'s rows.

    The last key is no bound: a bound there would leave the last chunk
    (above it) empty, an empty record that, quickest to read, was appended
    first ("chunk 3 of 3, rows 0").
    """
    if not rows:
        return [], 0
    count = int(str(rows[-1][-1]))
    bounds = [tuple(str(v) for v in r[:-2]) for r in rows if int(str(r[-2])) < count]
    return bounds, count


def next_bound_sql(table: TableInfo, lo: tuple[str, ...] | None, chunk_rows: int = CHUNK_ROWS) -> str:
    """The `chunk_rows`-th key after `lo` (None: from the first), as text: an incremental chunk's upper bound.

    No row: fewer than `chunk_rows` keys are left, and the chunk is the table's last.
    """
    key = table.key_sql()
    texts = ", ".join(f"{quote_ident(k)}::text" for k in table.key)
    conds = [f"({key}) > ({_values(lo, table.key_types())})"] if lo is not None else []
    if table.row_filter:
        conds.append(f"({table.row_filter})")
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    # (the casts to text in a subquery's outer select: an ORDER BY beside them would sort by the
    # text output columns of the same names -- '10' before '9' -- and a bound could go backwards)
    return (
        f"SELECT {texts} FROM (SELECT {key} FROM {_from(table)}{where} ORDER BY {key} "
        f"OFFSET {int(chunk_rows) - 1} LIMIT 1) AS k"
    )


def chunks_of(table: TableInfo, bounds: list[tuple[str, ...]]) -> list[Chunk]:
    """The chunks of `table` given the upper bounds `boundaries_sql` found (none: one chunk)."""
    if not table.key:
        return [Chunk(table, 1, 1, None, None)]
    edges: list[tuple[str, ...] | None] = [None, *bounds, None]
    count = len(edges) - 1
    return [Chunk(table, i + 1, count, edges[i], edges[i + 1]) for i in range(count)]


# The first server version with a TID range scan: before it a ctid range reads the whole table.
CTID_SPLIT_SERVER: Final = 140000
# What a page-range chunk may hold at most, in multiples of chunk_rows, whatever the statistics say
# (`ctid_max_pages`).  Statistics are only as fresh as the last ANALYZE or VACUUM: a table analysed
# while bloated (many pages, few rows) and filled again since would make the planned ranges far too
# long.  4: the bench's rows (bench/snapshot_bench.py: 83 to a page, so 120 pages a 10,000-row chunk,
# under the 137 this allows) keep their planned chunks, and a chunk holds at most 4 times the rows
# (and their rendered text) a key-range chunk does.
CTID_ROWS_SLACK: Final = 4
# PostgreSQL's page header and a row's least room on a page: its tuple header (23 bytes, aligned to
# 24) and its line pointer (4) -- MaxHeapTuplesPerPage is (block size - 24) // 28, 291 for 8 KiB.
PAGE_HEADER_BYTES: Final = 24
LEAST_ROW_BYTES: Final = 28


def max_rows_per_page(block_size: int) -> int:
    """The most rows (line pointers) a heap page of `block_size` bytes can hold: MaxHeapTuplesPerPage."""
    return max(1, (block_size - PAGE_HEADER_BYTES) // LEAST_ROW_BYTES)


def ctid_max_pages(chunk_rows: int, block_size: int = 8192) -> int:
    """The most pages a page-range chunk covers: what bounds it, whatever the statistics say.

    A chunk of this many pages holds at most `CTID_ROWS_SLACK * chunk_rows` rows (at least one
    page: one page's rows when chunk_rows is smaller than that) and at most this many pages of
    heap bytes (a row's TOASTed values aside, which bound no key-range chunk either).  A key-range
    chunk is bounded by its rows only: chunk_rows of them, of any width.
    """
    return max(1, CTID_ROWS_SLACK * max(chunk_rows, 1) // max_rows_per_page(block_size))


def ctid_chunk_max_rows(chunk_rows: int, block_size: int = 8192) -> int:
    """The most rows a page-range chunk can hold (`ctid_max_pages` full pages of the smallest rows)."""
    return ctid_max_pages(chunk_rows, block_size) * max_rows_per_page(block_size)


def ctid_chunks(
    table: TableInfo,
    relpages: int,
    reltuples: float,
    pages_now: int,
    chunk_rows: int = CHUNK_ROWS,
    block_size: int = 8192,
) -> list[Chunk] | None:
    """The table's chunks as ranges of heap pages of about `chunk_rows` rows each, or None (cut by key).

    The rows a page holds are the statistics' (`relpages`, `reltuples`: None without them, as
    for a table never analysed); `pages_now` is the table's size in pages as the snapshot began:
    every row the snapshot sees lies in a page below it (a table only grows, but for empty pages
    a vacuum cuts off), and the last chunk is open above all the same.  No range is longer than
    `ctid_max_pages`, so stale statistics cannot make a chunk hold far more than planned.  A
    partitioned table (whose pages are its partitions') is cut by key.
    """
    if table.partitioned or relpages <= 0 or reltuples < 1:
        return None  # (reltuples is -1 or 0 before the first analyse: under one row tells nothing)
    planned = max(1, int(chunk_rows * relpages / reltuples))
    per_chunk = min(planned, ctid_max_pages(chunk_rows, block_size))
    count = max(1, -(-max(pages_now, 1) // per_chunk))
    return [
        Chunk(
            table, i + 1, count, None, None, (i * per_chunk, None if i == count - 1 else (i + 1) * per_chunk)
        )
        for i in range(count)
    ]


def ctid_rows_estimate(relpages: int, reltuples: float, pages_now: int) -> int:
    """The table's rows as its statistics' rows a page tell, over its pages now (as the planner
    scales them: a table grown since its last analyse holds more than `reltuples`)."""
    if relpages <= 0 or reltuples < 1:
        return 0
    return round(reltuples / relpages * max(pages_now, 0))


def chunk_pages(chunk: Chunk, table_pages: int) -> int:
    """The pages a page-range chunk covers of a table of `table_pages` pages (the last: to the end)."""
    if chunk.pages is None:
        return 0
    first, end = chunk.pages
    return max((table_pages if end is None else end) - first, 0)


def chunk_copy_sql(chunk: Chunk, binary: bool) -> str:
    """The COPY that reads one chunk: binary (the send formats) or text (the output functions)."""
    t = chunk.table
    cols = ", ".join(quote_ident(c.name) for c in t.columns)
    conds: list[str] = []
    if chunk.pages is not None:
        first, end = chunk.pages
        if first > 0:
            conds.append(f"ctid >= '({int(first)},0)'::tid")
        if end is not None:
            conds.append(f"ctid < '({int(end)},0)'::tid")
    elif t.key:
        key = f"({t.key_sql()})"
        types = t.key_types()
        if chunk.lo is not None:
            conds.append(f"{key} > ({_values(chunk.lo, types)})")
        if chunk.hi is not None:
            conds.append(f"{key} <= ({_values(chunk.hi, types)})")
    if t.row_filter:
        conds.append(f"({t.row_filter})")
    where = f" WHERE {' AND '.join(conds)}" if conds else ""
    order = f" ORDER BY {t.key_sql()}" if t.key and chunk.pages is None else ""
    fmt = " (FORMAT binary)" if binary else ""
    return f"COPY (SELECT {cols} FROM {_from(t)}{where}{order}) TO STDOUT{fmt}"


def _from(table: TableInfo) -> str:
    # ONLY: a table's inheritance children are published (and streamed) as tables of their own
    return table.sql_name if table.partitioned else f"ONLY {table.sql_name}"


def _values(texts: tuple[str, ...], types: list[str]) -> str:
    return ", ".join(f"{quote_literal(v)}::{t}" for v, t in zip(texts, types, strict=True))
