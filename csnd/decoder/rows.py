"""Row changes: raw pgoutput changes + a decoder's tables -> `DecodedChange` bodies.

    Change / Truncate ─► decode_change / row_change_body
                           new tuple only ─► the table's row reader (decoder.rowreader)
                                             └ gave up ─► _row_wire, one loop off the wire
                                                          └ gave up ─► the checked path
                           old tuple, delete, odd rows ─► the checked path: split tuples
                                             (decoder.tuples), `_row` / `_old`, which
                                             name what is wrong

The tables come from a `RelationCache` (decoder.relations: the Relation and
Type messages, user types, the binary stream's refusals); each value goes
straight to JSON text (decoder.jsontext over decoder.values), one join or
%-format per tuple.  Every fast path must say what the checked path says --
the same body, or give up so that the checked path raises its error
(tests/decoder/test_rows.py holds them to it).

The body is the JSON text of a change object of docs/design.md section 7 after
`"cid": N, ` (the sender knows the cid, the coordinator the node), without
the closing brace:

    "lsn": "0/16B3700", "op": "update", "schema": "public", "table": "acct", "key": ["id"],
    "old": {"id": 7}, "new": {"id": 8, "owner": "bo"}, "unchanged": ["doc"]

`key` is the table's replica identity's columns (see decoder.relations).
`old` follows the old tuple pgoutput sent: a key tuple ('K') holds every
column, the non-key ones null, and only the replica identity's key columns are
shown; a full old row ('O', REPLICA IDENTITY FULL) is shown whole; no old
tuple gives null.  Unchanged TOAST values are left out of `new` and listed in
`unchanged`, in column order.
"""

from __future__ import annotations

import struct
from typing import Final

from psycopg import DataError

from csnd.core.errors import DecodeError
from csnd.core.ids import Lsn, lsn_to_str
from csnd.decoder import jsontext as J
from csnd.decoder.change import DecodedChange
from csnd.decoder.relations import OPS, USER_TYPES_QUERY, RelationCache, Table
from csnd.decoder.rowreader import unpack_i16, unpack_i32
from csnd.decoder.tuples import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED,
    NEW_TUPLE,
    UNCHANGED,
    TupleValue,
    split_delete,
    split_insert,
    split_update,
)
from csnd.reader.pgoutput import Change, Truncate

# (RelationCache, Table and USER_TYPES_QUERY are decoder.relations's, named here too:
# the decoder's callers take a table's cache and its bodies from one module.)
__all__ = ["USER_TYPES_QUERY", "RelationCache", "Table", "decode_change", "row_change_body"]

# What a value decoder raises on bad input; anything else is a bug and travels
# as such.
_VALUE_ERRORS: Final = (ValueError, KeyError, IndexError, OverflowError, struct.error, DataError)


def _value_error(table: Table, name: str, value: TupleValue, e: Exception) -> str:
    label = table.type_labels[table.names.index(name)]
    if isinstance(value, bytes):
        what = f"binary value of {len(value)} bytes"
    else:
        what = f"text value of {len(value or '')} characters"
    return f'cannot decode column "{name}" ({label}, {what}) of {table.where()}: {type(e).__name__}: {e}'


def _check_width(table: Table, values: list[TupleValue], lsn: int, xid: int | None) -> None:
    if len(values) != len(table.columns):
        raise DecodeError(
            f"tuple of {len(values)} columns for {table.where()} of {len(table.columns)} columns; "
            "the change does not match the table's last Relation message",
            lsn=lsn,
            xid=xid,
        )


