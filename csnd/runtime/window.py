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

The window also bounds how far the coordinator may move the agent's slot.
A batch that opens a transaction carries the node's confirmable LSN after
it; `sent_lsn` is the highest of those that went out to a subscriber (or
that the producer passed over because the coordinator said it had them).
A confirm LSN beyond it would confirm WAL this agent never delivered -- with
a final Ack, `pg_replication_slot_advance` over transactions nobody read: a
silent gap -- so `confirm_limit` refuses it.  One honest exception: after an
agent restart the coordinator's confirm LSN comes from the agent's previous
life, and the new one re-reads its source from the slot.  Up to where the
slot was when the agent started (`resumed_lsn`) it is taken at once (the
slot is there already); while the agent is still `behind` the coordinator's
position it is honoured only as far as the re-reading has come (every Ack
repeats it, so the rest follows).

Pure: the agent holds it under its lock and does the waiting (a full window
stops the producer).  The changefeed's acknowledgements have the same shape.
"""

from __future__ import annotations

from collections import deque
from typing import Final, Generic, TypeVar

from csnd.coordinator.wire import BEFORE_ALL, Position
from csnd.core.ids import INVALID_LSN, Lsn

# Batches produced but not yet acknowledged.  Larger: more slack over a slow
# link; smaller: less memory (a batch is up to MERGE_BATCH_CHANGES changes).
MAX_UNACKED: Final = 256

M = TypeVar("M")


class Entry(Generic[M]):
    __slots__ = ("seq", "pos", "msg", "is_batch", "lsn")

    def __init__(self, seq: int, pos: Position, msg: M, is_batch: bool, lsn: Lsn = INVALID_LSN) -> None:
        self.seq = seq  # order within this agent's life
        self.pos = pos  # order across restarts
        self.msg = msg
        self.is_batch = is_batch
        self.lsn = lsn  # the confirmable LSN the message carries (0: none)


class AckWindow(Generic[M]):
    def __init__(self, capacity: int = MAX_UNACKED, resumed_lsn: Lsn = INVALID_LSN) -> None:
        self.capacity = capacity
        self.entries: deque[Entry[M]] = deque()
        self.acked: Position = BEFORE_ALL  # the coordinator has every batch at or before it
        self.seq = 0  # the last sequence number given
        self.peak = 0
        self.produced: Position = BEFORE_ALL  # the last batch appended in this life, kept or passed over
        self.sent: Position = BEFORE_ALL  # the last batch sent in this life
        # The highest confirmable LSN of a batch sent (or passed over: the coordinator has it), or where
        # the slot was when this agent started (`resumed_lsn`: a previous life sent up to there).
        self.sent_lsn = resumed_lsn

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def full(self) -> bool:
        return len(self.entries) >= self.capacity

    def append(self, pos: Position, msg: M, is_batch: bool, lsn: Lsn = INVALID_LSN) -> bool:
        """Keep `msg` (carrying confirmable LSN `lsn`, 0: none) until acknowledged.

        False (and nothing kept) for a batch the coordinator has: its LSN then
        counts as sent (it was, in the agent's previous life).
        """
        if is_batch:
            self.produced = max(self.produced, pos)
            if pos <= self.acked:
                self.sent_lsn = max(self.sent_lsn, lsn)
                return False  # (the agent restarted and re-read its source)
        self.seq += 1
        self.entries.append(Entry(self.seq, pos, msg, is_batch, lsn))
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
                if e.lsn > self.sent_lsn:
                    self.sent_lsn = e.lsn
                if e.is_batch and e.pos > self.sent:
                    self.sent = e.pos
                return e, e.seq
            i += 1
        return None, max(sent_seq, entries[-1].seq)

    @property
    def behind(self) -> bool:
        """The coordinator has batches this agent has not produced (again) yet: it restarted and re-reads."""
        return self.acked > self.produced

    def received_ok(self, received: Position) -> bool:
        """Whether an Ack's `received` is a position the coordinator can have: sent, or subscribed after.

        (A subscription's `after` may be ahead of this agent -- it restarted --
        and is taken as it comes; an Ack claims only what went out since.)
        A claim beyond would make the producer pass over batches nobody got,
        and count their LSNs as sent.
        """
        return received <= max(self.acked, self.sent)

    def confirm_limit(self, confirm_lsn: Lsn, ended: bool) -> Lsn | None:
        """How far a coordinator's confirm LSN may move the slot now; None: refuse it.

        Up to `sent_lsn` always.  Beyond it only while `behind` and the
        output has not `ended` (the restart case of the module docstring),
        and then only to `sent_lsn`; otherwise the coordinator confirms what
        this agent never sent, and None says to refuse the Ack.
        """
        if confirm_lsn <= self.sent_lsn:
            return confirm_lsn
        if self.behind and not ended:
            return self.sent_lsn
        return None

    def _check(self) -> None:
        seqs = [e.seq for e in self.entries]
        assert seqs == list(range(self.seq - len(seqs) + 1, self.seq + 1)), seqs
        positions = [e.pos for e in self.entries]
        assert positions == sorted(positions), positions
        batches = [e.pos for e in self.entries if e.is_batch]
        assert len(set(batches)) == len(batches), batches
        assert all(pos > self.acked for pos in batches), (batches, self.acked)
        assert self.peak >= len(self.entries)
        assert all(e.pos <= self.produced for e in self.entries if e.is_batch), (self.produced, batches)
