"""A table's column names and types, as the stream describes them: the body of a relation line.

A change names its key columns (`"key"`, rendered into every change by
`decoder.rows`), but not the types of its values: sending those with every
change, or every transaction, would cost each of them what only a Relation
message changes.  So the stream says them once per *relation version*: the
sender renders each new Relation message it meets into the body of a
relation line (docs/design.md section 7, "Relation lines")::

    "schema": "public", "table": "acct", "relid": 16384, "replica_identity": "default",
    "key": ["id"], "columns": [{"name": "id", "type": "int4", "oid": 23, "typmod": -1}, ...]

and it travels with the transaction that used that version first, to be
written (`{"relation": {"csn": .., "node": .., <body>}}`) where a consumer
asked for relation lines, and kept in the changelog's relation store so a
consumer starting anywhere learns the versions in force there.

A column's `type` is pg_type's name of a built-in type (`int4`, `numeric`,
`_text` for text[]), `schema.name` for a type outside pg_catalog (an enum, a
composite), and for a domain the type pgoutput's Type message names (its
base type); `oid` is the column's own type OID and `typmod` its atttypmod
(-1: none; varchar(n) is n + 4, numeric(p, s) is (p << 16 | s) + 4).

Pure: a Relation message (and the Type messages before it) in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from csnd.decoder import jsontext as J
from csnd.decoder import values as V
from csnd.reader.pgoutput import Relation

__all__ = ["REPLICA_IDENTITIES", "relation_body", "type_name"]

# pgoutput's replica identity setting (pg_class.relreplident) and its name in a relation line.
REPLICA_IDENTITIES: Final = {"d": "default", "f": "full", "i": "index", "n": "nothing"}


def type_name(oid: int, type_names: Mapping[int, tuple[str, str]]) -> str | None:
    """A column type's name: from its Type message if one came (namespace "" is pg_catalog), else built in."""
    named = type_names.get(oid)
    if named is not None:
        namespace, name = named
        return name if namespace in ("", "pg_catalog") else f"{namespace}.{name}"
    return V.builtin_type_name(oid)


def relation_body(msg: Relation, type_names: Mapping[int, tuple[str, str]]) -> str:
    """The JSON text of a relation line's object after `"csn": .., "node": .., ` (no braces)."""
    columns = [
        {"name": c.name, "type": type_name(c.type_oid, type_names), "oid": c.type_oid, "typmod": c.typmod}
        for c in msg.columns
    ]
    return (
        f'"schema": {J.quote(msg.namespace)}, "table": {J.quote(msg.name)}, "relid": {msg.relid}, '
        f'"replica_identity": {J.quote(REPLICA_IDENTITIES.get(msg.replident, msg.replident))}, '
        f'"key": {J.encode_value([c.name for c in msg.columns if c.is_key])}, '
        f'"columns": {J.encode_value(columns)}'
    )
