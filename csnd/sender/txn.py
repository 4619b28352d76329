"""A node's committed transaction: its header, and the finished transaction (sender -> coordinator contract).

`TxnHeader` is the one declaration of what identifies one node's commit
(csn, gid, xid, commit LSN, end LSN, commit time).  The sender's
`FinishedTxn` and the coordinator's `NodeBatch` (`coordinator.batch`) both
extend it; slotted dataclasses, so reading a field of either costs what a
field of its own would.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from csnd.core.ids import Csn, Lsn, Xid


@dataclass(slots=True)
class TxnHeader:
    """One node's commit of a transaction.

    `csn`: the commit CSN (gtm mode) or the commit LSN (single-node mode);
    `gid` the global transaction (None in single-node mode); `end_lsn` where
    the node's slot may be confirmed once the transaction is durable (docs/design.md
    section 9); `commit_time` microseconds since 2000-01-01 UTC, as on the wire.
    """

    csn: Csn
    gid: str | None
    xid: Xid
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


@dataclass(slots=True, init=False)
class FinishedTxn(TxnHeader):
    """A committed transaction of one node, released by the sender in CSN order.

    `changes` yields `(cid, lsn, body)` in stream order, `body` being the
    `DecodedChange.body` JSON fragment; for a spilled large transaction it reads
    back from disk lazily, so iterate it once.

    `confirmable`: the node's confirmable LSN as it stood right after this
    transaction was released -- where the slot may go once this transaction
    and every one released before it are durable.  Set by the sender per
    transaction: when one event releases several, each gets its own value,
    never past the commit of a transaction released after it.

    `relations`: the bodies of the relation versions (`decoder.schema`) first
    in force with this transaction, set by the sender as it releases it;
    `seq` counts the node's finished transactions, in stream order.

    `written`: the lines of a run of transactions written whole by the
    decoder workers (`decoder.change.WholeTxns`), this one the last of them:
    its header is the last one's, `n_changes` all of theirs, `changes` is
    empty, and `confirmable` holds once all of them are durable.  Only a
    lone node's transactions come so, since only they are written as they
    come (`csnd.runtime.merger.write_alone`).
    """

    node: str
    changes: Iterable[tuple[int, int, str]]
    n_changes: int
    confirmable: Lsn
    relations: tuple[str, ...]
    seq: int
    written: WrittenLines | None

    def __init__(
        self,
        node: str,
        csn: Csn,
        gid: str | None,
        xid: Xid,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: int,
        changes: Iterable[tuple[int, int, str]],
        n_changes: int,
    ) -> None:
        self.node = node
        self.csn = csn
        self.gid = gid
        self.xid = xid
        self.commit_lsn = commit_lsn
        self.end_lsn = end_lsn
        self.commit_time = commit_time
        self.changes = changes
        self.n_changes = n_changes
        self.confirmable = Lsn(0)
        self.relations = ()
        self.seq = 0
        self.written = None


@dataclass(slots=True)
class WrittenLines:
    """Consecutive transactions of one node, in CSN order, with their JSON lines (see `FinishedTxn.written`)."""

    csns: list[Csn]
    xids: list[Xid]
    commit_lsns: list[Lsn]
    lines: list[str]
