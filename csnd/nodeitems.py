"""What a node pipeline hands to the merge loop, and how a transaction is cut into merge batches.

A local `NodePipeline` (csnd.replay) queues whole finished transactions; a
node agent's client (csnd.remote) queues batches already cut by the agent
with `cut_batches`, the same cut, so positions `<csn, index>` agree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from coordinator import NodeBatch
from sender.txn import FinishedTxn

# Changes per batch handed to the merge: the merge interleaves nodes, streams
# its output and back-pressures between batches of this size, so a huge
# transaction never sits whole in memory.
MERGE_BATCH_CHANGES: Final = 1024


@dataclass
class TxnItem:
    """A transaction the sender released, and the node's confirmable LSN after it."""

    txn: FinishedTxn
    confirmable: int


@dataclass
class BatchItem:
    """One batch from a node agent; `confirmable` is set on a transaction's first batch."""

    batch: NodeBatch
    confirmable: int | None


@dataclass
class WatermarkItem:
    csn: int


@dataclass
class EndItem:
    """The node's stream ended; `error` says why if it did not end normally."""

    error: BaseException | None = None


def cut_batches(txn: FinishedTxn) -> Iterator[NodeBatch]:
    """Cut one node's transaction into merge batches: a new batch at each cid change or size bound."""
    chunk: list[tuple[int, int, str]] = []
    cid = 0
    for change in txn.changes:
        if chunk and (change[0] != cid or len(chunk) >= MERGE_BATCH_CHANGES):
            yield NodeBatch(
                txn.csn, txn.gid, txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, cid, chunk, False
            )
            chunk = []
        cid = change[0]
        chunk.append(change)
    yield NodeBatch(txn.csn, txn.gid, txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, cid, chunk, True)
