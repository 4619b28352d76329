"""Transaction JSON lines (docs/design.md section 7) flattened into Arrow columns: one row per change.

    (csn, line) ... ──► RowBuilder.add ──► column lists ──► RecordBatch (SCHEMA)

This runs on the executors, once per change of everything Spark reads, so
it decodes the usual line in one msgspec pass with `old` and `new` left
unparsed, instead of parsing it whole and re-serialising them: those two
columns are the JSON text of the objects *as the line holds them*, byte for
byte (re-dumping could change a float's text, which other tools compare).
A line of another shape is parsed by `csnd.consumers.spark.lineparse`.

The row schema is the documented contract of the Spark source (docs/design.md
section 8): `seq` is the change's position in the line it came in (with a
`tables` filter, among the changes kept), `xid` the transaction's xid on the
change's node (from the line's `nodes` map), `unchanged` the columns left out
of `new` as unchanged TOAST values (an empty array when there are none),
`key` the change's key columns (null for a line written before changes had
one: unknown, which is not the empty array of a table without a key),
`snapshot` the marker of the snapshot chunk the row was read by (null for
every other change).  An incremental snapshot's chunk that kept no row still
gets one row, op `snapshot`, so its marker reaches the consumer: the last
chunk of a table is what tells a consumer to drop the keys deleted before
the snapshot (docs/design.md section 7, "Deleted rows"), and it is often
empty.

Pure: no I/O.  A line that is not a transaction object is a ValueError
naming the csn and what is wrong (the caller adds where it came from).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from csnd.consumers.spark.lineparse import parse_any, parse_as_written

# The Spark schema, as DDL (DataSource.schema) and as Arrow (what `read` yields).
# Only gid (single mode), old, new, key (a line written before changes had
# one) and snapshot (a row no snapshot chunk read) may be null; every other column always has a value, and the schema says
# so: Spark then reads those values without a null check, which through Arrow's
# Java vectors cost a tenth of its time on the rows (docs/performance.md).
SCHEMA_DDL: Final = (
    "csn long NOT NULL, gid string, commit_time timestamp NOT NULL, seq int NOT NULL, "
    "node string NOT NULL, xid long NOT NULL, cid int NOT NULL, lsn string NOT NULL, op string NOT NULL, "
    "schema string NOT NULL, table string NOT NULL, old string, new string, "
    "unchanged array<string> NOT NULL, key array<string>, "
    "snapshot struct<node: string, schema: string, table: string, incremental: string, chunk: int, "
    "last: boolean, since: long, redo: string>"
)
NULLABLE: Final = frozenset(("gid", "old", "new", "key", "snapshot"))
# A snapshot chunk's marker (docs/design.md section 7) as the `snapshot` column
# holds it; incremental, last, since and redo are null for an initial
# snapshot's chunk, redo for every chunk not read again.
SNAPSHOT_TYPE: Final = pa.struct(
    [
        ("node", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("incremental", pa.string()),
        ("chunk", pa.int32()),
        ("last", pa.bool_()),
        ("since", pa.int64()),
        ("redo", pa.string()),
    ]
)
_MARKER_KEYS: Final = tuple(field.name for field in SNAPSHOT_TYPE)
# The op of the one row of an incremental snapshot chunk that kept no row.
SNAPSHOT_OP: Final = "snapshot"
ARROW_SCHEMA: Final = pa.schema(
    [
        pa.field(name, column_type, nullable=name in NULLABLE)
        for name, column_type in (
            ("csn", pa.int64()),
            ("gid", pa.string()),
            # Spark hands Python data sources timestamps as microseconds in UTC.
            ("commit_time", pa.timestamp("us", tz="UTC")),
            ("seq", pa.int32()),
            ("node", pa.string()),
            ("xid", pa.int64()),
            ("cid", pa.int32()),
            ("lsn", pa.string()),
            ("op", pa.string()),
            ("schema", pa.string()),
            ("table", pa.string()),
            ("old", pa.string()),
            ("new", pa.string()),
            ("unchanged", pa.list_(pa.string())),
            ("key", pa.list_(pa.string())),
            ("snapshot", SNAPSHOT_TYPE),
        )
    ]
)
# The rows as csnd sends them (Fetch's messages, the service's files): every
# column nullable, as services sent them before the NOT NULL flags, so a
# source of that version still reads a newer service's rows (`wire_rows`: those
# of no snapshot chunk).  `source_rows` gives them ARROW_SCHEMA's flags again,
# without a copy.
WIRE_SCHEMA: Final = pa.schema([field.with_nullable(True) for field in ARROW_SCHEMA])
COLUMNS: Final = tuple(ARROW_SCHEMA.names)
# The columns a service sent before `snapshot` was appended (still read).
_BEFORE_SNAPSHOT: Final = ARROW_SCHEMA.remove(ARROW_SCHEMA.get_field_index("snapshot"))
_WIRE_BEFORE_SNAPSHOT: Final = WIRE_SCHEMA.remove(WIRE_SCHEMA.get_field_index("snapshot"))


class _Node(msgspec.Struct):
    xid: int
    commit_lsn: str | None = None


class _Marker(msgspec.Struct):
    """A `snapshot` marker's fields the rows carry (a completion record's others are ignored)."""

    node: str | None = None
    schema: str | None = None
    table: str | None = None
    incremental: str | None = None
    chunk: int | None = None
    last: bool | None = None
    since: int | None = None
    redo: str | None = None


class _Change(msgspec.Struct):
    node: str
    cid: int
    lsn: str
    op: str
    schema: str
    table: str
    old: msgspec.Raw
    new: msgspec.Raw
    key: list[str] | None = None  # (absent from a first-revision line: unknown)
    unchanged: list[str] | None = None


class _Txn(msgspec.Struct):
    csn: int
    gid: str | None
    commit_time: str
    nodes: dict[str, _Node]
    changes: list[_Change]
    snapshot: _Marker | None = None


# The usual line decoded into these types in one C pass: `old` and `new` stay
# unparsed (msgspec.Raw: their exact bytes in the line), where the json
# module parsed every value of every row only for the text to be found
# again -- 16 us a row against 3 in the bench's transactions.  A line that
# does not fit the types takes the json module's paths below.
_decode_txn: Final = msgspec.json.Decoder(_Txn).decode
_NULL: Final = b"null"


class RowBuilder:
    """Collects the rows of whole transactions; `take()` returns them as one RecordBatch.

    `rows` is how many rows are waiting, so a reader can cut batches near a
    size it likes -- always between transactions, never inside one.
    """

    __slots__ = ("_cols", "rows")

    def __init__(self) -> None:
        self._cols: list[list[Any]] = [[] for _ in COLUMNS]
        self.rows = 0

    def add(self, csn: int, line: bytes | str) -> None:
        """Appends one row per change of the transaction `line` (whose csn is `csn`)."""
        try:
            txn = _decode_txn(line)
        except (msgspec.DecodeError, UnicodeDecodeError):  # (another shape, or not a transaction:
            self._add_parsed(csn, line)  # the general path says which)
        else:
            self._add_typed(csn, txn)

    def _add_typed(self, csn: int, txn: _Txn) -> None:
        if txn.csn != csn:
            raise ValueError(f"csn {csn}: the line says csn {txn.csn!r}")
        changes = txn.changes
        marker = _typed_marker(txn.snapshot)
        if not changes and marker is not None and marker["incremental"] is not None:
            changes = [_typed_marker_change(txn, marker)]
        n = len(changes)
        if not n:
            return
        nodes = txn.nodes
        names = [ch.node for ch in changes]
        try:
            xids = [nodes[name].xid for name in names]
        except KeyError:
            bad = next(name for name in names if name not in nodes)
            raise ValueError(
                f"csn {csn}: change {names.index(bad)} is from node {bad!r}, which the nodes map does not list"
            ) from None
        cols = self._cols
        # Per transaction, not per row: take() repeats them (in C) over the rows.
        cols[0].append(csn)
        cols[1].append(txn.gid)
        cols[2].append(txn.commit_time)
        cols[3].append(n)
        cols[4].extend(names)
        cols[5].extend(xids)
        cols[6].extend([ch.cid for ch in changes])
        cols[7].extend([ch.lsn for ch in changes])
        cols[8].extend([ch.op for ch in changes])
        cols[9].extend([ch.schema for ch in changes])
        cols[10].extend([ch.table for ch in changes])
        # old and new as the line's own bytes (pyarrow takes UTF-8 bytes for a string column).
        cols[11].extend([None if (raw := bytes(ch.old)) == _NULL else raw for ch in changes])
        cols[12].extend([None if (raw := bytes(ch.new)) == _NULL else raw for ch in changes])
        c_unch = cols[13]
        if any(ch.unchanged is not None for ch in changes):
            if not c_unch:  # (the first with any: the rows before it had none)
                c_unch.extend([[]] * self.rows)
            c_unch.extend([ch.unchanged or [] for ch in changes])
        elif c_unch:
            c_unch.extend([[]] * n)
        cols[14].extend([ch.key for ch in changes])
        cols[15].append(marker)
        self.rows += n

    def _add_parsed(self, csn: int, line: bytes | str) -> None:
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as e:
            raise ValueError(f"csn {csn}: the line is not UTF-8 ({e})") from None
        try:
            head, changes = parse_as_written(text)
        except (ValueError, IndexError, TypeError, KeyError, AttributeError):
            head = {}
        try:
            if not head:
                head, changes = parse_any(text)
        except (ValueError, IndexError, TypeError) as e:
            raise ValueError(f"csn {csn}: not a transaction line: {e}") from None
        line_csn = head.get("csn")
        if line_csn != csn:
            raise ValueError(f"csn {csn}: the line says csn {line_csn!r}")
        nodes = head.get("nodes")
        if not isinstance(nodes, dict):
            raise ValueError(f"csn {csn}: the line has no nodes map")
        gid = head.get("gid")
        commit_time = head.get("commit_time")
        marker = _parsed_marker(head.get("snapshot"))
        if not changes and marker is not None and marker["incremental"] is not None:
            changes = [_parsed_marker_change(nodes, marker)]
        n = len(changes)
        if not n:
            return
        names = [ch.get("node") for ch in changes]
        try:
            xids = [nodes[name]["xid"] for name in names]
        except (KeyError, TypeError):
            bad = next(name for name in names if not isinstance(nodes.get(name), dict))
            raise ValueError(
                f"csn {csn}: change {names.index(bad)} is from node {bad!r}, which the nodes map does not list"
            ) from None
        # Column by column: a comprehension per column costs less than a
        # Python loop appending to fifteen lists per change.
        (
            c_csn,
            c_gid,
            c_time,
            c_seq,
            c_node,
            c_xid,
            c_cid,
            c_lsn,
            c_op,
            c_schema,
            c_table,
            c_old,
            c_new,
            c_unch,
            c_key,
            c_marker,
        ) = self._cols
        # Per transaction, not per row: take() repeats them (in C) over the rows.
        c_csn.append(csn)
        c_gid.append(gid)
        c_time.append(commit_time)
        c_seq.append(n)
        c_node.extend(names)
        c_xid.extend(xids)
        c_cid.extend([ch.get("cid") for ch in changes])
        c_lsn.extend([ch.get("lsn") for ch in changes])
        c_op.extend([ch.get("op") for ch in changes])
        c_schema.extend([ch.get("schema") for ch in changes])
        c_table.extend([ch.get("table") for ch in changes])
        c_old.extend([ch.get("old") for ch in changes])
        c_new.extend([ch.get("new") for ch in changes])
        if any("unchanged" in ch for ch in changes):
            if not c_unch:  # (the first with any: the rows before it had none)
                c_unch.extend([[]] * self.rows)
            c_unch.extend([ch.get("unchanged") or [] for ch in changes])
        elif c_unch:
            c_unch.extend([[]] * n)
        c_key.extend([ch.get("key") for ch in changes])
        c_marker.append(marker)
        self.rows += len(changes)

    def take(self) -> pa.RecordBatch:
        """The rows collected so far as one RecordBatch of ARROW_SCHEMA; the builder starts empty."""
        cols = self._cols
        rows = self.rows
        self._cols = [[] for _ in COLUMNS]
        self.rows = 0
        t_csn, t_gid, t_time, t_count, t_marker = cols[0], cols[1], cols[2], cols[3], cols[15]
        counts = np.asarray(t_count, dtype=np.int64)
        # Row r belongs to transaction owner[r]; its seq is its place in that transaction.
        owner = pa.array(np.repeat(np.arange(len(t_count), dtype=np.int64), counts))
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        seq = np.arange(rows, dtype=np.int64) - starts
        try:  # (once a transaction)
            times = _times(t_time)
        except _UNFIT as e:
            bad = _first_unfit(t_time, _times)
            raise ValueError(f"csn {t_csn[bad]}: commit_time {t_time[bad]!r} is not a time ({e})") from None
        arrays = [
            pa.array(t_csn, pa.int64()).take(owner),
            pa.array(t_gid, pa.string()).take(owner),
            times.take(owner),
            pa.array(seq.astype(np.int32), pa.int32()),
        ]
        for name, values in zip(COLUMNS[4:-3], cols[4:-3], strict=True):
            column_type = ARROW_SCHEMA.field(name).type
            try:
                arrays.append(pa.array(values, column_type))
            except _UNFIT as e:
                row = _first_unfit(values, functools.partial(pa.array, type=column_type))
                txn = owner[row].as_py()
                raise ValueError(
                    f"csn {t_csn[txn]}: the {name} of a change cannot be a column value ({e})"
                ) from None
        unchanged = cols[-3]
        if unchanged:
            arrays.append(pa.array(unchanged, ARROW_SCHEMA.field("unchanged").type))
        else:  # (the usual case: every row's list is empty, made without a Python list a row)
            arrays.append(
                pa.ListArray.from_arrays(
                    pa.array(np.zeros(rows + 1, dtype=np.int32)), pa.array([], pa.string())
                )
            )
        arrays.append(pa.array(cols[-2], ARROW_SCHEMA.field("key").type))
        arrays.append(_markers(t_marker, t_csn).take(owner))
        batch = pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
        missing = nulls_where_never_null(batch)  # (pyarrow lets a NOT NULL column hold nulls)
        if missing:
            nulls = batch.column(missing[0]).is_null().to_numpy(zero_copy_only=False)
            txn = owner[int(np.flatnonzero(nulls)[0])].as_py()
            raise ValueError(f"csn {t_csn[txn]}: a change has no {missing[0]}")
        return batch


def _typed_marker(m: _Marker | None) -> dict[str, Any] | None:
    """The `snapshot` column's value for a line's marker: None unless it marks a chunk."""
    if m is None or m.table is None or m.chunk is None:
        return None
    return {name: getattr(m, name) for name in _MARKER_KEYS}


def _parsed_marker(m: Any) -> dict[str, Any] | None:
    if not isinstance(m, dict) or "table" not in m or "chunk" not in m:
        return None
    return {name: m.get(name) for name in _MARKER_KEYS}


def _typed_marker_change(txn: _Txn, marker: dict[str, Any]) -> _Change:
    """The row of an incremental chunk that kept no row: its node's commit LSN, no row values."""
    node = txn.nodes.get(marker["node"])
    return _Change(
        node=marker["node"],
        cid=0,
        lsn=node.commit_lsn if node is not None else None,  # type: ignore[arg-type]  # (checked in take)
        op=SNAPSHOT_OP,
        schema=marker["schema"],
        table=marker["table"],
        old=msgspec.Raw(_NULL),
        new=msgspec.Raw(_NULL),
    )


