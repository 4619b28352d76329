"""The changelog records of an initial snapshot: one per chunk, then one completion record.

A chunk is a transaction line of docs/design.md section 7 whose changes are reads
(`"op": "read"`, `old` null, `new` the row), followed by an additive
`snapshot` key that says what it is::

    {"csn": 3, "gid": null, "commit_time": "...", "nodes": {"dn1": {"xid": 0, "commit_lsn": "0/1505F10"}},
     "changes": [{"node": "dn1", "cid": 0, "lsn": "0/1505F10", "op": "read", "schema": "public",
                  "table": "item", "key": ["id"], "old": null, "new": {"id": 1, "v": "x"}}, ...],
     "snapshot": {"node": "dn1", "schema": "public", "table": "item", "chunk": 2, "chunks": 5, "rows": 10000}}

`xid` is 0 (no transaction wrote these rows: they are the table as of the
slot's consistent point), `commit_lsn` and every change's `lsn` are that
consistent point, `commit_time` the moment the slot was made.  The snapshot
ends with a record without changes whose marker says it is complete::

    {"csn": 9, ..., "changes": [], "snapshot": {"done": true, "nodes": ["dn1"], "tables": 2, "rows": 20000,
                                                "first_csn": 1}}

Nothing but a snapshot writes records before that one, so the newest record
of a changelog tells whether a snapshot was cut short (`snapshot_state`).

Pure: text in, text out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

from csnd.coordinator.globaltxn import NodeCommit
from csnd.coordinator.jsonlines import json_changes, json_head
from csnd.core.ids import Lsn, Xid

_encode: Final = json.JSONEncoder(ensure_ascii=False).encode
_INSERT_OP: Final = '"op": "insert"'
_READ_OP: Final = '"op": "read"'
# xid of a snapshot record's node entry: 0 is InvalidTransactionId, never a real one
SNAPSHOT_XID: Final = Xid(0)


def read_body(insert_body: str) -> str:
    """A change body the decoder rendered for an Insert, made a read (its op is the first after the LSN)."""
    return insert_body.replace(_INSERT_OP, _READ_OP, 1)


def _head(csn: int, node_lsns: dict[str, int], commit_time: int) -> str:
    nodes = {n: NodeCommit(SNAPSHOT_XID, Lsn(lsn), commit_time) for n, lsn in sorted(node_lsns.items())}
    return json_head(csn, None, commit_time, nodes)


def chunk_line(
    csn: int, node: str, consistent_lsn: int, commit_time: int, bodies: list[str], marker: dict[str, Any]
) -> str:
    """One chunk's record: `bodies` (read change bodies, LSN included) and its `snapshot` marker."""
    changes = json_changes(node, [(0, consistent_lsn, b) for b in bodies], True)
    return f'{_head(csn, {node: consistent_lsn}, commit_time)}{changes}], "snapshot": {_encode(marker)}}}'


def changes_line(
    csn: int, node: str, consistent_lsn: int, commit_time: int, changes: bytes, marker: dict[str, Any]
) -> bytes:
    """`chunk_line` in UTF-8, given its change objects' text in UTF-8 (`csnd.snapshot.render.chunk_changes`)."""
    return b"".join(changes_parts(csn, node, consistent_lsn, commit_time, changes, marker))


def changes_parts(
    csn: int, node: str, consistent_lsn: int, commit_time: int, changes: bytes, marker: dict[str, Any]
) -> tuple[bytes, bytes, bytes]:
    """`changes_line` in three parts: its head, `changes` itself, and its tail.

    (A chunk's text is megabytes: the changelog writes the parts as they are,
    `Changelog.append_parts`, where a join would copy it.)
    """
    head = _head(csn, {node: consistent_lsn}, commit_time).encode("utf-8")
    return head, changes, f'], "snapshot": {_encode(marker)}}}'.encode()


def done_line(csn: int, node_lsns: dict[str, int], commit_time: int, marker: dict[str, Any]) -> str:
    """The completion record: no changes, every snapshot node listed, `"done": true` in its marker."""
    return f'{_head(csn, node_lsns, commit_time)}], "snapshot": {_encode({"done": True, **marker})}}}'


@dataclass(frozen=True)
class SnapshotState:
    """What a changelog's newest record says about an initial snapshot.

    `state`: "none" (empty, or the newest record is a streamed one),
    "complete" (the newest is the completion record: nothing streamed yet),
    "incomplete" (the newest is a chunk: the snapshot was cut short).
    """

    state: str
    csn: int = 0
    marker: dict[str, Any] | None = None


def snapshot_state(newest: tuple[int, bytes] | None) -> SnapshotState:
    """The `SnapshotState` of a changelog whose newest record is `newest` (csn, line), or None if empty."""
    if newest is None:
        return SnapshotState("none")
    csn, line = newest
    if b'"snapshot": ' not in line:
        return SnapshotState("none", csn)
    try:
        obj = json.loads(line)
    except ValueError:
        return SnapshotState("none", csn)
    marker = obj.get("snapshot") if isinstance(obj, dict) else None
    if not isinstance(marker, dict) or "incremental" in marker:
        return SnapshotState("none", csn)  # (an incremental snapshot's chunk is a streamed record)
    return SnapshotState("complete" if marker.get("done") is True else "incomplete", csn, marker)
