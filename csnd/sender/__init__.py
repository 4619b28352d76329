"""sender: one node's decoded stream -> its committed transactions, in commit-CSN order.

    (lsn, DecodedItem) ──► NodeSender ──► FinishedTxn ... ──► coordinator
                            │   ▲   │        (csn strictly increasing)
                OpenTxn ◄───┘   │   └─► ConfirmableLsn (how far the slot
                TxnBuffer       │        may be confirmed)
              (spills to disk)  └─ CsnOrderer (committing / commit lists)

`NodeSender` tracks transactions (plain and streamed, with rolled-back
subtransactions), reads the GTM `csn` markers (`csnd.core.markers`), and asks
`CsnOrderer` when a committed transaction may go; `watermark` and
`confirmable_lsn` are what the coordinator needs to merge nodes and to
confirm the slot (docs/design.md sections 3, 5).
"""

from csnd.core.modes import MODES
from csnd.sender.confirmable import ConfirmableLsn
from csnd.sender.node import NodeSender, NodeSenderStatistics
from csnd.sender.opentxn import OpenTxn
from csnd.sender.ordering import CsnOrderer
from csnd.sender.txn import FinishedTxn, TxnHeader
from csnd.sender.txnbuf import SPILL_BYTES, SpillError, TxnBuffer

__all__ = [
    "MODES",
    "SPILL_BYTES",
    "ConfirmableLsn",
    "CsnOrderer",
    "FinishedTxn",
    "NodeSender",
    "NodeSenderStatistics",
    "OpenTxn",
    "SpillError",
    "TxnBuffer",
    "TxnHeader",
]
