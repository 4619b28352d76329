"""The merge's bookkeeping per node and for the transaction being assembled (see `coordinator.merge`).

`MergeNode` is what the merge knows of one node: its waiting batches, the
watermark it promised, the transaction its last batch belongs to, its batch
id, and its one key in the merge's sorted container.  `Assembly` is the
transaction whose batches are being taken, at one CSN.  `head_key` and
`bound_key` are a node's key in the two states it can be in.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from csnd.coordinator.batch import NodeBatch
from csnd.coordinator.txnevents import TxnStart
from csnd.core.ids import Csn, Lsn, Xid

Key = tuple[int, int, int, int]  # (csn, cid, batch_id, node index)

# Sort positions of bounds: above any cid (uint32) or batch id, and below any.
_TOP: Final = 1 << 64
_BELOW: Final = -1


class MergeNode:
    """Per-node state: its waiting batches, what it promised, where its batch_id stands."""

    __slots__ = (
        "name",
        "index",
        "queue",
        "pending_bytes",
        "peak_batches",
        "peak_bytes",
        "watermark",
        "ended",
        "last_csn",
        "last_gid",
        "last_xid",
        "last_cid",
        "open",
        "key",
        "bid_csn",
        "bid_cid",
        "bid",
    )

    def __init__(self, name: str, index: int) -> None:
        self.name = name
        self.index = index
        self.queue: deque[tuple[NodeBatch, int]] = deque()  # (batch, approximate bytes)
        self.pending_bytes = 0
        self.peak_batches = 0
        self.peak_bytes = 0
        self.watermark = Csn(-1)  # largest watermark received; -1: none
        self.ended = False
        # The last batch received: its transaction, and whether that one still owes batches.
        self.last_csn = Csn(-1)
        self.last_gid: str | None = None
        self.last_xid = Xid(0)
        self.last_cid = 0
        self.open = False
        self.key: Key | None = None  # this node's entry in CsnMerge._keys
        # batch_id of this node at (bid_csn, bid_cid).
        self.bid_csn = -1
        self.bid_cid = -1
        self.bid = 0


class Assembly:
    """The transaction whose batches are being taken, at one CSN."""

    __slots__ = ("csn", "gid", "commits", "start", "unfinished")

    def __init__(
        self, csn: Csn, gid: str | None, commits: dict[int, tuple[Xid, Lsn, int, Lsn]], start: TxnStart
    ) -> None:
        self.csn = csn
        self.gid = gid
        self.commits = commits  # node index -> xid, commit lsn, commit time, end lsn
        self.start = start
        self.unfinished: set[int] = set()  # nodes whose last batch is not taken yet


def bound_key(n: MergeNode) -> Key | None:
    """The smallest key anything node `n` may still send can have (its queue is empty; None: it ended)."""
    if n.open:
        return (n.last_csn, n.last_cid, _TOP, n.index)
    if n.ended:
        return None
    return (max(n.watermark, n.last_csn) + 1, _BELOW, _BELOW, n.index)


def head_key(n: MergeNode) -> Key:
    """The key of node `n`'s first waiting batch; a new (csn, cid) restarts the batch_id."""
    b = n.queue[0][0]
    if b.csn != n.bid_csn or b.cid != n.bid_cid:
        n.bid_csn = b.csn
        n.bid_cid = b.cid
        n.bid = 0
    return (b.csn, b.cid, n.bid, n.index)
