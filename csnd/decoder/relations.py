"""A decoder's tables and types: Relation and Type messages -> `Table`, compiled once per table.

    Relation / Type messages ──► RelationCache ── per table, once: column names,
                                                  key columns, one binary and one
                                                  text decoder per column and their
                                                  JSON-text builders, the row reader
                                                  (decoder.rowreader), the body's
                                                  fixed text

Every decoder process keeps its own `RelationCache`; the reader broadcasts
Relation and Type messages to all of them in stream order, so a table's
metadata is replaced (DDL mid-stream) before any later change of it is
decoded.  Everything a change needs is looked up when its Relation arrives,
not per change (`decoder.rows` turns the changes into bodies).

`key` names the columns the Relation message flags as the replica identity's
(flags bit 1), in column order: the primary key or the index of REPLICA
IDENTITY DEFAULT / USING INDEX, every column for FULL, none for NOTHING.  It
is part of the table's fixed text, so it costs a change only its bytes.

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

from collections.abc import Iterable
from typing import Final

from csnd.core.errors import DecodeError
from csnd.decoder import jsontext as J
from csnd.decoder import pgtext
from csnd.decoder import values as V
from csnd.decoder.rowreader import row_reader
from csnd.reader.pgoutput import Relation, TypeMsg
from csnd.reader.usertypes import USER_TYPES_QUERY

__all__ = ["OPS", "USER_TYPES_QUERY", "RelationCache", "Table"]

_KINDS: Final = {"e": "enum", "c": "composite", "r": "range", "m": "multirange", "d": "domain"}

# A change's kind byte -> the `op` of its body.
OPS: Final = {"I": "insert", "U": "update", "D": "delete"}

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
        self.heads = {k: f'"op": "{op}", {where}' for k, op in OPS.items()}
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
