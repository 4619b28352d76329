"""coordinator: the global, CSN-ordered merge of the node streams (DESIGN section 4, seed 002 3.6).

    node pipeline dn1 ─ NodeBatch, watermark, end ─┐
    node pipeline dn2 ─ NodeBatch, watermark, end ─┼─► CsnMerge ─► GlobalTxn ─► to_json_line()
    node pipeline dnK ─ NodeBatch, watermark, end ─┘  <csn, cid,    (one per     (DESIGN section 7)
                                                       batch_id>     csn)

`CsnMerge` is pure (no I/O, no threads, no clock): the I/O layer pushes what
each node sends, pops what is safe to emit, and asks `wants_more(node)` before
reading a node further (back-pressure).  `check_modes` refuses node sets that
have no common commit order before anything starts.
"""

from coordinator.batch import MergeStatistics, NodeBatch, NodeStatistics
from coordinator.jsonlines import json_line
from coordinator.merge import (
    DEFAULT_MAX_PENDING_BATCHES,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_RECENT_GIDS,
    CsnMerge,
)
from coordinator.modes import Mode, check_modes
from coordinator.txn import GlobalTxn, NodeCommit

__all__ = [
    "DEFAULT_MAX_PENDING_BATCHES",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_RECENT_GIDS",
    "CsnMerge",
    "GlobalTxn",
    "MergeStatistics",
    "Mode",
    "NodeBatch",
    "NodeCommit",
    "NodeStatistics",
    "check_modes",
    "json_line",
]
