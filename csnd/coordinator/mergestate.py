"""The merge's bookkeeping per node and for the transaction being assembled (see `coordinator.merge`).

`MergeNode` is what the merge knows of one node: its waiting batches, the
watermark it promised, the transaction its last batch belongs to, its batch
id, and its one key in the merge's sorted container.  `Assembly` is the
transaction whose batches are being taken, at one CSN.
"""

from __future__ import annotations

from collections import deque

from csnd.coordinator.batch import NodeBatch
from csnd.coordinator.txnevents import TxnStart
from csnd.core.ids import Csn, Lsn, Xid

Key = tuple[int, int, int, int]  # (csn, cid, batch_id, node index)


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
