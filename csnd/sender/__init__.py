"""sender: one node's decoded stream -> its committed transactions, in commit-CSN order.

    (lsn, DecodedItem) ──► NodeSender ──► Releaser ──► FinishedTxn ... ──► coordinator
                           (intake)        │   │        (csn strictly increasing)
                OpenTxn ◄──┘ │             │   └─► ConfirmableLsn (how far the slot
                TxnBuffer    └► MarkerReader          may be confirmed)
              (spills to disk)             └─ CsnOrderer (committing / commit lists)

`NodeSender` tracks transactions (plain and streamed, with rolled-back
subtransactions) and hands each committed one to its `Releaser`, which asks
`CsnOrderer` when it may go; its `MarkerReader` reads the GTM `csn` markers
(`csnd.core.markers`).  `watermark` and `confirmable_lsn` are what the
coordinator needs to merge nodes and to confirm the slot (docs/design.md
sections 3, 5).

Public API (what the runtime and the coordinator use): `NodeSender`, its
`NodeSenderStatistics`, the `FinishedTxn` it releases (a `TxnHeader` with its
changes), and `SPILL_BYTES`.  Everything else -- the release rule, the
orderer, the confirmable LSN, open transactions and their buffers -- is the
sender's own, importable from its module (`csnd.sender.ordering`, ...) for
the tests.

    node        NodeSender: the intake (the stream's structure, positions)
    release     Releaser: who is released when (CsnOrderer in ordering,
                ConfirmableLsn in confirmable)
    markers     MarkerReader: the GTM csn markers, the stream's start
    relations   RelationVersions: which release carries a new table version
    opentxn     OpenTxn, buffered in a TxnBuffer (txnbuf: spills to disk)
    positions   the position checks on whole transactions
    txn         TxnHeader, FinishedTxn (sender -> coordinator contract)
"""

from csnd.sender.node import NodeSender, NodeSenderStatistics
from csnd.sender.txn import FinishedTxn, TxnHeader
from csnd.sender.txnbuf import SPILL_BYTES

__all__ = [
    "SPILL_BYTES",
    "FinishedTxn",
    "NodeSender",
    "NodeSenderStatistics",
    "TxnHeader",
]
