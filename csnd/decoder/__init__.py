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

from csnd.decoder.change import DecodedChange

if TYPE_CHECKING:
    from csnd.decoder.rows import RelationCache, Table, decode_change
    from csnd.decoder.tuples import split_delete, split_insert, split_tuple, split_update
    from csnd.decoder.values import binary_decoder, binary_readable, text_decoder

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
    "RelationCache": "csnd.decoder.rows",
    "Table": "csnd.decoder.rows",
    "decode_change": "csnd.decoder.rows",
    "split_delete": "csnd.decoder.tuples",
    "split_insert": "csnd.decoder.tuples",
    "split_tuple": "csnd.decoder.tuples",
    "split_update": "csnd.decoder.tuples",
    "binary_decoder": "csnd.decoder.values",
    "binary_readable": "csnd.decoder.values",
    "text_decoder": "csnd.decoder.values",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'decoder' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
