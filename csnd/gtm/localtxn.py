"""The local transaction of one global transaction on one node.

`NodePart` is where a change is decided once and written twice: as a WAL
record handed to the node's emulated walsender (`gtm.walsender`, which makes
the frames) and as a change object of the expected output (docs/design.md section 7).
Its `view` holds its uncommitted writes on top of the committed rows; a
savepoint (`SubXact`) keeps an undo log of the view and the index of its first
expected change, so ROLLBACK TO SAVEPOINT restores both, and PostgreSQL's xid
rules are followed: the top-level xid at the first write, a subxact's xid at
its first write (after its parents'), the aborted subxacts' xids in the abort
record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from csnd.core.ids import lsn_to_str
from csnd.gtm.randvalues import TOAST_THRESHOLD
from csnd.gtm.shapes import SCHEMA, DdlStep, Shape
from csnd.gtm.tables import Row, TableState
from csnd.gtm.walsender import (
    CHANGE_OVERHEAD,
    DELETE,
    INSERT,
    MESSAGE,
    MESSAGE_OVERHEAD,
    RB_CHANGE_OVERHEAD,
    TRUNCATE,
    UPDATE,
    NodeStream,
    RbTxn,
)
from csnd.reader.pgoutput import UNCHANGED

if TYPE_CHECKING:
    from csnd.gtm.workload import Workload

MISSING: Final[Any] = object()


class SubXact:
    """An open savepoint of a local transaction."""

    __slots__ = ("xid", "children", "undo", "mark")

    def __init__(self, mark: int) -> None:
        self.xid: int | None = None  # assigned at its first write, like PostgreSQL
        self.children: list[int] = []  # xids of released inner subxacts
        self.undo: list[tuple[tuple[int, int], Any]] = []
        self.mark = mark  # len(changes) when it started


class NodePart:
    """The local transaction of one global transaction on one node."""

    def __init__(self, wl: Workload, txn_id: int, node: int) -> None:
        self.wl = wl
        self.txn_id = txn_id
        self.node = node
        self.name = wl.node_names[node]
        self.ns: NodeStream = wl.streams[node]
        self.tables: list[TableState] = wl.tables[node]
        self.rb: RbTxn | None = None
        self.xid: int | None = None
        self.cid = 0
        self.view: dict[tuple[int, int], Row | None] = {}
        self.own: dict[int, list[int]] = {}  # rowids this txn inserted, per table index
        self.locked: list[tuple[TableState, int]] = []
        self.used: dict[int, TableState] = {}
        self.changes: list[dict[str, Any]] = []  # expected change objects, stream order
        self.subs: list[SubXact] = []
        self.live_subxids: list[int] = []  # assigned, not rolled back: the abort record's list
        self.prepared = False
        self.committing_logged = False
        self.commit_lsn = 0
        self.commit_time = 0
        self.ddl_tables: list[str] = []

    # --- WAL records ----------------------------------------------------------

    def _record(self, size: int) -> tuple[int, int]:
        """Reserve a WAL record of this txn; returns (lsn, xid of the writing (sub)xact)."""
        ns = self.ns
        if self.xid is None:
            self.xid = ns.assign_xid()
        xid = self.xid
        for sub in self.subs:  # a subxact's xid is assigned after its parents'
            if sub.xid is None:
                sub.xid = ns.assign_xid()
                self.live_subxids.append(sub.xid)
            xid = sub.xid
        lsn = ns.reserve(size)
        if self.rb is None:
            self.rb = ns.begin(self.xid, lsn)
        return lsn, xid

    def message(self, content: str) -> int:
        """A transactional `csn` message (cid or commit marker)."""
        raw = content.encode("ascii")
        lsn, xid = self._record(MESSAGE_OVERHEAD + len(raw))
        assert self.rb is not None
        self.ns.add(self.rb, (lsn, xid, MESSAGE, None, None, raw, RB_CHANGE_OVERHEAD + len(raw)))
        return lsn

    def set_cid(self, cid: int) -> None:
        if cid != self.cid:
            assert not self.subs, "cid markers are written at statement level, outside savepoints"
            self.message(f"cid {cid}")
            self.cid = cid

    def _change(
        self, op: str, ts: TableState, old: Any, new: Any, lsn: int, unchanged: list[str] | None
    ) -> None:
        ch = {
            "node": self.name,
            "cid": self.cid,
            "lsn": lsn_to_str(lsn),
            "op": op,
            "schema": SCHEMA,
            "table": ts.defn.name,
            "key": ts.shape.key_names,
            "old": old,
            "new": new,
        }
        if unchanged:
            ch["unchanged"] = unchanged
        self.changes.append(ch)

    def _touch(self, ts: TableState) -> None:
        if ts.index not in self.used:
            self.used[ts.index] = ts
            ts.users[self.txn_id] = None

    def _set_view(self, key: tuple[int, int], row: Row | None) -> None:
        if self.subs:
            self.subs[-1].undo.append((key, self.view.get(key, MISSING)))
        self.view[key] = row

    def _lock(self, ts: TableState, rowid: int) -> None:
        if ts.locks.get(rowid) != self.txn_id:
            ts.locks[rowid] = self.txn_id
            self.locked.append((ts, rowid))

    # --- DML ------------------------------------------------------------------

    def insert(self, ts: TableState, rowid: int, row: Row) -> None:
        self._touch(ts)
        size = sum(c[2] for c in row)
        lsn, xid = self._record(CHANGE_OVERHEAD + size)
        assert self.rb is not None
        self.ns.add(
            self.rb, (lsn, xid, INSERT, ts.relid, ts.shape, [c[0] for c in row], RB_CHANGE_OVERHEAD + size)
        )
        self._change(
            "insert", ts, None, dict(zip(ts.shape.names, [c[1] for c in row], strict=True)), lsn, None
        )
        self._lock(ts, rowid)
        self._set_view((ts.index, rowid), row)
        self.own.setdefault(ts.index, []).append(rowid)

    def update(self, ts: TableState, rowid: int, old: Row, new: Row, changed: set[int]) -> None:
        self._touch(ts)
        shape = ts.shape
        names = shape.names
        # Out-of-line values the update does not touch are not logged again: 'u'.
        unchanged = [i for i, c in enumerate(new) if c[2] >= TOAST_THRESHOLD and i not in changed]
        new_wire = [c[0] for c in new]
        for i in unchanged:
            new_wire[i] = UNCHANGED
        old_wire: list[Any] | None = None
        old_json: dict[str, Any] | None = None
        kind = "K"
        if shape.replident == "f":
            old_wire, kind = [c[0] for c in old], "O"
            old_json = dict(zip(names, [c[1] for c in old], strict=True))
        elif shape.replident in ("d", "i") and any(i in changed for i in shape.key_pos):
            old_wire = [old[i][0] if i in shape.key_pos else None for i in range(len(old))]
            old_json = {names[i]: old[i][1] for i in shape.key_pos}
        size = sum(c[2] for i, c in enumerate(new) if i not in unchanged)
        if old_wire is not None:
            size += sum(c[2] for c in old) if kind == "O" else 16
        lsn, xid = self._record(CHANGE_OVERHEAD + size)
        assert self.rb is not None
        self.ns.add(
            self.rb,
            (lsn, xid, UPDATE, ts.relid, shape, (old_wire, kind, new_wire), RB_CHANGE_OVERHEAD + size),
        )
        skip = set(unchanged)
        new_json = {n: c[1] for i, (n, c) in enumerate(zip(names, new, strict=True)) if i not in skip}
        self._change("update", ts, old_json, new_json, lsn, [names[i] for i in unchanged])
        self._lock(ts, rowid)
        self._set_view((ts.index, rowid), new)

    def delete(self, ts: TableState, rowid: int, old: Row) -> None:
        self._touch(ts)
        shape = ts.shape
        if shape.replident == "f":
            wire, kind = [c[0] for c in old], "O"
            old_json = dict(zip(shape.names, [c[1] for c in old], strict=True))
            size = sum(c[2] for c in old)
        else:
            wire = [old[i][0] if i in shape.key_pos else None for i in range(len(old))]
            kind = "K"
            old_json = {shape.names[i]: old[i][1] for i in shape.key_pos}
            size = 16
        lsn, xid = self._record(CHANGE_OVERHEAD + size)
        assert self.rb is not None
        self.ns.add(self.rb, (lsn, xid, DELETE, ts.relid, shape, (wire, kind), RB_CHANGE_OVERHEAD + size))
        self._change("delete", ts, old_json, None, lsn, None)
        self._lock(ts, rowid)
        self._set_view((ts.index, rowid), None)

    def truncate(self, tss: list[TableState], options: int) -> None:
        """TRUNCATE under exclusive locks: one message for all tables, one change each."""
        for ts in tss:
            assert ts.excl == self.txn_id
            self._touch(ts)
        lsn, xid = self._record(CHANGE_OVERHEAD + 4 * len(tss))
        assert self.rb is not None
        relids = tuple(ts.relid for ts in tss)
        shapes = tuple(ts.shape for ts in tss)
        self.ns.add(self.rb, (lsn, xid, TRUNCATE, relids, shapes, options, RB_CHANGE_OVERHEAD))
        for ts in tss:
            self._change("truncate", ts, None, None, lsn, None)
            # Nobody else can see the table until we commit, and exclusive-lock
            # txns never abort, so the committed rows can go now.
            ts.clear()
            self.view = {k: v for k, v in self.view.items() if k[0] != ts.index}

    def alter(self, ts: TableState, step: DdlStep) -> None:
        """ALTER TABLE under an exclusive lock: catalog WAL, a new shape, rows migrated."""
        assert ts.excl == self.txn_id and not self.subs
        self._touch(ts)
        self._record(400 + len(step.sql))  # the catalog updates: WAL, but no logical change
        cols = list(ts.shape.columns)
        rows = ts.rows
        if step.add is not None:
            cols.append(step.add)
            dflt = self.wl.values.cell_of(step.add.type, step.default)
            for rowid, row in rows.items():
                rows[rowid] = (*row, dflt)  # ADD COLUMN ... DEFAULT: old rows show it
        if step.retype is not None:
            name, col = step.retype
            cols[ts.shape.index(name)] = col  # text -> varchar: same values, same wire forms
        if step.drop:
            keep = [i for i, c in enumerate(cols) if c.name not in step.drop]
            cols = [cols[i] for i in keep]
            for rowid, row in rows.items():
                rows[rowid] = tuple(row[i] for i in keep)
        ts.shape = Shape(ts.defn.name, ts.defn.replident, tuple(cols), ts.defn.keys, ts.shape.version + 1)
        self.wl.refresh_generators(ts)
        self.ddl_tables.append(ts.defn.name)

    # --- savepoints -----------------------------------------------------------

    def savepoint(self) -> None:
        self.subs.append(SubXact(len(self.changes)))

    def release(self) -> None:
        sub = self.subs.pop()
        if self.subs:
            parent = self.subs[-1]
            if sub.xid is not None:
                parent.children.extend(sub.children)
                parent.children.append(sub.xid)
            parent.undo.extend(sub.undo)

    def rollback_to(self) -> None:
        """ROLLBACK TO SAVEPOINT (and release it): undo the view and the expected changes."""
        sub = self.subs.pop()
        if sub.xid is not None:
            assert self.rb is not None
            aborted = [*sub.children, sub.xid]
            self.ns.subxact_abort(self.rb, aborted)
            self.live_subxids = [x for x in self.live_subxids if x not in aborted]
        for key, prev in reversed(sub.undo):
            if prev is MISSING:
                self.view.pop(key, None)
            else:
                self.view[key] = prev
        del self.changes[sub.mark :]

    # --- end ------------------------------------------------------------------

    def prepare(self) -> None:
        self.ns.prepare()
        self.prepared = True

    def commit_prepared(self, commit_time: int) -> None:
        assert self.rb is not None and not self.subs
        self.commit_lsn, _ = self.ns.commit(self.rb, commit_time)
        self.commit_time = commit_time
        tables = self.tables
        for (ti, rowid), row in self.view.items():
            if row is None:
                tables[ti].remove(rowid)
            else:
                tables[ti].put(rowid, row)
        for table in self.ddl_tables:
            self.ns.invalidate(table)
        self._release()

    def rollback(self) -> None:
        """ROLLBACK or ROLLBACK PREPARED; a txn that never got an xid writes nothing."""
        self.subs.clear()
        if self.rb is not None:
            self.ns.abort(self.rb, self.live_subxids, self.prepared)
        self.changes.clear()
        self._release()

    def _release(self) -> None:
        me = self.txn_id
        for ts, rowid in self.locked:
            if ts.locks.get(rowid) == me:
                del ts.locks[rowid]
        for ts in self.used.values():
            ts.users.pop(me, None)
            if ts.excl == me:
                ts.excl = None
        self.view = {}
        self.locked = []
