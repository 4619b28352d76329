"""One table on one node: committed rows, row locks, the table lock, its shape.

The committed rows are what every transaction sees beneath its own writes.
A transaction may update or delete only rows no other in-flight transaction
has locked (PostgreSQL would make it wait; the generator simply picks another
row), and TRUNCATE / ALTER TABLE take the table exclusively: they queue
(`pending`), wait until no other in-flight transaction uses the table, and
hold it (`excl`) until they commit on that node.
"""

from __future__ import annotations

from collections.abc import Callable

from csnd.gtm.pgtypes import Cell
from csnd.gtm.shapes import Shape, TableDef

Row = tuple[Cell, ...]


class TableState:
    """One table on one node: committed rows, row locks, table lock, current shape."""

    __slots__ = (
        "defn",
        "index",
        "relid",
        "shape",
        "rows",
        "keys",
        "where",
        "locks",
        "users",
        "excl",
        "pending",
        "gens",
    )

    def __init__(self, defn: TableDef, index: int, relid: int) -> None:
        self.defn = defn
        self.index = index
        self.relid = relid
        self.shape = Shape(defn.name, defn.replident, defn.columns, defn.keys, 0)
        self.rows: dict[int, Row] = {}
        self.keys: list[int] = []  # rowids, for O(1) random choice
        self.where: dict[int, int] = {}
        self.locks: dict[int, int] = {}  # rowid -> id of the txn holding the row lock
        self.users: dict[int, None] = {}  # in-flight txns that touched the table
        self.excl: int | None = None  # txn holding the exclusive lock
        self.pending: int | None = None  # txn waiting for the exclusive lock
        self.gens: list[Callable[[], Cell] | None] = []

    def put(self, rowid: int, row: Row) -> None:
        if rowid not in self.rows:
            self.where[rowid] = len(self.keys)
            self.keys.append(rowid)
        self.rows[rowid] = row

    def remove(self, rowid: int) -> None:
        if rowid in self.rows:
            del self.rows[rowid]
            i = self.where.pop(rowid)
            last = self.keys.pop()
            if last != rowid:
                self.keys[i] = last
                self.where[last] = i

    def clear(self) -> None:
        self.rows.clear()
        self.keys.clear()
        self.where.clear()

    def usable_by(self, txn_id: int) -> bool:
        if self.excl is not None:
            return self.excl == txn_id
        return self.pending is None or self.pending == txn_id or txn_id in self.users
