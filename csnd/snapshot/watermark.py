"""Incremental snapshots (`csnd snapshot TABLE`): a chunk's rows joined to the stream at its watermark.

The technique is Netflix DBLog's, fitted to a CSN-ordered changelog, with
the chunk's read snapshot deciding exactly which stream changes it missed:

    job: track (node, table) ─► wait: no commit handed on before is still invisible
         per chunk: REPEATABLE READ: S = pg_current_snapshot(), the chunk's rows
                    ─► BEGIN; xid; arm(window, xid, rows, S); emit 'csnd.snapshot'; COMMIT
    sink: every appended transaction that touches the table: (its xid, the keys it touched)
          the watermark's transaction ─► the rows whose keys no transaction invisible to S
                                         touched, attached as "read" changes, with a marker

Why the rows kept are right at the watermark's CSN.  The watermark commits
after S was taken.  A transaction visible to S committed before that, so
before the watermark: its CSN (its commit LSN) is smaller, it comes first in
the changelog, and the chunk reflects it.  A transaction invisible to S
either commits after the watermark -- then it comes after the chunk and
overwrites it, as it should -- or comes before the watermark in the
changelog without being in the chunk: the sink saw it (it was appended
while the table was tracked), and every key it touched is left out of the
chunk, whose row for that key then comes from the stream's change.

Why "appended while tracked" covers them all.  A transaction appended
before tracking began but invisible to a later S is one whose commit record
was flushed and sent while it was not yet visible: a commit waiting for a
synchronous standby (its backend waits with `wait_event` SyncRep, holding
its xid).  After tracking begins, before its first chunk, the job waits for
every one of those to become visible.

Leaving a key out costs nothing when the stream's change carries the row;
only an update's `new` without an unchanged TOAST value then gives a
consumer less than the chunk would have.  A truncate of the table, a change
naming no key, or a transaction too large to look into (appended in pieces)
inside a chunk's window makes the chunk be read again (`Window.redo`).

Pure: lines in, lines out.  `csnd.snapshot.incremental` runs the jobs.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
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


_XID_SPACE: Final = 1 << 32


def _follows_or_equals(a: int, b: int) -> bool:
    """PostgreSQL's TransactionIdFollowsOrEquals on 32-bit xids (modulo 2^32, within 2^31)."""
    return (a - b) % _XID_SPACE < _XID_SPACE // 2


@dataclass(frozen=True)
class ReadSnapshot:
    """A chunk's read snapshot, as `pg_current_snapshot()` gives it (xids of 64 bits)."""

    xmin: int
    xmax: int
    xip: frozenset[int]
    xip32: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "xip32", frozenset(x % _XID_SPACE for x in self.xip))

    def sees(self, xid: int) -> bool:
        """Whether the committed transaction `xid` (32 bits, as pgoutput gives it) is visible to it."""
        if _follows_or_equals(xid, self.xmax % _XID_SPACE):
            return False  # (began after the snapshot was taken)
        return xid not in self.xip32

    def sees_forever(self, xid: int) -> bool:
        """Whether `xid` is visible to this and to every later snapshot (it ended before xmin)."""
        return not _follows_or_equals(xid, self.xmin % _XID_SPACE)

    @classmethod
    def parse(cls, text: str) -> ReadSnapshot:
        """`pg_current_snapshot()::text`: `xmin:xmax:xip,xip,...`."""
        xmin, xmax, xip = text.split(":")
        return cls(int(xmin), int(xmax), frozenset(int(x) for x in xip.split(",") if x))


@dataclass
class Touch:
    """An appended transaction that touched a tracked table: its xid and what it did to the table."""

    xid: int
    keys: set[Key]
    blind: str = ""  # why its keys cannot be told (a truncate, a change naming no key)


@dataclass
class Tracker:
    """One node's table while a job reads it: every transaction appended since that touched it."""

    node: str
    schema: str
    table: str
    key: tuple[str, ...]  # the primary key's columns: how the chunk and the stream name a row
    history: list[Touch] = field(default_factory=list)

    @cached_property
    def needle(self) -> str:
        """The text every change of the table holds (looked for in each appended line while tracked)."""
        return f'"schema": {_encode(self.schema)}, "table": {_encode(self.table)}'

    def touch(self, xid: int, changes: list[dict[str, Any]]) -> None:
        """Note what a transaction's `changes` did to this table, if anything."""
        keys: set[Key] = set()
        blind = ""
        mine = False
        for c in changes:
            if c.get("node") != self.node or c.get("schema") != self.schema or c.get("table") != self.table:
                continue
            mine = True
            if c.get("op") == "truncate":
                blind = "the table was truncated"
                continue
            found = False
            for side in ("old", "new"):
                row = c.get(side)
                if isinstance(row, dict):
                    k = key_of(row, self.key)
                    if k is not None:
                        keys.add(k)
                        found = True
            if not found:
                blind = blind or "a change of the table named no row by its primary key"
        if mine:
            self.history.append(Touch(xid, keys, blind))


