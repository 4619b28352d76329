"""The logical model of the synthetic cluster: rows, locks and local transactions.

This is the generator's source of truth; the pieces are `gtm.tables`
(committed rows and locks per node and table) and `gtm.localtxn` (one
transaction's writes on one node).  Every change is decided here on
Python values, then written twice: as a WAL record handed to the node's
emulated walsender (`gtm.walsender`, which produces the frames) and as a
change object of the expected output (docs/design.md section 7).  The expected output
is therefore derived from the model, never by decoding the frames, so it can
serve as the oracle of end-to-end tests.

Concurrency is modelled the way PostgreSQL would allow it, so that the streams
are ones a real server could have produced:

- row locks: a txn updates or deletes only rows no other in-flight txn has
  locked, and sees its own uncommitted writes (`NodePart.view`) on top of the
  committed rows (`TableState.rows`);
- table locks: TRUNCATE and ALTER TABLE take an exclusive lock: they wait
  until no other in-flight txn uses the table, and meanwhile no txn starts
  using it (`TableState.pending`, `TableState.excl`);
- subtransactions: a savepoint keeps an undo log of the view and the index of
  its first expected change, so ROLLBACK TO SAVEPOINT restores both.
"""

from __future__ import annotations

from random import Random
from typing import Any

from csnd.gtm import pgtypes as T
from csnd.gtm.localtxn import MISSING, NodePart
from csnd.gtm.pgtypes import Cell
from csnd.gtm.randvalues import Values
from csnd.gtm.shapes import TableDef, relid_for
from csnd.gtm.tables import Row, TableState
from csnd.gtm.walsender import NodeStream


class Workload:
    """Every node's tables and the row-level operations transactions are made of."""

    def __init__(
        self,
        rng: Random,
        values: Values,
        node_names: list[str],
        streams: list[NodeStream],
        defs: tuple[TableDef, ...],
        max_rows: int,
    ) -> None:
        self.rng = rng
        self.values = values
        self.node_names = node_names
        self.streams = streams
        self.max_rows = max_rows
        self.next_uid = 1
        self.tables: list[list[TableState]] = []
        for n in range(len(node_names)):
            row = [TableState(d, i, relid_for(n, i)) for i, d in enumerate(defs)]
            for ts in row:
                self.refresh_generators(ts)
            self.tables.append(row)
        self.by_name = {d.name: i for i, d in enumerate(defs)}

    def refresh_generators(self, ts: TableState) -> None:
        toast = ts.defn.toast
        ts.gens = [
            None if c.name in ("id", "sku", "region") else self.values.generator(c, c.name in toast)
            for c in ts.shape.columns
        ]

    def uid(self) -> int:
        self.next_uid += 1
        return self.next_uid

    def _uid_cell(self, ts: TableState, i: int, uid: int) -> Cell:
        col = ts.shape.columns[i]
        if col.name == "sku":
            v: Any = f"SKU-{uid:07d}"
        elif col.name == "region":
            v = 1 + uid % 17
        elif col.type is T.INT8 and ts.defn.name == "wide":
            v = (1 << 53) + uid  # keys beyond 2^53 must stay exact in JSON
        else:
            v = uid
        return self.values.cell_of(col.type, v)

    def new_row(self, ts: TableState) -> tuple[int, Row]:
        uid = self.uid()
        row = tuple(g() if g is not None else self._uid_cell(ts, i, uid) for i, g in enumerate(ts.gens))
        return uid, row

    def seed_rows(self, count: int) -> None:
        """Rows that exist before the recording starts: updates and deletes need targets."""
        for node_tables in self.tables:
            for ts in node_tables:
                for _ in range(count):
                    rowid, row = self.new_row(ts)
                    ts.put(rowid, row)

    def changed_row(self, ts: TableState, row: Row, change_key: bool) -> tuple[Row, set[int]]:
        """A new version of `row`: some non-key columns redrawn, or the key itself."""
        rng = self.rng
        gens = ts.gens
        out = list(row)
        changed: set[int] = set()
        if change_key:
            uid = self.uid()
            for i in ts.shape.key_pos:
                if ts.defn.name != "item" or ts.shape.names[i] == "sku" or rng.random() < 0.5:
                    out[i] = self._uid_cell(ts, i, uid)
                    changed.add(i)
        mutable = [i for i, g in enumerate(gens) if g is not None]
        for i in rng.sample(mutable, min(len(mutable), rng.randint(0 if change_key else 1, 3))):
            g = gens[i]
            assert g is not None
            out[i] = g()
            changed.add(i)
        return tuple(out), changed

    def pick_row(self, part: NodePart, ts: TableState, own_first: float) -> tuple[int, Row] | None:
        """A row this txn may update or delete: its own, or a committed one nobody else locked."""
        rng = self.rng
        view = part.view
        own = part.own.get(ts.index)
        if own and rng.random() < own_first:
            rowid = rng.choice(own)
            row = view.get((ts.index, rowid), MISSING)
            if row is MISSING:
                row = ts.rows.get(rowid)
            if row is not None:
                return rowid, row
        keys = ts.keys
        for _ in range(4):
            if not keys:
                return None
            rowid = keys[rng.randrange(len(keys))]
            holder = ts.locks.get(rowid)
            if holder is not None and holder != part.txn_id:
                continue
            row = view.get((ts.index, rowid), MISSING)
            if row is MISSING:
                row = ts.rows[rowid]
            if row is not None:
                return rowid, row
        return None

    def random_op(
        self, part: NodePart, ts: TableState, insert_bias: float = 0.45, own_first: float = 0.3
    ) -> None:
        """One row change on `ts`: insert, update or delete as the identity allows."""
        rng = self.rng
        if ts.shape.replident == "n":  # REPLICA IDENTITY NOTHING: the server refuses UPDATE/DELETE
            rowid, row = self.new_row(ts)
            part.insert(ts, rowid, row)
            return
        if len(ts.rows) > self.max_rows:
            insert_bias /= 3
        k = rng.random()
        picked = None if k < insert_bias else self.pick_row(part, ts, own_first)
        if picked is None:
            rowid, row = self.new_row(ts)
            part.insert(ts, rowid, row)
        elif k < insert_bias + (1 - insert_bias) * 0.65:
            rowid, old = picked
            change_key = bool(ts.shape.key_pos) and rng.random() < 0.15
            new, changed = self.changed_row(ts, old, change_key)
            part.update(ts, rowid, old, new, changed)
        else:
            rowid, old = picked
            part.delete(ts, rowid, old)
