"""What crosses from a node pipeline into the merge, and the merge's statistics.

`NodeBatch` is the node -> coordinator contract: a sender's finished
transaction (`sender.txn.FinishedTxn`) cut into batches of one command id, so
the merge can interleave the nodes of a distributed transaction by cid, and
back-pressure can stop a node between batches rather than only between
whole transactions.  The statistics follow the house rule that every queue exposes its
depth and peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Final, NamedTuple

from csnd.core.ids import Csn
from csnd.sender.txn import TxnHeader

# Fields of a `(cid, lsn, body)` change, as C-level key functions for the
# per-change passes of the cut, the merge and the JSON writer.
change_cid: Final = itemgetter(0)
change_body: Final = itemgetter(2)


@dataclass(slots=True)
class NodeBatch(TxnHeader):
    """Consecutive changes of one node's transaction, all of one cid.

    A node sends a transaction as one or more batches, cids non-decreasing,
    the last one with `last_of_txn`; an empty transaction is one empty batch.
    Every batch carries its transaction's header (the fields of `TxnHeader`
    first: `NodeBatch(csn, gid, xid, commit_lsn, end_lsn, commit_time, cid,
    changes, last_of_txn)`).  `changes` holds `(cid, lsn, body)`; the merge
    keeps the list (no copy) until the transaction is emitted.  The first
    batch of a transaction carries its `relations` (`FinishedTxn.relations`:
    the relation versions first in force with it), the others none.
    """

    cid: int
    changes: list[tuple[int, int, str]]
    last_of_txn: bool
    relations: tuple[str, ...] = ()


class NodeStatistics(NamedTuple):
    pending_batches: int
    pending_bytes: int
    peak_batches: int
    peak_bytes: int
    watermark: Csn | None
    ended: bool


@dataclass(frozen=True, slots=True)
class MergeStatistics:
    nodes: dict[str, NodeStatistics]
    emitted: int  # transactions popped so far
    last_csn: Csn | None  # CSN of the last one
    assembling_csn: Csn | None  # CSN of the transaction whose batches are being taken, if any
