"""sender: one node's decoded stream -> its committed transactions, in commit-CSN order.

    (lsn, pgoutput message | DecodedChange) ──► NodeSender ──► FinishedTxn ... ──► coordinator
                                                 │   ▲            (csn strictly increasing)
                                     TxnBuffer ◄─┘   └─ CsnOrderer (committing / commit lists)
                                   (spills to disk)

`NodeSender` tracks transactions (plain and streamed, with rolled-back
subtransactions), reads the GTM `csn` markers, and asks `CsnOrderer` when a
committed transaction may go; `watermark` and `confirmable_lsn` are what the
coordinator needs to merge nodes and to confirm the slot (DESIGN sections 3, 5).
"""

from csnd.core.modes import MODES
from csnd.sender.node import NodeSender, NodeSenderStatistics
from csnd.sender.ordering import CsnOrderer
from csnd.sender.txn import FinishedTxn
from csnd.sender.txnbuf import SPILL_BYTES, SpillError, TxnBuffer

__all__ = [
    "MODES",
    "SPILL_BYTES",
    "CsnOrderer",
    "FinishedTxn",
    "NodeSender",
    "NodeSenderStatistics",
    "SpillError",
    "TxnBuffer",
]
