"""What a node input hands to the merger, and how a transaction is cut into merge batches.

A local `NodePipeline` (csnd.runtime.inputs) queues whole finished
transactions; a node agent's client (csnd.runtime.remote) queues batches
already cut by the agent with `cut_batches`, the same cut, so positions
`<csn, index>` agree.  Both queue through an `Outbox`.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import groupby, islice
from typing import Final

from csnd.coordinator import NodeBatch
from csnd.coordinator.batch import change_cid
from csnd.core.errors import InternalError
from csnd.core.ids import Csn, Lsn
from csnd.sender.txn import FinishedTxn

# Changes per batch handed to the merge: the merge interleaves nodes, streams
# its output and back-pressures between batches of this size, so a huge
# transaction never sits whole in memory.
MERGE_BATCH_CHANGES: Final = 1024


@dataclass
class TxnItem:
    """A transaction the sender released, and the node's confirmable LSN after it."""

    txn: FinishedTxn
    confirmable: Lsn


@dataclass
class BatchItem:
    """One batch from a node agent; `confirmable` is set on a transaction's first batch."""

    batch: NodeBatch
    confirmable: Lsn | None


@dataclass
class WatermarkItem:
    """The node's watermark moved; `confirmable` is its confirmable LSN then (None: unknown).

    An idle node releases nothing, yet its keepalives move the confirmable
    LSN (docs/design.md section 9): carried here, it lets a quiet slot advance.
    """

    csn: Csn
    confirmable: Lsn | None = None


@dataclass
class EndItem:
    """The node's stream ended; `error` says why if it did not end normally."""

    error: BaseException | None = None


NodeItem = TxnItem | BatchItem | WatermarkItem | EndItem


class Outbox:
    """A node pipeline's bounded output: items go in by the list, come out one at a time.

    The pipeline thread hands over what one decoder batch released (several
    transactions and the watermark after them) in one `put_many`, so the
    lock, the wake-up and the GIL hand-off to the merge thread are paid per
    batch, not per transaction.  `capacity` bounds the lists waiting; the
    consumer (one merger round at a time, in whichever thread runs it) takes
    items one by one, so the merge can still stop taking between any two
    transactions.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.peak = 0  # the most lists ever waiting (every queue exposes its depth and peak as metrics)
        self._lists: queue.Queue[list[NodeItem]] = queue.Queue(capacity)
        self._taken: deque[NodeItem] = deque()  # the consumer's current list

    @property
    def depth(self) -> int:
        """Lists waiting now."""
        return self._lists.qsize()

    def put_many(self, items: list[NodeItem], timeout: float | None = None) -> None:
        """Raises `queue.Full` after `timeout` seconds without room."""
        self._lists.put(items, timeout=timeout)
        depth = self._lists.qsize()
        if depth > self.peak:
            self.peak = depth

    def get_nowait(self) -> NodeItem:
        """Raises `queue.Empty` if nothing is waiting."""
        while not self._taken:
            self._taken.extend(self._lists.get_nowait())
        return self._taken.popleft()

    def get(self) -> NodeItem:
        while not self._taken:
            self._taken.extend(self._lists.get())
        return self._taken.popleft()


def whole_list(txn: FinishedTxn) -> list[tuple[int, int, str]] | None:
    """The transaction's changes if `cut_batches` would make them one batch: in memory, of one cid, not too many.

    Cids never decrease inside a transaction (the sender checks its cid
    markers), so equal cids at both ends are enough.
    """
    changes = txn.changes
    if type(changes) is list and 0 < len(changes) <= MERGE_BATCH_CHANGES and changes[0][0] == changes[-1][0]:
        return changes
    return None


def whole_batch(txn: FinishedTxn) -> NodeBatch | None:
    """The transaction as its one merge batch, if `cut_batches` would cut it into exactly that; else None.

    The common case (`whole_list`): the list itself is the one batch -- no
    pass over it, and (for the merge loop, once per transaction) no
    generator.
    """
    changes = whole_list(txn)
    if changes is not None:
        return NodeBatch(
            txn.csn,
            txn.gid,
            txn.xid,
            txn.commit_lsn,
            txn.end_lsn,
            txn.commit_time,
            changes[0][0],
            changes,
            True,
            txn.relations,
        )
    return None


def cut_batches(txn: FinishedTxn) -> Iterator[NodeBatch]:
    """Cut one node's transaction into merge batches: a new batch at each cid change or size bound.

    The last batch is flagged `last_of_txn` (an empty one if the transaction
    has no changes).  Grouping and slicing are C-level: this runs once per
    change of the node.
    """
    whole = whole_batch(txn)
    if whole is not None:
        yield whole
        return
    if txn.written is not None:  # (its changes are in the lines alone: cut, it would lose them)
        raise InternalError(
            "a transaction written whole by a decoder reached the merge; only a lone node's are",
            node=txn.node,
            lsn=txn.commit_lsn,
            xid=txn.xid,
        )
    head = (txn.csn, txn.gid, txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time)
    changes = txn.changes
    chunk: list[tuple[int, int, str]] = []
    cid = 0
    relations = txn.relations  # (on the first batch only)
    for group_cid, group in groupby(changes, key=change_cid):
        while True:
            nxt = list(islice(group, MERGE_BATCH_CHANGES))  # noqa: B031 - consumed in slices on purpose
            if not nxt:
                break
            if chunk:
                yield NodeBatch(*head, cid, chunk, False, relations)
                relations = ()
            chunk, cid = nxt, group_cid
    yield NodeBatch(*head, cid, chunk, True, relations)
