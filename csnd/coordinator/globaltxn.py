"""A global transaction: what the coordinator's merge emits, one per commit CSN.

A distributed transaction commits on several nodes with one CSN and one gid;
each node has its own xid, commit LSN and commit time.  The merge joins the
nodes' parts into ONE `GlobalTxn` (docs/design.md section 4, invariant 2), so a consumer
never sees half of a distributed transaction.

The changes are kept as the batches the nodes delivered, `parts` = a list of
`(node, [(cid, lsn, body), ...])` in merge order, instead of one tuple per
change: the JSON writer walks them directly, so joining a transaction
allocates nothing per change.  `changes` flattens them for callers that want
the `(node, cid, lsn, body)` view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from csnd.coordinator.jsonlines import json_line
from csnd.core.ids import Csn, Lsn, Xid


class NodeCommit(NamedTuple):
    """One node's commit of a global transaction (the `nodes` entry of a JSON line)."""

    xid: Xid
    commit_lsn: Lsn
    commit_time: int  # microseconds since 2000-01-01 UTC


# (node, [(cid, lsn, body), ...]): one delivered batch, in merge order.
Part = tuple[str, list[tuple[int, int, str]]]


class GlobalTxn:
    """One transaction of the global CSN-ordered stream.

    `gid` is None in single-node mode.  `nodes` maps each participating node to
    its `NodeCommit`, in the merge's node order (the order given to `CsnMerge`),
    so the output does not depend on which node happened to arrive first.
    `end_lsns` holds each node's commit end LSN: the position a live slot is
    confirmed to once the transaction is durable (docs/design.md section 9).
    `commit_time` is the latest of the nodes' commit times.  `relations`:
    `(node, body)` of the relation versions first in force with it
    (`coordinator.txnevents.TxnStart`).
    """

    __slots__ = ("csn", "gid", "nodes", "end_lsns", "commit_time", "parts", "relations")

    def __init__(
        self,
        csn: Csn,
        gid: str | None,
        nodes: dict[str, NodeCommit],
        end_lsns: dict[str, Lsn],
        parts: list[Part],
        relations: Sequence[tuple[str, str]] = (),
    ) -> None:
        if not nodes:
            raise ValueError(f"global transaction csn {csn} has no node")
        self.csn = csn
        self.gid = gid
        self.nodes = nodes
        self.end_lsns = end_lsns
        self.commit_time = max(c.commit_time for c in nodes.values())
        self.parts = parts
        self.relations = relations

    @property
    def changes(self) -> list[tuple[str, int, int, str]]:
        """Every change as `(node, cid, lsn, body)`, in output order (built on each access)."""
        return [(node, cid, lsn, body) for node, chunk in self.parts for cid, lsn, body in chunk]

    @property
    def n_changes(self) -> int:
        return sum(len(chunk) for _, chunk in self.parts)

    def to_json_line(self) -> str:
        """The transaction as one line of docs/design.md section 7 (no trailing newline)."""
        return json_line(self)

    def __repr__(self) -> str:
        return (
            f"GlobalTxn(csn={self.csn}, gid={self.gid!r}, nodes={list(self.nodes)}, "
            f"n_changes={self.n_changes})"
        )
