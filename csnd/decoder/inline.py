"""A small live batch decoded in the reader's own thread, with the workers' code (`decoder.worker`).

    reader thread: BatchFeed.cut ─┬─ small, decoders idle ─► InlineDecoder.decode ─► CutBatch.decoded
                                  └─ otherwise ───────────► DecodeBatch to worker i mod N (the pool)

Live, a batch holds a transaction or a few, and its round trip through a
decoder process costs more than decoding it: the queue's feeder thread
wakes to write it into the pipe, the worker process wakes to decode it and
the collector wakes a second time to read the result -- three wake-ups, a
pickle each way, and on a busy machine a scheduling delay at each.  Decoded
here, the batch reaches the collector with its bodies, through the same
skeleton queue and so in stream order.  Backlog and bulk still go to the
workers: only a batch of at most `INLINE_CHANGES` changes, cut while the
workers hold no batch, is decoded here (`BatchFeed.cut`).

The bodies are `decoder.worker.decode_batch`'s, with a relation cache of
its own that takes every Relation and Type message in stream order, as each
worker's does (the feed applies each where it broadcasts it), so a line is
byte for byte what a worker would have written.
"""

from __future__ import annotations

from typing import Any, Final

from csnd.core.errors import CsndError, InternalError
from csnd.decoder.messages import ApplyMeta, Wire

# The most changes a batch may hold to be decoded in the reader's thread.  Live
# batches hold one transaction or a few; the drain's hold `feed.BATCH_CHANGES`
# (2048) and stay with the workers, whose parallelism they need.
INLINE_CHANGES: Final = 64


class InlineDecoder:
    """Decodes batches as a worker would, in the calling thread (see the module docstring)."""

    __slots__ = ("node", "binary", "_cache", "_decode_batch", "batches", "changes")

    def __init__(
        self,
        node: str,
        binary: bool,
        enums: list[tuple[int, int]] | None = None,
        types: list[tuple[int, str, int, int]] | None = None,
    ) -> None:
        # (imported here: the decoding layer loads psycopg's loaders, which only a
        # process that decodes needs -- a live node's reader already has psycopg)
        from csnd.decoder.relations import RelationCache
        from csnd.decoder.worker import decode_batch

        self.node = node
        self.binary = binary
        self._cache = RelationCache(binary=binary)
        for type_oid, array_oid in enums or ():
            self._cache.declare_enum(type_oid, array_oid)
        self._cache.declare_types(types or ())
        self._decode_batch = decode_batch
        self.batches = 0  # decoded here, for the pool's stats
        self.changes = 0

    def apply(self, meta: ApplyMeta) -> None:
        """A Relation or Type message, in stream order (every worker takes the same one)."""
        try:
            self._cache.apply(meta.message, meta.lsn)
        except Exception as e:
            raise self._failure(e) from e

    def decode(self, wires: list[Wire], n_changes: int) -> list[Any]:
        """The bodies of a batch's entries, as `decoder.worker.decode_batch` returns them."""
        try:
            bodies = self._decode_batch(wires, self._cache, self.binary, self.node)
        except Exception as e:
            raise self._failure(e) from e
        self.batches += 1
        self.changes += n_changes
        return bodies

    def _failure(self, e: Exception) -> CsndError:
        """The error a worker would have reported for `e` (a bug: an InternalError naming the node)."""
        if isinstance(e, CsndError):
            return e.where(node=self.node)
        return InternalError(f"decoding in the reader thread failed: {e!r}", node=self.node)
