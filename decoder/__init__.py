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

from typing import TYPE_CHECKING, Any

from decoder.change import DecodedChange

if TYPE_CHECKING:
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

# The decoding layer imports psycopg (its value loaders), a fifth of a
# second at start-up that only the worker processes need: the coordinator's
# process, which imports this package for `DecodedChange`, loads it lazily.
_LAZY = {
    "RelationCache": "decoder.rows",
    "Table": "decoder.rows",
    "decode_change": "decoder.rows",
    "split_delete": "decoder.tuples",
    "split_insert": "decoder.tuples",
    "split_tuple": "decoder.tuples",
    "split_update": "decoder.tuples",
    "binary_decoder": "decoder.values",
    "binary_readable": "decoder.values",
    "text_decoder": "decoder.values",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'decoder' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
