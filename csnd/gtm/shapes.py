"""Tables of the synthetic cluster and their shapes over time.

Every node holds the same six tables in schema `public`, chosen so that one
workload exercises each replica identity and each old/new-tuple rule of
pgoutput (docs/design.md section 9):

    table      identity            what it exercises
    acct       DEFAULT (pk id)     'K' old key on deletes and key-changing updates, TOAST `doc`
    wide       DEFAULT (pk id)     every column type of the wide row, TOAST `body`
    audit      FULL                'O' whole old row (detoasted), 'u' in the new tuple
    item       INDEX (sku, region) key flags on the index columns only
    event_log  NOTHING             inserts only; TRUNCATE (alone or with audit)
    evolve     FULL                DDL: ADD COLUMN with default, text -> varchar, DROP COLUMN

A `Shape` is one version of a table's columns -- what one Relation message
says.  DDL makes a new Shape; a Relation message is due whenever the shape a
change was written with is not the one last sent (`gtm.walsender`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from csnd.gtm import pgtypes as T
from csnd.gtm.pgtypes import PgType
from csnd.reader.pgoutput import Column, encode_relation

SCHEMA: Final = "public"

# Relation OIDs: user objects start at 16384.  Each node numbers its tables
# differently, as independently created databases do, so nothing downstream
# can get away with treating a relid as global.
FIRST_USER_OID: Final = 16384
RELID_NODE_STRIDE: Final = 1000


@dataclass(frozen=True)
class ColumnDef:
    name: str
    type: PgType
    typmod: int = -1


class Shape:
    """The columns of a table as one Relation message describes them."""

    __slots__ = ("table", "replident", "columns", "names", "key_pos", "flags", "key_names", "version")

    def __init__(
        self, table: str, replident: str, columns: tuple[ColumnDef, ...], keys: tuple[str, ...], version: int
    ) -> None:
        self.table = table
        self.replident = replident  # 'd' default, 'f' full, 'i' index, 'n' nothing
        self.columns = columns
        self.names = tuple(c.name for c in columns)
        self.key_pos = tuple(i for i, c in enumerate(columns) if c.name in keys)
        # pgoutput flags a column as part of the replica identity; FULL flags all.
        self.flags = tuple(1 if replident == "f" or c.name in keys else 0 for c in columns)
        # a change's `key` (docs/design.md section 7): the flagged columns' names
        self.key_names = [c.name for f, c in zip(self.flags, columns, strict=True) if f]
        self.version = version

    def relation_message(self, relid: int, xid: int | None) -> bytes:
        cols = [
            Column(f, c.name, c.type.oid, c.typmod) for f, c in zip(self.flags, self.columns, strict=True)
        ]
        return encode_relation(relid, SCHEMA, self.table, self.replident, cols, xid=xid)

    def index(self, name: str) -> int:
        return self.names.index(name)

    def __repr__(self) -> str:
        return f"Shape({self.table} v{self.version}: {', '.join(self.names)})"


@dataclass(frozen=True)
class TableDef:
    name: str
    replident: str
    columns: tuple[ColumnDef, ...]
    keys: tuple[str, ...]  # replica identity key columns (pk or index); empty for FULL / NOTHING
    toast: tuple[str, ...] = ()  # columns that get big, out-of-line values


def table_defs(extra_columns: int = 0) -> tuple[TableDef, ...]:
    """The initial schema; `extra_columns` widens `wide` with filler columns."""
    money = T.numeric_typmod(12, 2)
    wide_cols = [
        ColumnDef("id", T.INT8),
        ColumnDef("i4", T.INT4),
        ColumnDef("i8", T.INT8),
        ColumnDef("amount", T.NUMERIC, money),
        ColumnDef("ratio", T.NUMERIC),
        ColumnDef("ts", T.TIMESTAMPTZ),
        ColumnDef("note", T.TEXT),
        ColumnDef("doc", T.JSONB),
        ColumnDef("ints", T.INT4_ARRAY),
        ColumnDef("tags", T.TEXT_ARRAY),
        ColumnDef("flag", T.BOOL),
        ColumnDef("score", T.FLOAT8),
        ColumnDef("day", T.DATE),
        ColumnDef("uid", T.UUID_T),
        ColumnDef("blob", T.BYTEA),
        ColumnDef("body", T.TEXT),
    ]
    for i in range(extra_columns):
        wide_cols.append(ColumnDef(f"x{i + 1}", T.TEXT if i % 2 == 0 else T.INT8))
    return (
        TableDef(
            "acct",
            "d",
            (
                ColumnDef("id", T.INT4),
                ColumnDef("owner", T.TEXT),
                ColumnDef("balance", T.NUMERIC, money),
                ColumnDef("doc", T.TEXT),
                ColumnDef("updated", T.TIMESTAMPTZ),
            ),
            keys=("id",),
            toast=("doc",),
        ),
        TableDef("wide", "d", tuple(wide_cols), keys=("id",), toast=("body",)),
        TableDef(
            "audit",
            "f",
            (
                ColumnDef("id", T.INT8),
                ColumnDef("kind", T.TEXT),
                ColumnDef("payload", T.TEXT),
                ColumnDef("at", T.TIMESTAMPTZ),
                ColumnDef("amount", T.NUMERIC),
            ),
            keys=(),
            toast=("payload",),
        ),
        TableDef(
            "item",
            "i",
            (
                ColumnDef("id", T.INT4),
                ColumnDef("sku", T.TEXT),
                ColumnDef("region", T.INT4),
                ColumnDef("qty", T.INT4),
                ColumnDef("price", T.NUMERIC, T.numeric_typmod(10, 2)),
            ),
            keys=("sku", "region"),
        ),
        TableDef(
            "event_log",
            "n",
            (ColumnDef("id", T.INT8), ColumnDef("msg", T.TEXT), ColumnDef("at", T.TIMESTAMPTZ)),
            keys=(),
        ),
        TableDef("evolve", "f", (ColumnDef("id", T.INT4), ColumnDef("name", T.TEXT)), keys=()),
    )


def relid_for(node_index: int, table_index: int) -> int:
    """A node-specific, realistic pg_class OID for a table."""
    return FIRST_USER_OID + 1 + RELID_NODE_STRIDE * node_index + 7 * table_index


# --- DDL on `evolve` ----------------------------------------------------------
# The evolution runs a fixed cycle, the same on every node (a cluster-wide DDL
# is one distributed transaction), numbered by a step counter k:
#
#   k % 4 == 0  ADD COLUMN t<c> text DEFAULT 'dflt-<c>'     (old rows show the default)
#   k % 4 == 1  ALTER COLUMN t<c> TYPE varchar(64)          (new Relation, same values)
#   k % 4 == 2  ADD COLUMN n<c> int4 DEFAULT <c>
#   k % 4 == 3  DROP COLUMN t<c>, and n<c-1> if present     (vanish from the next Relation)
#
# where c = k // 4.  The table stays narrow however long the run.

EVOLVE_VARCHAR_LEN: Final = 64


@dataclass(frozen=True)
class DdlStep:
    sql: str
    add: ColumnDef | None = None
    default: object = None
    retype: tuple[str, ColumnDef] | None = None
    drop: tuple[str, ...] = ()


def evolve_step(k: int, current: tuple[str, ...]) -> DdlStep:
    c = k // 4
    phase = k % 4
    if phase == 0:
        col = ColumnDef(f"t{c}", T.TEXT)
        return DdlStep(
            f"ALTER TABLE evolve ADD COLUMN t{c} text DEFAULT 'dflt-{c}'", add=col, default=f"dflt-{c}"
        )
    if phase == 1:
        col = ColumnDef(f"t{c}", T.VARCHAR, T.varchar_typmod(EVOLVE_VARCHAR_LEN))
        return DdlStep(
            f"ALTER TABLE evolve ALTER COLUMN t{c} TYPE varchar({EVOLVE_VARCHAR_LEN})", retype=(col.name, col)
        )
    if phase == 2:
        col = ColumnDef(f"n{c}", T.INT4)
        return DdlStep(f"ALTER TABLE evolve ADD COLUMN n{c} int4 DEFAULT {c}", add=col, default=c)
    drops = tuple(n for n in (f"t{c}", f"n{c - 1}") if n in current)
    return DdlStep("ALTER TABLE evolve " + ", ".join(f"DROP COLUMN {n}" for n in drops), drop=drops)