def _parsed_marker_change(nodes: dict[str, Any], marker: dict[str, Any]) -> dict[str, Any]:
    node = nodes.get(marker["node"])
    lsn = node.get("commit_lsn") if isinstance(node, dict) else None
    return {
        "node": marker["node"],
        "cid": 0,
        "lsn": lsn,
        "op": SNAPSHOT_OP,
        "schema": marker["schema"],
        "table": marker["table"],
        "old": None,
        "new": None,
    }


def _markers(markers: list[dict[str, Any] | None], csns: list[int]) -> pa.Array:
    """The `snapshot` column's value of each transaction (all null, the usual case, without a Python list)."""
    if not any(m is not None for m in markers):
        return pa.nulls(len(markers), SNAPSHOT_TYPE)
    try:
        return pa.array(markers, SNAPSHOT_TYPE)
    except _UNFIT as e:
        bad = _first_unfit(markers, functools.partial(pa.array, type=SNAPSHOT_TYPE))
        raise ValueError(f"csn {csns[bad]}: its snapshot marker cannot be a column value ({e})") from None


def wire_rows(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` (ARROW_SCHEMA's columns) in WIRE_SCHEMA, as csnd sends rows; no copy.

    Rows no snapshot chunk read go without the `snapshot` column (all null
    there), in exactly the columns a source older than it requires; the
    rows of a chunk need it, and such a source refuses them, saying so.
    """
    columns = batch.columns
    if len(columns) == len(ARROW_SCHEMA) and columns[-1].null_count == batch.num_rows:
        columns = columns[:-1]
    schema = WIRE_SCHEMA if len(columns) == len(WIRE_SCHEMA) else _WIRE_BEFORE_SNAPSHOT
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def source_rows(batch: pa.RecordBatch) -> pa.RecordBatch | None:
    """`batch` as rows of ARROW_SCHEMA, or None if it does not hold them.

    Spark trusts a NOT NULL column: a null there is read as garbage, not
    refused, and pyarrow does not check it either.  So a batch from anywhere
    but this process's RowBuilder is checked here (the counts are kept with
    the batch: no row is looked at).  A service sends its rows with every
    column nullable (WIRE_SCHEMA): the same columns, once checked, are given
    the schema's flags (without a copy).
    """
    return None if not_source_rows(batch) is not None else with_source_flags(batch)


def with_source_flags(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch`, which `not_source_rows` passed, with ARROW_SCHEMA's NOT NULL flags; no copy.

    A service older than the `snapshot` column sends the columns before it:
    the column is added, all null (such a service sent no marker).
    """
    if batch.schema.equals(ARROW_SCHEMA):
        return batch
    columns = batch.columns
    if len(columns) == len(_BEFORE_SNAPSHOT):
        columns = [*columns, pa.nulls(batch.num_rows, SNAPSHOT_TYPE)]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def not_source_rows(batch: pa.RecordBatch) -> str | None:
    """What keeps `batch` from being rows of ARROW_SCHEMA, in a few words for an error; None if nothing."""
    schema = batch.schema
    if (schema.names, schema.types) not in (
        (ARROW_SCHEMA.names, ARROW_SCHEMA.types),
        (_BEFORE_SNAPSHOT.names, _BEFORE_SNAPSHOT.types),
    ):
        return f"columns {schema.names}"
    missing = nulls_where_never_null(batch)
    return f"nulls in {', '.join(missing)}, which are never null" if missing else None


def nulls_where_never_null(batch: pa.RecordBatch) -> list[str]:
    """The NOT NULL columns of ARROW_SCHEMA in which `batch` (of its columns) has a null."""
    # (not strict: a batch from an older service lacks the nullable columns appended since)
    columns = zip(ARROW_SCHEMA, batch.columns, strict=False)
    return [field.name for field, column in columns if column.null_count and not field.nullable]


# What pyarrow raises for a value its column's type cannot hold.
_UNFIT: Final = (pa.ArrowInvalid, pa.ArrowTypeError)


def _times(texts: list[Any]) -> pa.Array:
    """commit_time texts as the schema's timestamps (Arrow parses ISO 8601 with an offset in C)."""
    return pa.array(texts, pa.string()).cast(ARROW_SCHEMA.field("commit_time").type)


def _first_unfit(values: list[Any], convert: Callable[[list[Any]], Any]) -> int:
    """The index of the first value `convert` refuses alone (the error path only: one value at a time)."""
    for i, value in enumerate(values):
        try:
            convert([value])
        except _UNFIT:
            return i
    return 0  # (refused together only: name the first)


def flatten(records: Iterable[tuple[int, bytes | str]]) -> pa.RecordBatch:
    """All rows of `records` ((csn, line) pairs) as one RecordBatch."""
    b = RowBuilder()
    for csn, line in records:
        b.add(csn, line)
    return b.take()


def keep_tables(
    batch: pa.RecordBatch,
    schemas: frozenset[str],
    tables: frozenset[tuple[str, str]],
    carry: tuple[int, int] = (0, -1),
) -> pa.RecordBatch:
    """The rows of the `tables` (schema, table) and of every table of the `schemas`; `seq` renumbered.

    What a `tables` filter leaves of rows built unfiltered, as the lines
    path cuts a line (docs/design.md section 8: `seq` counts the kept
    changes of each transaction).  The rows are in (csn, seq) order, so a
    transaction's kept rows are consecutive and their new seq is their
    distance from its first kept row.  `carry` is (csn, seq) of the last
    row kept before this batch: a transaction that began there goes on
    counting from it.  Both empty: the batch as it is.
    """
    if not (schemas or tables) or batch.num_rows == 0:
        return batch
    schema, table = batch.column(9), batch.column(10)
    mask = pc.is_in(schema, value_set=pa.array(sorted(schemas), pa.string()))
    if tables:
        pairs = pc.binary_join_element_wise(schema, table, "\x00")
        wanted = pa.array(sorted(f"{s}\x00{t}" for s, t in tables), pa.string())
        mask = pc.or_(mask, pc.is_in(pairs, value_set=wanted))
    kept = batch.filter(pc.fill_null(mask, False))
    n = kept.num_rows
    if n == 0:
        return kept
    csns = kept.column(0).to_numpy(zero_copy_only=False)
    index = np.arange(n, dtype=np.int64)
    firsts = np.flatnonzero(np.r_[True, csns[1:] != csns[:-1]])
    seq = index - firsts[np.searchsorted(firsts, index, side="right") - 1]
    if csns[0] == carry[0]:
        seq[: firsts[1] if len(firsts) > 1 else n] += carry[1] + 1
    return kept.set_column(3, ARROW_SCHEMA.field(3), pa.array(seq.astype(np.int32), pa.int32()))
