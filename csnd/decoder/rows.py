"""Row changes: raw pgoutput changes + table metadata -> `DecodedChange` bodies.

    Relation / Type messages ──► RelationCache ── per table, once: column names,
                                                  key columns, one binary and one
                                                  text decoder per column and their
                                                  JSON-text builders, the body's
                                                  fixed text
    Change / Truncate ─────────► decode_change ── split tuples (decoder.tuples),
                                 row_change_body  each value straight to JSON text
                                                  (decoder.jsontext over
                                                  decoder.values), one join per tuple

Every decoder process keeps its own `RelationCache`; the reader broadcasts
Relation and Type messages to all of them in stream order, so a table's
metadata is replaced (DDL mid-stream) before any later change of it is
decoded.  Everything a change needs is looked up when its Relation arrives,
not per change: the hot loop is a reader function compiled for the table
(`_compile_row_reader`), one straight run of code per column.

The body is the JSON text of a change object of docs/design.md section 7 after
`"cid": N, ` (the sender knows the cid, the coordinator the node), without
the closing brace:

    "lsn": "0/16B3700", "op": "update", "schema": "public", "table": "acct", "key": ["id"],
    "old": {"id": 7}, "new": {"id": 8, "owner": "bo"}, "unchanged": ["doc"]

`key` names the columns the Relation message flags as the replica identity's
(flags bit 1), in column order: the primary key or the index of REPLICA
IDENTITY DEFAULT / USING INDEX, every column for FULL, none for NOTHING.  It
is part of the table's fixed text, so it costs a change only its bytes.
`old` follows the old tuple pgoutput sent: a key tuple ('K') holds every
column, the non-key ones null, and only the replica identity's key columns are
shown; a full old row ('O', REPLICA IDENTITY FULL) is shown whole; no old
tuple gives null.  Unchanged TOAST values are left out of `new` and listed in
`unchanged`, in column order.

User-defined types.  pgoutput sends a Type message for every non-built-in
column type, but it only carries the type's name -- an enum, a composite, a
range and an array of any of them look alike.  A Type message in namespace ""
(pg_catalog) is a domain over that built-in type and decodes as the built-in
one.  Any other user type must be declared to the cache (`declare_types`,
the rows of `USER_TYPES_QUERY` on a live source; `declare_enum` for an enum
alone), in both stream forms, so that both give the same JSON: an enum is its
label, a composite, range or multirange its PostgreSQL text form (rendered
from binary by `decoder.pgtext`), an array of any of them a JSON array, a
domain its base type.  An undeclared user type keeps its text form in a text
stream and is unreadable in a binary one.

A binary stream cannot carry a column csnd does not read exactly in binary
(pgoutput's `binary` option holds for the whole stream, so no single table
can fall back to text): its Relation message is refused, naming every such
column and why.  The walsender sends a Relation message without an LSN
(dataStart 0/0, as every message of a transaction but its last), so the
refusal then waits for the table's first change and names that change's LSN
and xid.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from functools import lru_cache, partial
from types import CodeType
from typing import Final

from psycopg import DataError

from csnd.core.compiled import compiled_module
from csnd.core.errors import DecodeError
from csnd.core.ids import Lsn, lsn_to_str
from csnd.decoder import jsontext as J
from csnd.decoder import pgtext
from csnd.decoder import values as V
from csnd.decoder.change import DecodedChange
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
from csnd.reader.pgoutput import Change, Relation, Truncate, TypeMsg
from csnd.reader.usertypes import USER_TYPES_QUERY

__all__ = ["USER_TYPES_QUERY", "RelationCache", "Table", "decode_change", "row_change_body"]

_KINDS: Final = {"e": "enum", "c": "composite", "r": "range", "m": "multirange", "d": "domain"}


# What a value decoder raises on bad input; anything else is a bug and travels
# as such.
_VALUE_ERRORS: Final = (ValueError, KeyError, IndexError, OverflowError, struct.error, DataError)

_OPS: Final = {"I": "insert", "U": "update", "D": "delete"}

_unpack_i16 = struct.Struct("!h").unpack_from
_unpack_i32 = struct.Struct("!i").unpack_from

_Decoders = tuple[str, V.BinaryDecoder, V.TextDecoder]  # column name, binary, text


class Table:
    """One relation as the decoder needs it, compiled from its Relation message."""

    __slots__ = (
        "relid",
        "schema",
        "name",
        "columns",
        "names",
        "key",
        "json_columns",
        "json_key_columns",
        "name_of",
        "type_labels",
        "read_row",
        "heads",
        "truncate_body",
        "unreadable",
    )

    def __init__(
        self,
        msg: Relation,
        columns: list[_Decoders],
        type_labels: list[str],
        unreadable: str | None,
        binary_first: bool = True,
    ) -> None:
        """`binary_first`: whether the stream is binary, so its values are mostly binary ones."""
        self.relid = msg.relid
        self.schema = msg.namespace
        self.name = msg.name
        self.columns = columns
        self.names = [c[0] for c in columns]
        # per column: `"name": ` and the JSON-text builders of its binary and text values
        self.json_columns = [(f"{J.quote(n)}: ", J.binary_json(b), J.text_json(t)) for n, b, t in columns]
        self.json_key_columns = [(i, *c) for i, c in enumerate(self.json_columns) if msg.columns[i].is_key]
        self.name_of = {key: name for name, (key, _, _) in zip(self.names, self.json_columns, strict=True)}
        self.type_labels = type_labels
        self.read_row = row_reader(self.json_columns, binary_first)
        # The key list is rendered once here, into the fixed text every change of the
        # table starts with: the per-change cost of `key` is the bytes it adds.
        self.key = [c.name for c in msg.columns if c.is_key]
        where = (
            f'"schema": {J.quote(msg.namespace)}, "table": {J.quote(msg.name)}, '
            f'"key": {J.encode_value(self.key)}, "old": '
        )
        self.heads = {k: f'"op": "{op}", {where}' for k, op in _OPS.items()}
        self.truncate_body = f'"op": "truncate", {where}null, "new": null'
        self.unreadable = unreadable  # the error a binary stream of this table is

    def __repr__(self) -> str:
        return f"Table({self.relid}, {self.schema}.{self.name}, {self.names})"

    def where(self) -> str:
        return f"{self.schema}.{self.name} (relid {self.relid})"


class RelationCache:
    """The tables and types one decoder knows, from Relation and Type messages.

    `binary` says whether the stream is a binary one; if so, a Relation
    message with a column csnd cannot read in binary raises `DecodeError`
    right away (docs/design.md section 7), before any change of it.
    """

    __slots__ = ("binary", "_tables", "_type_names", "_declared", "_arrays")

    def __init__(self, binary: bool = False) -> None:
        self.binary = binary
        self._tables: dict[int, Table] = {}
        self._type_names: dict[int, tuple[str, str]] = {}
        self._declared: dict[int, tuple[str, int]] = {}  # user type oid -> (typtype, bound or base oid)
        self._arrays: dict[int, int] = {}  # array oid of a declared type -> its element's oid

    def __len__(self) -> int:
        return len(self._tables)

    def __contains__(self, relid: object) -> bool:
        return relid in self._tables

    def declare_enum(self, type_oid: int, array_oid: int | None = None) -> None:
        """Declare a user type an enum (and `array_oid` its array), before its Relation."""
        self.declare_types([(type_oid, "e", array_oid or 0, 0)])

    def declare_types(self, types: Iterable[tuple[int, str, int, int]]) -> None:
        """Declare user types, before their Relation: rows of `USER_TYPES_QUERY`.

        Each is (oid, typtype, array oid or 0, other oid): typtype `e` an enum,
        `c` a composite, `r` a range and `m` a multirange of bounds of the
        other oid's type, `d` a domain over it; any other typtype is ignored.
        """
        for oid, kind, array_oid, other in types:
            if kind not in _KINDS:
                continue
            self._declared[oid] = (kind, other)
            if array_oid:
                self._arrays[array_oid] = oid

    def apply(self, msg: Relation | TypeMsg, lsn: int | None = None) -> None:
        """Take in a Relation (replacing the table's old metadata) or a Type message.

        A binary stream's Relation with a column csnd cannot read in binary is
        refused here when `lsn` is known (not None or 0/0), else at the table's
        first change (see the module docstring).
        """
        if isinstance(msg, TypeMsg):
            self._type_names[msg.type_oid] = (msg.namespace, msg.name)
            return
        columns: list[_Decoders] = []
        labels: list[str] = []
        problems: list[str] = []
        for col in msg.columns:
            binary, text, label = self._resolve(col.type_oid)
            labels.append(label)
            if binary is None:
                if not V.binary_readable(col.type_oid):
                    why = self._why_unreadable(col.type_oid)
                    problems.append(f'column "{col.name}" has type {label} (oid {col.type_oid}){why}')
                binary = _unreadable(col.name, label, col.type_oid)
            columns.append((col.name, binary, text))
        unreadable = None
        if problems:
            unreadable = (
                f"relation {msg.namespace}.{msg.name} (relid {msg.relid}): {'; '.join(problems)}, which "
                "csnd cannot decode in binary form; stream or record this source in text mode "
                "(pgoutput option binary 'false')"
            )
        self._tables[msg.relid] = Table(msg, columns, labels, unreadable, self.binary)
        if unreadable and self.binary and lsn:
            raise DecodeError(unreadable, lsn=lsn, xid=msg.xid)

    def table(self, relid: int) -> Table:
        try:
            return self._tables[relid]
        except KeyError:
            raise DecodeError(
                f"change for unknown relation id {relid}: no Relation message for it came first; "
                "the stream began after it was sent (a cut or resumed recording) or is corrupt"
            ) from None

    def _resolve(self, oid: int) -> tuple[V.BinaryDecoder | None, V.TextDecoder, str]:
        """(binary decoder or None if unreadable, text decoder, label) of a column type."""
        declared = self._declared.get(oid)
        if declared is not None:
            kind, other = declared
            if kind == "d":
                binary, text, label = self._resolve(other)
                return binary, text, f"domain over {label}"
            label = self._label(oid, _KINDS[kind])
            if kind == "e":
                return V.enum_binary, V.enum_text, label
            return self._pg_text(oid), V.text_form, label
        elem = self._arrays.get(oid)
        if elem is not None:
            elem_binary, elem_text, elem_label = self._resolve(elem)
            binary = None if elem_binary is None else V.binary_array(elem, elem_binary)
            return binary, V.text_array(elem_text), f"{elem_label}[]"
        named = self._type_names.get(oid)
        if named is not None:
            namespace, name = named
            base: int | None = None
            if namespace == "":  # a domain over a built-in type: pgoutput names the base type
                base = V.builtin_type_oid(name)
            else:  # a domain over a declared type: pgoutput gives that type's name
                base = next((t for t in self._declared if self._type_names.get(t) == named), None)
            if base is not None and base != oid:
                binary, text, label = self._resolve(base)
                return binary, text, f"domain over {label}"
            return None, V.text_decoder(oid), self._label(oid, "user type")
        return V.binary_decoder(oid), V.text_decoder(oid), self._label(oid, "type")

    def _pg_text(self, oid: int) -> pgtext.PgText | None:
        """The renderer of type `oid`'s text output from its binary form (built in or declared), or None."""
        builtin = V.pg_text(oid)
        if builtin is not None:
            return builtin
        declared = self._declared.get(oid)
        if declared is not None:
            kind, other = declared
            if kind == "e":
                return V.enum_binary
            if kind == "d":
                return self._pg_text(other)
            if kind == "c":
                field_text = self._pg_text
                return lambda data: pgtext.record_out(data, field_text)
            bound = self._pg_text(other)
            if bound is None:
                return None
            return V.multirange_binary(bound) if kind == "m" else V.range_binary(bound)
        elem = self._arrays.get(oid)
        if elem is not None:
            elem_text = self._pg_text(elem)
            return None if elem_text is None else V.pg_array_text(elem, elem_text)
        return None

    def _why_unreadable(self, oid: int) -> str:
        """`: why`, for the refusal of a column of type `oid` in a binary stream."""
        declared = self._declared.get(oid)
        while declared is not None and declared[0] == "d":
            oid = declared[1]
            declared = self._declared.get(oid)
        elem = self._arrays.get(oid)
        if elem is not None:
            return self._why_unreadable(elem)
        if declared is not None:
            name = V.builtin_type_name(declared[1]) or f"oid {declared[1]}"
            return f": its bounds' type {name} has no exact text form csnd renders from binary"
        reason = V.no_binary_reason(oid)
        if reason is not None:
            return f": {reason}"
        if oid in self._type_names:
            return ": a user type not declared to the decoder (an enum, composite or range created after it started?)"
        return ""

    def _label(self, oid: int, kind: str) -> str:
        named = self._type_names.get(oid)
        if named is not None:
            return f"{kind} {named[0] or 'pg_catalog'}.{named[1]}"
        return V.builtin_type_name(oid) or f"unknown {kind}"


def _unreadable(column: str, label: str, oid: int) -> V.BinaryDecoder:
    def decode(data: bytes) -> V.JsonValue:
        raise DecodeError(
            f'column "{column}" of type {label} (oid {oid}) arrived in binary form, which csnd '
            "cannot decode; use text mode (pgoutput option binary 'false')"
        )

    return decode


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
    if pos + 2 > end or _unpack_i16(data, pos)[0] != len(columns):
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
                pos = start + _unpack_i32(data, pos + 1)[0]
                if pos > end or pos < start:
                    return None
                append(key + binary(data[start:pos]))
            elif kind == KIND_NULL:
                append(key + "null")
                pos += 1
            elif kind == KIND_TEXT:
                start = pos + 5
                pos = start + _unpack_i32(data, pos + 1)[0]
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


# One column of a compiled row reader (`_compile_row_reader`), column {i}: its
# kind byte, then a value of the stream's form, of the other form, or NULL.
_READ_COLUMN: Final = """\
    kind = data[pos]
{first}{second}    elif kind == {null}:
        v{i} = "null"
        pos += 1
    else:
        return None
"""
# A length-prefixed value of one form, read into local v{i} by `build`.
_READ_VALUE: Final = """\
    {keyword} kind == {kind}:
        start = pos + 5
        pos = start + unpack_i32(data, pos + 1)[0]
        if pos > end or pos < start:
            return None
        v{i} = {build}
"""
_BUILDERS: Final = {
    KIND_BINARY: "binary{i}(data[start:pos])",
    KIND_TEXT: 'text{i}(data[start:pos].decode("utf-8"))',
}

RowReader = Callable[[bytes, int, int], "tuple[str, int] | None"]


def row_reader(columns: list[tuple[str, J.BinaryJson, J.TextJson]], binary_first: bool) -> RowReader:
    """A table's row reader: the compiled one (`_rows.c`), which writes the common types itself
    and any other column through its builders.

    When it was not built, or `CSND_IMPL=python` asks for the twins, the
    reader `_compile_row_reader` compiles in Python (the compiled one's
    specification: the same results, held so by tests).
    """
    compiled = _read_row_c
    if compiled is None:
        return _compile_row_reader(columns, binary_first)
    codes, builders = J.compiled_codes(columns)
    keys = tuple(key.encode() for key, _, _ in columns)
    return partial(compiled, codes, keys, J.quote, builders)


_compiled = compiled_module("csnd.decoder._rows")
_read_row_c: Callable[..., tuple[str, int] | None] | None = None if _compiled is None else _compiled.read_row
one_change_line_c: Callable[..., str | None] | None = None if _compiled is None else _compiled.one_change_line


def _compile_row_reader(columns: list[tuple[str, J.BinaryJson, J.TextJson]], binary_first: bool) -> RowReader:
    """`_row_wire` for one table, unrolled: `read(data, pos, end)` -> (row JSON, end of the tuple) or None.

    The decoder's hot loop is one of these per row.  Compiled from the
    table's Relation message (as `collections.namedtuple` compiles its
    class), it reads column i into local `v{i}` with column i's builders
    bound as globals, and ends with one %-format of all the values -- no
    per-column tuple unpacking, list append or join; about a tenth less
    time per wide row than the loop.  Only the column index appears in the
    generated source; names and builders come in through the namespace.
    It gives up (None) on what `_row_wire` handles or rejects: a column
    count other than the table's, an unchanged TOAST value, an unknown
    kind, a length past `end`, a value its builder refuses.
    """
    namespace: dict[str, object] = {"unpack_i32": _unpack_i32, "unpack_i16": _unpack_i16}
    for i, (_, binary, text) in enumerate(columns):
        namespace[f"binary{i}"] = binary
        namespace[f"text{i}"] = text
    namespace["ROW"] = "{" + ", ".join(key.replace("%", "%%") + "%s" for key, _, _ in columns) + "}"
    exec(_row_reader_code(len(columns), binary_first), namespace)  # (see above)
    return namespace["read_row"]  # type: ignore[return-value]


@lru_cache(maxsize=64)
def _row_reader_code(n_columns: int, binary_first: bool) -> CodeType:
    """The code of `_compile_row_reader` for tables of `n_columns`: compiled once per width and form.

    (Compiling costs about a tenth of a millisecond a column, which every
    decoder would pay again for every Relation message of a wide table.)
    """
    first, second = (KIND_BINARY, KIND_TEXT) if binary_first else (KIND_TEXT, KIND_BINARY)
    lines = [
        "def read_row(data, pos, end):",
        "  try:",
        f"    if pos + 2 > end or unpack_i16(data, pos)[0] != {n_columns}:",
        "        return None",
        "    pos += 2",
    ]
    for i in range(n_columns):
        forms = [
            _READ_VALUE.format(keyword=keyword, kind=kind, i=i, build=_BUILDERS[kind].format(i=i))
            for keyword, kind in (("if", first), ("elif", second))
        ]
        lines.append(_READ_COLUMN.format(first=forms[0], second=forms[1], null=KIND_NULL, i=i).rstrip("\n"))
    values = "".join(f"v{i}, " for i in range(n_columns))
    lines += [
        "  except Exception:  # any failure: the checked path raises the precise error",
        "    return None",
        f"  return ROW % ({values}), pos",
    ]
    return compile("\n".join(lines), "<csnd row reader>", "exec")


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
    return [DecodedChange(lsn, xid, _OPS[change.kind], body)]


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
        raise DecodeError(f"{_OPS[kind]} of {table.where()}: {e.message}", lsn=lsn, xid=xid) from None
    raise DecodeError(f"unknown change kind {kind!r} for {table.where()}", lsn=lsn, xid=xid)