@dataclass
class Window:
    """One chunk of a tracked table, from its read until its watermark is appended."""

    tracker: Tracker
    since: int = 0  # the changelog's newest csn when the chunk began (a relation version after it is new)
    redo: str = ""  # why every row must be left out and the chunk read again ("" : it need not)
    high_xid: int | None = None  # the watermark transaction's xid (32 bits, as pgoutput gives it)
    chunk: Chunk | None = None
    snapshot: ReadSnapshot | None = None
    # set once the watermark's record is appended: (its csn, rows kept); read by the job
    appended: tuple[int, int] | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def kept(self) -> list[str]:
        """The chunk's bodies whose keys no transaction invisible to its snapshot touched.

        Sets `redo` when a transaction it cannot see into is among them; forgets
        the touches every later snapshot will see.
        """
        assert self.chunk is not None and self.snapshot is not None
        s, t = self.snapshot, self.tracker
        unseen = [touch for touch in t.history if not s.sees(touch.xid)]
        t.history = [touch for touch in t.history if not s.sees_forever(touch.xid)]
        blind = next((touch for touch in unseen if touch.blind), None)
        if blind is not None and not self.redo:
            self.redo = f"{blind.blind} (transaction {blind.xid}) while the chunk was read"
        if self.redo:
            return []
        touched = set().union(*(touch.keys for touch in unseen))
        return [b for b, k in zip(self.chunk.bodies, self.chunk.keys, strict=True) if k not in touched]


def attach(line: str, node: str, commit_lsn: int, bodies: list[str], marker: dict[str, Any]) -> str:
    """The watermark's transaction line (no changes) with `bodies` as its changes and a `snapshot` marker."""
    if not line.endswith(_CHANGES_END):
        raise ValueError(f"a high watermark's transaction has changes of its own: {line[:200]}")
    at = f'"lsn": "{lsn_to_str(commit_lsn)}", '
    node_key = _encode(node)
    changes = ", ".join(f'{{"node": {node_key}, "cid": 0, {at}{b[len(UNPLACED_LSN) :]}}}' for b in bodies)
    return f'{line[: -len(_CHANGES_END)]}"changes": [{changes}], "snapshot": {_encode(marker)}}}'


# (csn in force from, body) of a table's relation version in force at a csn: the sink's relation store
InForce = Callable[[str, str, str, int], "tuple[int, str] | None"]


class Windows:
    """The tracked tables and open windows, shared by the jobs' threads and the sink's (`observe`).

    The sink calls `observe` for every transaction it appends; with nothing
    tracked that is one attribute test.  Otherwise a line is parsed only when
    it names a tracked table or is a watermark's transaction.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._trackers: list[Tracker] = []
        self._open: list[Window] = []
        self.active = False  # (read without the lock: tracking begins before anything it must see)
        self.in_force: InForce | None = None  # set by the sink: the relation version in force at a csn

    def track(self, node: str, schema: str, table: str, key: tuple[str, ...]) -> Tracker:
        t = Tracker(node, schema, table, key)
        with self._lock:
            self._trackers.append(t)
            self.active = True
        return t

    def untrack(self, t: Tracker) -> None:
        with self._lock:
            if t in self._trackers:
                self._trackers.remove(t)
            self.active = bool(self._trackers or self._open)

    def open(self, tracker: Tracker, since: int) -> Window:
        w = Window(tracker, since)
        with self._lock:
            self._open.append(w)
        return w

    def arm(self, w: Window, high_xid: int, chunk: Chunk, snapshot: ReadSnapshot) -> None:
        """The chunk read under `snapshot`, and the xid of the watermark about to commit: attach at it."""
        with self._lock:
            w.chunk, w.snapshot, w.high_xid = chunk, snapshot, high_xid % _XID_SPACE

    def close(self, w: Window) -> None:
        with self._lock:
            if w in self._open:
                self._open.remove(w)
            self.active = bool(self._trackers or self._open)

    def poison(self, why: str) -> None:
        """A transaction that cannot be looked into was appended: every open window reads its chunk again."""
        with self._lock:
            for w in self._open:
                w.redo = w.redo or why

    def observe(self, csn: int, line: str) -> tuple[str, list[tuple[str, str]]]:
        """A transaction about to be appended: note what it did to tracked tables; a watermark's comes
        back with its chunk.

        Also returns the (node, relation body) versions to keep from `csn` on, before the record:
        a table never streamed yet has none, and a consumer of relation lines needs its rows' one.
        """
        relations: list[tuple[str, str]] = []
        with self._lock:
            trackers, windows = list(self._trackers), [w for w in self._open if w.high_xid is not None]
        parsed: dict[str, Any] | None = None
        for t in trackers:
            if t.needle not in line:
                continue
            if parsed is None:
                parsed = json.loads(line)
            entry = parsed["nodes"].get(t.node)
            if entry is not None:
                t.touch(entry["xid"], parsed["changes"])
        if not line.endswith(_CHANGES_END):
            return line, relations
        for w in windows:
            t = w.tracker
            if f'{_encode(t.node)}: {{"xid": {w.high_xid}, ' not in line:
                continue
            if parsed is None:
                parsed = json.loads(line)
            if set(parsed["nodes"]) != {t.node} or parsed["nodes"][t.node]["xid"] != w.high_xid:
                continue
            assert w.chunk is not None
            relation = w.chunk.relation
            in_force = self.in_force(t.node, t.schema, t.table, csn) if self.in_force and relation else None
            if in_force is not None and in_force[1] != relation and in_force[0] > w.since and not w.redo:
                w.redo = "the table's columns changed while the chunk was read"
            kept = w.kept()
            marker = {**w.chunk.marker, "rows": len(kept), "left_out": len(w.chunk.bodies) - len(kept)}
            if w.redo:
                marker["redo"] = w.redo
            line = attach(line, t.node, lsn_from_str(parsed["nodes"][t.node]["commit_lsn"]), kept, marker)
            if kept and relation and (in_force is None or in_force[1] != relation):
                relations.append((t.node, relation))
            w.appended = (csn, len(kept))
            self.close(w)
            w.done.set()
        return line, relations
