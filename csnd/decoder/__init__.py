"""decoder: raw pgoutput changes -> typed, serialised row changes, in N processes.

    reader ──► pool (decoder.pool) ──► worker processes (decoder.worker) ──► sender
                                           │
                                           ├─ RelationCache   Relation / Type messages -> per-table
                                           │                  column decoders (decoder.relations)
                                           │                  and row reader (decoder.rowreader)
                                           ├─ split tuples    raw TupleData -> columns (decoder.tuples)
                                           ├─ decode values   wire forms -> JSON values
                                           │                  (decoder.values, decoder.temporal)
                                           └─ decode_change   -> DecodedChange (decoder.rows,
                                                              decoder.change)

The decoding layer (relations, rowreader, rows, tuples, values, temporal) is pure: no processes,
no I/O; the pool and worker wire it into processes.

Public API (what other packages use): the pool (`DecoderPool`, its
`BATCH_END` mark, `start_worker_server`), the items it hands the sender
(`DecodedItem`: `DecodedRun`, `WholeTxns` of `WholeTxn`, `DecodedChange`,
and the messages it passes through, `PassThroughItem`),
and for the snapshot copier the per-table decoding (`RelationCache`, its
`Table`, `row_change_body`) and a relation's rendering (`relation_body`).  The rest
(tuple splitting, value decoders, the worker's messages) is the decoder's
own, importable from its module for the tests.
"""

from typing import TYPE_CHECKING, Any

from csnd.decoder.change import DecodedChange, DecodedItem, DecodedRun, PassThroughItem, WholeTxn, WholeTxns

if TYPE_CHECKING:
    from csnd.decoder.pool import BATCH_END, BatchEnd, DecoderPool, start_worker_server
    from csnd.decoder.relations import RelationCache, Table
    from csnd.decoder.rows import row_change_body
    from csnd.decoder.schema import relation_body

__all__ = [
    "BATCH_END",
    "BatchEnd",
    "DecodedChange",
    "DecodedItem",
    "DecodedRun",
    "DecoderPool",
    "PassThroughItem",
    "RelationCache",
    "Table",
    "WholeTxn",
    "WholeTxns",
    "relation_body",
    "row_change_body",
    "start_worker_server",
]

# The decoding layer imports psycopg (its value loaders), a fifth of a
# second at start-up that only the worker processes need, and the pool
# multiprocessing: the coordinator's process, which imports this package for
# the items, loads them lazily.
_LAZY = {
    "BATCH_END": "csnd.decoder.pool",
    "BatchEnd": "csnd.decoder.pool",
    "DecoderPool": "csnd.decoder.pool",
    "start_worker_server": "csnd.decoder.pool",
    "RelationCache": "csnd.decoder.relations",
    "Table": "csnd.decoder.relations",
    "row_change_body": "csnd.decoder.rows",
    "relation_body": "csnd.decoder.schema",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'csnd.decoder' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
