"""Incremental snapshots (`csnd snapshot TABLE`): a chunk's rows joined to the stream at its watermark.

The technique is Netflix DBLog's, fitted to a CSN-ordered changelog:

    job: open window (node, table) ─► SELECT a chunk by key ─► BEGIN; xid; emit 'csnd.snapshot'; COMMIT
                │                                                               (the high watermark)
    sink:       └─ every transaction appended from here on: the chunk table's keys it touches
                   the watermark's transaction ─► the chunk's rows minus those keys, attached to it
                                                  as "read" changes, with a `snapshot` marker

Why the rows that survive are right at the watermark's CSN.  The chunk is
read under a snapshot S taken after the window opened, and the watermark
commits after S:

* every transaction visible in S committed before the watermark took its
  commit position, so its CSN is smaller: its effect is in the chunk and
  comes before the chunk in the changelog;
* a transaction not visible in S committed after S was taken, so after the
  window opened: the sink saw it, and every key it touched is left out of
  the chunk -- that row's state comes from the stream's own change instead.

Leaving out more than needed is safe (a key touched by a transaction that
S did see, or one ordered after the watermark): its change carries the
row.  Only a change whose `new` lacks an unchanged TOAST value then gives a
consumer less than the chunk would have; the chunk rows kept are exact.

A truncate of the table, or a transaction too large to look into (appended
in pieces), leaves the window unable to say which keys were touched: every
row is left out and the chunk is read again (`Window.redo`).

Pure: lines in, lines out.  `csnd.snapshot.incremental` runs the jobs.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Final

from csnd.core.ids import lsn_from_str, lsn_to_str
from csnd.core.markers import WATERMARK_PREFIX

# The logical message prefix of a high watermark (transactional: it arrives at its commit).
PREFIX: Final = WATERMARK_PREFIX

_encode: Final = json.JSONEncoder(ensure_ascii=False).encode
# How a read body the job rendered begins: rendered at LSN 0, given the watermark's commit LSN when attached.
UNPLACED_LSN: Final = '"lsn": "0/0", '
_CHANGES_END: Final = '"changes": []}'

Key = tuple[str, ...]  # a row's key columns' values, each as canonical JSON text


def key_of(row: dict[str, Any], columns: tuple[str, ...]) -> Key | None:
    """The canonical key of `row` (a change's `old` or `new`); None when a key column is missing."""
    try:
        return tuple(_encode(row[c]) for c in columns)
    except KeyError:
        return None


def body_key(body: str, columns: tuple[str, ...]) -> Key:
    """The key of a read body as the job rendered it (`"lsn": ..., "op": "read", ..., "new": {...}`)."""
    row = json.loads("{" + body + "}")["new"]
    key = key_of(row, columns)
    if key is None:
        raise ValueError(f"a read row lacks a key column of {columns}: {body[:200]}")
    return key


@dataclass
class Chunk:
    """A chunk the job read: its rendered read bodies (each with its key) and its marker."""

    bodies: list[str]
    keys: list[Key]
    marker: dict[str, Any]
    relation: str = ""  # the relation version the rows were rendered with (kept from the chunk's csn on)


@dataclass
class Window:
    """One chunk's window on one node's table, from before its read until its watermark is appended."""

    node: str
    schema: str
    table: str
    key: tuple[str, ...]  # the primary key's columns: how the chunk and the stream name a row
    touched: set[Key] = field(default_factory=set)
    redo: str = ""  # why every row must be left out and the chunk read again ("" : it need not)
    high_xid: int | None = None  # the watermark transaction's xid (32 bits, as pgoutput gives it)
    chunk: Chunk | None = None
    # set once the watermark's record is appended: (its csn, rows kept); read by the job
    appended: tuple[int, int] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def _needle(self) -> str:
        return f'"schema": {_encode(self.schema)}, "table": {_encode(self.table)}'

    def observe(self, changes: list[dict[str, Any]]) -> None:
        """Take note of the keys a transaction's `changes` touch (of this window's node and table)."""
        for c in changes:
            if c.get("node") != self.node or c.get("schema") != self.schema or c.get("table") != self.table:
                continue
            if c.get("op") == "truncate":
                self.redo = "the table was truncated while the chunk was read"
                continue
            for side in ("old", "new"):
                row = c.get(side)
                if isinstance(row, dict):
                    k = key_of(row, self.key)
                    if k is None:
                        self.redo = f"a change's {side} row lacks a key column (replica identity?)"
                    else:
                        self.touched.add(k)

    def kept(self) -> list[str]:
        """The chunk's bodies whose keys no transaction in the window touched."""
        assert self.chunk is not None
        if self.redo:
            return []
        touched = self.touched
        return [b for b, k in zip(self.chunk.bodies, self.chunk.keys, strict=True) if k not in touched]


def attach(line: str, node: str, commit_lsn: int, bodies: list[str], marker: dict[str, Any]) -> str:
    """The watermark's transaction line (no changes) with `bodies` as its changes and a `snapshot` marker."""
    if not line.endswith(_CHANGES_END):
        raise ValueError(f"a high watermark's transaction has changes of its own: {line[:200]}")
    at = f'"lsn": "{lsn_to_str(commit_lsn)}", '
    node_key = _encode(node)
    changes = ", ".join(f'{{"node": {node_key}, "cid": 0, {at}{b[len(UNPLACED_LSN) :]}}}' for b in bodies)
    return f'{line[: -len(_CHANGES_END)]}"changes": [{changes}], "snapshot": {_encode(marker)}}}'


class Windows:
    """The open windows, shared by the jobs' threads (open, arm, close) and the sink's (`observe`).

    The sink calls `observe` for every transaction it appends; with no window
    open that is one attribute test.  With windows open, a line is parsed
    only when it names a window's table or is a watermark's transaction.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[Window] = []
        self.active = False  # (read without the lock: a stale False only delays a window opened just now)

    def open(self, node: str, schema: str, table: str, key: tuple[str, ...]) -> Window:
        w = Window(node, schema, table, key)
        with self._lock:
            self._open.append(w)
            self.active = True
        return w

    def arm(self, w: Window, high_xid: int, chunk: Chunk) -> None:
        """The chunk read, and the xid of the watermark about to commit: attach at its transaction."""
        with self._lock:
            w.chunk, w.high_xid = chunk, high_xid & 0xFFFFFFFF

    def close(self, w: Window) -> None:
        with self._lock:
            if w in self._open:
                self._open.remove(w)
            self.active = bool(self._open)

    def poison(self, why: str) -> None:
        """A transaction that cannot be looked into was appended: every open window reads its chunk again."""
        with self._lock:
            for w in self._open:
                w.redo = w.redo or why

    def observe(self, csn: int, line: str) -> tuple[str, list[tuple[str, str]]]:
        """A transaction about to be appended: note its keys; a watermark's comes back with its chunk.

        Also returns the (node, relation body) versions to keep from `csn` on, before the record:
        a table never streamed yet has none, and a consumer of relation lines needs its rows' one.
        """
        relations: list[tuple[str, str]] = []
        with self._lock:
            windows = list(self._open)
        if not windows:
            return line, relations
        parsed: dict[str, Any] | None = None
        for w in windows:
            high = (
                w.high_xid is not None
                and line.endswith(_CHANGES_END)
                and f'{_encode(w.node)}: {{"xid": {w.high_xid}, ' in line
            )
            if not high and w._needle not in line:
                continue
            if parsed is None:
                parsed = json.loads(line)
            if not high:
                w.observe(parsed["changes"])
                continue
            if set(parsed["nodes"]) != {w.node} or parsed["nodes"][w.node]["xid"] != w.high_xid:
                continue
            kept = w.kept()
            assert w.chunk is not None
            marker = {**w.chunk.marker, "rows": len(kept), "left_out": len(w.chunk.bodies) - len(kept)}
            if w.redo:
                marker["redo"] = w.redo
            line = attach(line, w.node, lsn_from_str(parsed["nodes"][w.node]["commit_lsn"]), kept, marker)
            if w.chunk.relation and kept:
                relations.append((w.node, w.chunk.relation))
            w.appended = (csn, len(kept))
            self.close(w)
            w.done.set()
        return line, relations