def _row(table: Table, values: list[TupleValue], lsn: int, xid: int | None) -> tuple[str, str]:
    """The JSON object of a whole row, and the `, "unchanged": [...]` part ('' if none)."""
    _check_width(table, values, lsn, xid)
    parts: list[str] = []
    append = parts.append
    unchanged: list[str] | None = None
    key = ""
    v: TupleValue = None
    try:
        for (key, binary, text), v in zip(table.json_columns, values, strict=True):
            if isinstance(v, bytes):
                append(key + binary(v))
            elif v is None:
                append(key + "null")
            elif v is UNCHANGED:
                if unchanged is None:
                    unchanged = []
                unchanged.append(table.name_of[key])
            else:
                append(key + text(v))
    except _VALUE_ERRORS as e:
        raise DecodeError(_value_error(table, table.name_of[key], v, e), lsn=lsn, xid=xid) from e
    body = "{" + ", ".join(parts) + "}"
    return body, _unchanged_json(unchanged)


def _row_wire(table: Table, data: bytes, pos: int) -> tuple[str, str, int] | None:
    """`_row` of the tuple at `data[pos]` read straight off the wire, and its end; None at any oddity.

    The path of inserts (and of updates that log no old tuple) that the
    table's compiled reader leaves -- rows with unchanged TOAST values, and
    anything odd, before the checked path: one walk
    builds each column's JSON text as it meets the column, instead of
    `split_tuple`'s list of values and then `_row`'s second loop over it --
    about a third less time for a wide row.  It checks only what keeps it
    inside the data, and gives up (None) at the first thing out of the
    ordinary -- a column count other than the table's, a length past the
    end, an unknown kind, a value its builder refuses -- so that the caller
    takes the checked path (`split_tuple` + `_row`), which names the problem.
    """
    end = len(data)
    columns = table.json_columns
    if pos + 2 > end or unpack_i16(data, pos)[0] != len(columns):
        return None
    pos += 2
    parts: list[str] = []
    append = parts.append
    unchanged: list[str] | None = None
    try:
        for key, binary, text in columns:
            kind = data[pos]
            if kind == KIND_BINARY:
                start = pos + 5
                pos = start + unpack_i32(data, pos + 1)[0]
                if pos > end or pos < start:
                    return None
                append(key + binary(data[start:pos]))
            elif kind == KIND_NULL:
                append(key + "null")
                pos += 1
            elif kind == KIND_TEXT:
                start = pos + 5
                pos = start + unpack_i32(data, pos + 1)[0]
                if pos > end or pos < start:
                    return None
                append(key + text(data[start:pos].decode("utf-8")))
            elif kind == KIND_UNCHANGED:
                if unchanged is None:
                    unchanged = []
                unchanged.append(table.name_of[key])
                pos += 1
            else:
                return None
    except Exception:  # (any failure: the checked path raises the precise error)
        return None
    return "{" + ", ".join(parts) + "}", _unchanged_json(unchanged), pos


def _unchanged_json(names: list[str] | None) -> str:
    """`, "unchanged": [...]` after a row's new tuple, or '' when every column was sent."""
    return "" if names is None else f', "unchanged": {J.encode_value(names)}'


def _old(table: Table, kind: str, values: list[TupleValue], lsn: int, xid: int | None) -> str:
    """The `old` JSON: the key columns of a 'K' tuple, or the whole 'O' row."""
    if kind == "O":
        body, unchanged = _row(table, values, lsn, xid)
        if unchanged:
            raise DecodeError(
                f"old row of {table.where()} has unchanged TOAST values; pgoutput sends old rows whole",
                lsn=lsn,
                xid=xid,
            )
        return body
    _check_width(table, values, lsn, xid)
    parts: list[str] = []
    key = ""
    v: TupleValue = None
    try:
        for i, key, binary, text in table.json_key_columns:
            v = values[i]
            if isinstance(v, bytes):
                parts.append(key + binary(v))
            elif v is None:
                parts.append(key + "null")
            elif v is UNCHANGED:
                raise DecodeError(
                    f"old key of {table.where()} has an unchanged TOAST value", lsn=lsn, xid=xid
                )
            else:
                parts.append(key + text(v))
    except _VALUE_ERRORS as e:
        raise DecodeError(_value_error(table, table.name_of[key], v, e), lsn=lsn, xid=xid) from e
    return "{" + ", ".join(parts) + "}"


