"""coordinator: the global, CSN-ordered merge of the node streams (docs/design.md section 4).

    node pipeline dn1 ─ NodeBatch, watermark, end ─┐
    node pipeline dn2 ─ NodeBatch, watermark, end ─┼─► CsnMerge ─► TxnStart, TxnPart..., TxnEnd
    node pipeline dnK ─ NodeBatch, watermark, end ─┘  <csn, cid,    (pop_events: streamed, or
                                                       batch_id>     pop_ready: whole GlobalTxn)

`CsnMerge` is pure (no I/O, no threads, no clock): the I/O layer pushes what
each node sends, pops what is safe to emit, and asks `wants_more(node)` before
reading a node further (back-pressure).  `csnd.core.modes.check_modes`
refuses node sets that have no common commit order before anything starts.

    batch       NodeBatch (node -> merge contract), statistics
    merge       CsnMerge; its per-node state in mergestate, its output in txnevents
                (TxnJoiner: whole transactions), its csn/gid checks in identity
    gids        naming transactions in errors, recent gids in bounded memory
    globaltxn   GlobalTxn, one per commit CSN; jsonlines writes it (docs/design.md section 7)
    alone       the merge's own checks for a node that skips the merge
    wire        NodeBatch and End <-> protobuf

Public API: `__all__` below, what the runtime, the changelog and the
snapshot use, and the submodule `wire`, imported by its module name (it
loads protobuf, which a process that only merges does not need), not from
here.  The merge's bookkeeping (mergestate, identity, gids) is the
coordinator's own.
"""

from csnd.coordinator.alone import AloneOrder
from csnd.coordinator.batch import MergeStatistics, NodeBatch, NodeStatistics, change_cid
from csnd.coordinator.globaltxn import GlobalTxn, NodeCommit
from csnd.coordinator.jsonlines import JSON_TAIL, json_changes, json_head, json_line, relation_line
from csnd.coordinator.merge import (
    DEFAULT_MAX_PENDING_BATCHES,
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_RECENT_GIDS,
    CsnMerge,
    TxnEnd,
    TxnEvent,
    TxnPart,
    TxnStart,
)

__all__ = [
    "DEFAULT_MAX_PENDING_BATCHES",
    "DEFAULT_MAX_PENDING_BYTES",
    "DEFAULT_RECENT_GIDS",
    "JSON_TAIL",
    "AloneOrder",
    "CsnMerge",
    "GlobalTxn",
    "MergeStatistics",
    "NodeBatch",
    "NodeCommit",
    "NodeStatistics",
    "TxnEnd",
    "TxnEvent",
    "TxnPart",
    "TxnStart",
    "change_cid",
    "json_changes",
    "json_head",
    "json_line",
    "relation_line",
    "wire",
]
