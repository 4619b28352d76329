"""A node agent's unacknowledged window: what it produced and the coordinator has not yet confirmed having.

    producer ─► append(pos, msg) ─► [ entries in production order ] ─► next_to_send(sent, after) ─► stream
                                         ▲ ack(received) drops what the coordinator has

Every entry carries its position `<csn, index>` (a watermark the position of
the batch before it) and a sequence number within this agent's life.  A batch
at or before what the coordinator acknowledged is never kept or sent again;
a watermark is sent even then (idempotent, and a lost one could stall the
merge on an idle node) and stays until a later position is acknowledged (it
may not have arrived yet).  Batch positions strictly increase, so the window
is always a tail of what was appended.

Pure: the agent holds it under its lock and does the waiting (a full window
stops the producer).  The changefeed's acknowledgements have the same shape.
"""

from __future__ import annotations

from collections import deque
from typing import Final, Generic, TypeVar

from csnd.coordinator.wire import BEFORE_ALL, Position

# Batches produced but not yet acknowledged.  Larger: more slack over a slow
# link; smaller: less memory (a batch is up to MERGE_BATCH_CHANGES changes).
MAX_UNACKED: Final = 256

M = TypeVar("M")


class Entry(Generic[M]):
    __slots__ = ("seq", "pos", "msg", "is_batch")

    def __init__(self, seq: int, pos: Position, msg: M, is_batch: bool) -> None:
        self.seq = seq  # order within this agent's life
        self.pos = pos  # order across restarts
        self.msg = msg
        self.is_batch = is_batch


class AckWindow(Generic[M]):
    def __init__(self, capacity: int = MAX_UNACKED) -> None:
        self.capacity = capacity
        self.entries: deque[Entry[M]] = deque()
        self.acked: Position = BEFORE_ALL  # the coordinator has every batch at or before it
        self.seq = 0  # the last sequence number given
        self.peak = 0

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def full(self) -> bool:
        return len(self.entries) >= self.capacity

    def append(self, pos: Position, msg: M, is_batch: bool) -> bool:
        """Keep `msg` until acknowledged; False (and nothing kept) for a batch the coordinator has."""
        if is_batch and pos <= self.acked:
            return False  # (the agent restarted and re-read its source)
        self.seq += 1
        self.entries.append(Entry(self.seq, pos, msg, is_batch))
        self.peak = max(self.peak, len(self.entries))
        return True

    def ack(self, received: Position) -> None:
        """The coordinator has every batch at or before `received` (a subscription's `after` says the same)."""
        if received > self.acked:
            self.acked = received
        entries, acked = self.entries, self.acked
        while entries and (entries[0].pos < acked or (entries[0].pos == acked and entries[0].is_batch)):
            entries.popleft()

    def next_to_send(self, sent_seq: int, after: Position) -> tuple[Entry[M] | None, int]:
        """The first entry after sequence `sent_seq` a subscriber at `after` lacks, and the new `sent_seq`.

        Batches at or before `after` are passed over (the subscriber has
        them); with nothing to send, `sent_seq` moves to the newest entry.
        """
        entries = self.entries
        if not entries:
            return None, sent_seq
        # sequence numbers in the window are consecutive: jump to the first one not yet sent
        i = max(0, sent_seq + 1 - entries[0].seq)
        while i < len(entries):
            e = entries[i]
            if e.pos > after or not e.is_batch:
                return e, e.seq
            i += 1
        return None, max(sent_seq, entries[-1].seq)

    def _check(self) -> None:
        seqs = [e.seq for e in self.entries]
        assert seqs == list(range(self.seq - len(seqs) + 1, self.seq + 1)), seqs
        positions = [e.pos for e in self.entries]
        assert positions == sorted(positions), positions
        batches = [e.pos for e in self.entries if e.is_batch]
        assert len(set(batches)) == len(batches), batches
        assert all(pos > self.acked for pos in batches), (batches, self.acked)
        assert self.peak >= len(self.entries)