# `_at(lsn)` + head + `null, "new": ` + row + unchanged, for the fast path of `row_change_body`
# (an insert, or an update without an old tuple); its LSN is `csnd.core.ids.lsn_to_str`'s format.
_NEW_ONLY_BODY: Final = '"lsn": "%X/%X", %snull, "new": %s%s'


def _at(lsn: int) -> str:
    """The `"lsn": "X/X", ` that opens a body."""
    return f'"lsn": "{lsn_to_str(lsn)}", '


def decode_change(
    change: Change | Truncate, lsn: Lsn, cache: RelationCache, binary: bool
) -> list[DecodedChange]:
    """Decode one Insert/Update/Delete (one result) or Truncate (one per table).

    `lsn` is the dataStart of the frame that carried the change; `binary` says
    whether the stream is binary (a table with a column unreadable in binary
    is then an error even if `cache` was not told).
    """
    xid = change.xid
    if isinstance(change, Truncate):
        out = []
        for relid in change.relids:
            try:
                table = cache.table(relid)
            except DecodeError as e:
                raise DecodeError(f"truncate: {e.message}", lsn=lsn, xid=xid) from None
            out.append(DecodedChange(lsn, xid, "truncate", _at(lsn) + table.truncate_body))
        return out
    body = row_change_body(change.kind, xid, change.relid, change.data, lsn, cache, binary)
    return [DecodedChange(lsn, xid, OPS[change.kind], body)]


def row_change_body(
    kind: str, xid: int | None, relid: int, data: bytes, lsn: int, cache: RelationCache, binary: bool
) -> str:
    """The body of one Insert ('I'), Update ('U') or Delete ('D'): `decode_change` without the object.

    The decoder workers' hot path: they send back only bodies.
    """
    try:
        table = cache.table(relid)
    except DecodeError as e:
        raise DecodeError(e.message, lsn=lsn, xid=xid) from None
    if binary and table.unreadable is not None:
        # (0/0 is no position: a snapshot's row, read outside the stream, has none to name)
        raise DecodeError(table.unreadable, lsn=lsn or None, xid=xid)
    if (kind == "I" or kind == "U") and data and data[0] == NEW_TUPLE:  # no old tuple
        end = len(data)
        row = table.read_row(data, 1, end)
        if row is not None and row[1] == end:
            # one %-format for the whole body: the hot path's every row
            return _NEW_ONLY_BODY % (lsn >> 32, lsn & 0xFFFFFFFF, table.heads[kind], row[0], "")
        fast = _row_wire(table, data, 1)  # unchanged TOAST values, or the checked path's case
        if fast is not None and fast[2] == end:
            return _NEW_ONLY_BODY % (lsn >> 32, lsn & 0xFFFFFFFF, table.heads[kind], fast[0], fast[1])
    try:
        if kind == "I":
            new, unchanged = _row(table, split_insert(data), lsn, xid)
            return f'{_at(lsn)}{table.heads["I"]}null, "new": {new}{unchanged}'
        if kind == "U":
            old_kind, old_values, new_values = split_update(data)
            old = (
                "null"
                if old_kind is None or old_values is None
                else _old(table, old_kind, old_values, lsn, xid)
            )
            new, unchanged = _row(table, new_values, lsn, xid)
            return f'{_at(lsn)}{table.heads["U"]}{old}, "new": {new}{unchanged}'
        if kind == "D":
            old_kind, old_values = split_delete(data)
            return f'{_at(lsn)}{table.heads["D"]}{_old(table, old_kind, old_values, lsn, xid)}, "new": null'
    except DecodeError as e:
        if e.lsn is not None:
            raise
        raise DecodeError(f"{OPS[kind]} of {table.where()}: {e.message}", lsn=lsn, xid=xid) from None
    raise DecodeError(f"unknown change kind {kind!r} for {table.where()}", lsn=lsn, xid=xid)
