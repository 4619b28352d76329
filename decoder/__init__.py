"""decoder: raw pgoutput changes -> typed, serialised row changes, in N processes.

    reader ──► pool (decoder.pool) ──► worker processes (decoder.worker) ──► sender
                                           │
                                           ├─ RelationCache   Relation / Type messages -> per-table
                                           │                  column decoders (decoder.rows)
                                           ├─ split tuples    raw TupleData -> columns (decoder.tuples)
                                           ├─ decode values   wire forms -> JSON values
                                           │                  (decoder.values, decoder.temporal)
                                           └─ decode_change   -> DecodedChange (decoder.change)

The decoding layer (rows, tuples, values, temporal) is pure: no processes,
no I/O; the pool and worker wire it into processes.
"""

from decoder.change import DecodedChange
from decoder.rows import RelationCache, Table, decode_change
from decoder.tuples import split_delete, split_insert, split_tuple, split_update
from decoder.values import binary_decoder, binary_readable, text_decoder

__all__ = [
    "DecodedChange",
    "RelationCache",
    "Table",
    "binary_decoder",
    "binary_readable",
    "decode_change",
    "split_delete",
    "split_insert",
    "split_tuple",
    "split_update",
    "text_decoder",
]
