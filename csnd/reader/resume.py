"""Hiding a reconnect from everything downstream (sans-I/O).

After a lost connection or a server restart the live reader starts the slot
again from the last *confirmed* position.  The server then re-sends every
transaction whose commit record is at or after that position -- including
transactions we already passed downstream (complete, or only partly: a
non-streamed transaction cut mid-way, or some blocks of a streamed one).  And
it re-sends non-transactional logical messages past that position.

`ResumeFilter` sits between the replication connection and the rest of the
pipeline and drops what was already delivered, by LSN, so downstream sees one
unbroken stream:

* a transaction whose commit was delivered is dropped whole (by xid; xids are
  not reused within the window that can be re-sent);
* in a transaction delivered only in part, changes up to the last delivered
  position are dropped.  Several changes may share one LSN (a multi-insert
  writes one WAL record for many rows), so the position is `(lsn, ordinal)`;
* a stream block whose changes were all delivered is dropped with its
  Stream Start/Stop -- so is an empty one (pgoutput streams blocks of changes
  it then filters out, e.g. of tables outside the publication); the first
  block downstream is given of a transaction says `first_segment`, later ones
  do not; a streamed transaction whose every block was dropped this way gets
  one empty first block before its Stream Commit;
* non-transactional messages at or below the last delivered message LSN are
  dropped (they are in WAL order among themselves);
* Relation and Type messages always pass: re-applying them is idempotent, and
  the walsender re-sends them in the order that keeps decoders right.

Without a reconnect nothing but empty stream blocks is ever dropped: every
other rule only fires on a position at or below one that was already
delivered.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from csnd.core.ids import INVALID_LSN, Lsn, Xid
from csnd.reader.pgoutput import (
    RUN_FRAME_LENGTH,
    XLOGDATA_HEADER_SIZE,
    Begin,
    Change,
    ChangeFrames,
    Commit,
    Keepalive,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    ScannedTxn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TxnRun,
    TypeMsg,
    encode_relation,
    encode_stream_start,
    encode_stream_stop,
    encode_type,
    encode_xlogdata,
    scanned_txn_frames,
)

Item = tuple[Lsn, "Message | Keepalive | ChangeFrames | TxnRun", bytes]
"""`(lsn, message, CopyData payload)`; the payload is what a recording stores."""

_NO_POS: Final = (-1, 0)


class _Progress:
    """How far one transaction's changes were delivered: `(lsn, how many at that lsn)`."""

    __slots__ = ("lsn", "count", "replay_lsn", "replay_count")

    def __init__(self) -> None:
        self.lsn = -1
        self.count = 0
        # position reached by the current (re-sent) pass over this transaction
        self.replay_lsn = -1
        self.replay_count = 0

    def restart(self) -> None:
        self.replay_lsn, self.replay_count = -1, 0

    def admit(self, lsn: int) -> bool:
        """Count one change at `lsn`; True if it is new (not delivered before)."""
        if lsn == self.replay_lsn:
            self.replay_count += 1
        else:
            self.replay_lsn, self.replay_count = lsn, 1
        lsn, count = self.replay_lsn, self.replay_count
        if lsn < self.lsn or (lsn == self.lsn and count <= self.count):  # (at or before what was delivered)
            return False
        self.lsn, self.count = lsn, count
        return True


class ResumeFilter:
    """Drops what a re-sent stream repeats; see the module docstring."""

    def __init__(self) -> None:
        self.completed: dict[int, int] = {}  # xid -> end LSN of its delivered commit/abort
        # What `completed` holds, in delivery order, as it came: (the last end LSN, xids, end LSNs)
        # of each transaction or batch of them (`_forget`).
        self._completed_order: deque[tuple[int, list[Xid], list[Lsn]]] = deque()
        self._confirmed_to = 0  # set by `confirmed` (another thread)
        self.progress: dict[int, _Progress] = {}  # open (partly delivered) transactions
        self.streams_open: set[int] = set()  # streamed xids with a delivered first segment
        self.sub_aborts: set[tuple[int, int]] = set()
        self.last_nontxn_lsn = -1
        self.dropped = 0
        # The current connection re-sends nothing that ends at or below this:
        # its start position, raised by every commit it sends (in commit order).
        self._conn_floor = 0
        # per-connection parse state
        self._txn: int | None = None  # xid of the open non-streamed transaction
        self._skip_txn = False
        self._block: int | None = None  # xid of the open stream block
        self._block_skip = False
        self._held_start: Item | None = None

    # --- connection lifecycle ---------------------------------------------------

    def reconnected(self, start_lsn: Lsn = INVALID_LSN) -> list[Item]:
        """A new connection starts at `start_lsn`: partly delivered transactions come again whole.

        Returns what downstream must see first: a Stream Stop closing the
        block the lost connection left open, if any.
        """
        out: list[Item] = []
        if self._block is not None and not self._block_skip and self._held_start is None:
            out.append((INVALID_LSN, StreamStop(), encode_xlogdata(0, 0, 0, encode_stream_stop())))
        self._conn_floor = start_lsn
        self._txn, self._skip_txn = None, False
        self._block, self._block_skip, self._held_start = None, False, None
        for p in self.progress.values():
            p.restart()
        return out

    def confirmed(self, lsn: Lsn) -> None:
        """The slot is confirmed to `lsn`: delivered transactions ending there are never re-sent again.

        Called from the thread that makes output durable, not the one that
        feeds the filter, so it only records the position (one attribute
        store); the feeding thread forgets those transactions at its next
        commit (`_complete`).
        """
        if lsn > self._confirmed_to:
            self._confirmed_to = lsn

    def _complete(self, xid: int, end_lsn: int) -> None:
        """`xid` was delivered whole; forget the ones no connection re-sends any more.

        The next connection starts at the confirmed position and re-sends
        nothing ending at or before it; the current one may still re-send
        anything above its own floor (a confirm can land after it started from
        an older position, and a crashed server forgets confirms it had not yet
        saved).  Commits are delivered in end-LSN order, so the forgettable
        ones are at the front of `_completed_order`.
        """
        self.completed[xid] = end_lsn
        self._completed_order.append((end_lsn, [Xid(xid)], [Lsn(end_lsn)]))
        self._forget()

    def _complete_many(self, xids: list[Xid], ends: list[Lsn]) -> None:
        """`_complete` for each, in order (a batch: forgotten together once its last may be)."""
        self.completed.update(zip(xids, ends, strict=True))
        self._completed_order.append((ends[-1], xids, ends))
        self._forget()

    def _forget(self) -> None:
        order, completed = self._completed_order, self.completed
        limit = min(self._confirmed_to, self._conn_floor)
        while order and order[0][0] <= limit:
            _, xids, ends = order.popleft()
            # (an xid completed again since -- after a wraparound -- keeps its newer entry)
            for done in [x for x, end in zip(xids, ends, strict=True) if completed.get(x) == end]:
                del completed[done]

    # --- the filter -----------------------------------------------------------------

    def feed(self, item: Item) -> list[Item]:
        lsn, msg, _ = item
        if type(msg) is Change and self._block is None:  # (nearly every message: the rules below, in short)
            xid = self._txn
            if xid is None:
                return [item]  # not ours to judge: the sender reports the protocol error
            if self._skip_txn:
                return self._drop()
            return [item] if self.progress[xid].admit(lsn) else self._drop()
        if type(msg) is TxnRun and self._block is None:  # (a live reader's batch of whole transactions)
            return self._whole_run(item, msg)
        if type(msg) is ChangeFrames and self._block is None:  # (a live reader's run of them)
            return self._run(item, msg)
        if isinstance(msg, Keepalive):
            return [item]
        if self._block is not None:
            return self._in_block(item)
        if isinstance(msg, (Relation, TypeMsg)):
            return [item]
        if isinstance(msg, Begin):
            return self._begin(item, msg)
        if isinstance(msg, Commit):
            return self._commit(item, msg)
        if isinstance(msg, StreamStart):
            return self._stream_start(item, msg)
        if isinstance(msg, StreamCommit):
            return self._stream_end(item, msg.xid, msg.end_lsn)
        if isinstance(msg, StreamAbort):
            return self._stream_abort(item, msg)
        if isinstance(msg, LogicalMessage) and not msg.transactional and self._txn is None:
            if msg.lsn <= self.last_nontxn_lsn:
                return self._drop()
            self.last_nontxn_lsn = msg.lsn
            return [item]
        # a change, transactional message, truncate or origin inside a Begin/Commit
        if self._txn is None:
            return [item]  # not ours to judge: the sender reports the protocol error
        if self._skip_txn:
            return self._drop()
        if isinstance(msg, Origin):
            return [item]
        return [item] if self.progress[self._txn].admit(lsn) else self._drop()

    def _whole(self, t: ScannedTxn) -> list[Item]:
        """A whole transaction of a run that cannot pass as one: new, it passes whole (a run of one); else judged as the events it stands for."""
        xid, end_lsn = t.xid, t.end_lsn
        if self._txn is not None or xid in self.progress or xid in self.completed:
            out: list[Item] = []
            for lsn, msg in scanned_txn_frames(t).events():
                out += self.feed((lsn, msg, msg.blob if type(msg) is ChangeFrames else b""))
            return out
        self._conn_floor = max(self._conn_floor, end_lsn)
        self._complete(xid, end_lsn)
        return [(t.begin_at, TxnRun([t]), b"")]

    def _whole_run(self, item: Item, run: TxnRun) -> list[Item]:
        """Whole transactions: all new, they pass as one; else each is judged by itself (`_whole`)."""
        txns = run.txns
        xids = [t.xid for t in txns]
        if (
            self._txn is not None
            or not self.completed.keys().isdisjoint(xids)
            or (self.progress and not self.progress.keys().isdisjoint(xids))
            or len(set(xids)) != len(xids)  # (a corrupt stream's repeat: dropped there, as it always was)
        ):
            out: list[Item] = []
            for t in txns:
                out += self._whole(t)
            return out
        ends = [t.end_lsn for t in txns]
        self._conn_floor = max(self._conn_floor, ends[-1])  # (commits come in end-LSN order)
        self._complete_many(xids, ends)
        return [item]

    def _run(self, item: Item, run: ChangeFrames) -> list[Item]:
        """A run of row changes: each judged as a `Change` is; the new ones are always its tail."""
        xid = self._txn
        if xid is None:
            return [item]  # not ours to judge: the sender reports the protocol error
        if self._skip_txn:
            self.dropped += len(run.lsns)
            return []
        admit = self.progress[xid].admit
        new = [admit(lsn) for lsn in run.lsns]
        if new[0]:  # (positions only go forward: once one is new, so is every one after it)
            return [item]
        if not new[-1]:
            self.dropped += len(new)
            return []
        first = new.index(True)
        self.dropped += first
        tail = run_tail(run, first)
        return [(run.lsns[first], tail, tail.blob)]

    def _drop(self) -> list[Item]:
        self.dropped += 1
        return []

    def _begin(self, item: Item, msg: Begin) -> list[Item]:
        self._txn = msg.xid
        if msg.xid in self.completed:
            self._skip_txn = True
            return self._drop()
        self._skip_txn = False
        if msg.xid in self.progress:
            return self._drop()  # downstream already has this Begin
        self.progress[msg.xid] = _Progress()
        return [item]

    def _commit(self, item: Item, msg: Commit) -> list[Item]:
        xid, self._txn = self._txn, None
        self._conn_floor = max(self._conn_floor, msg.end_lsn)
        if self._skip_txn:
            self._skip_txn = False
            return self._drop()
        if xid is not None:
            self.progress.pop(xid, None)
            self._complete(xid, msg.end_lsn)
        return [item]

    def _stream_start(self, item: Item, msg: StreamStart) -> list[Item]:
        self._block = msg.xid
        self._block_skip = msg.xid in self.completed
        self._held_start = None
        if self._block_skip:
            return self._drop()
        if msg.xid not in self.progress:
            self.progress[msg.xid] = _Progress()
        # hold the Start back until the block proves to carry something new
        self._held_start = item
        return []

    def _in_block(self, item: Item) -> list[Item]:
        lsn, msg, _ = item
        xid = self._block
        assert xid is not None
        if isinstance(msg, StreamStop):
            self._block = None
            if self._block_skip or self._held_start is not None:
                self._held_start = None
                return self._drop()
            return [item]
        if self._block_skip and not isinstance(msg, (Relation, TypeMsg)):
            return self._drop()
        if self._block_skip:
            # Downstream is outside any block, where Relation/Type carry no
            # xid; the schema still matters (the walsender will not send it again).
            return [_without_xid(item)]
        if isinstance(msg, (Change, Truncate, LogicalMessage)) and not self.progress[xid].admit(lsn):
            return self._drop()
        out: list[Item] = []
        if self._held_start is not None:
            out.append(self._release_start(xid))
        out.append(item)
        return out

    def _release_start(self, xid: int) -> Item:
        held = self._held_start
        assert held is not None
        self._held_start = None
        lsn, msg, payload = held
        assert isinstance(msg, StreamStart)
        # Downstream's first block of the transaction is the first it is given: a
        # re-sent first block continues one delivered before a reconnect, and the
        # block after empty ones (dropped) starts the transaction.
        first = xid not in self.streams_open
        if msg.first_segment != first:
            msg = StreamStart(msg.xid, first)  # (msg.xid == xid, the block's)
            payload = payload[:XLOGDATA_HEADER_SIZE] + encode_stream_start(xid, first)
        self.streams_open.add(xid)
        return (lsn, msg, payload)

    def _stream_abort(self, item: Item, msg: StreamAbort) -> list[Item]:
        if msg.xid in self.completed or (msg.xid, msg.subxid) in self.sub_aborts:
            return self._drop()
        if msg.subxid == msg.xid:
            return self._stream_end(item, msg.xid, item[0])
        self.sub_aborts.add((msg.xid, msg.subxid))
        return [item]

    def _stream_end(self, item: Item, xid: int, end_lsn: int) -> list[Item]:
        self._conn_floor = max(self._conn_floor, end_lsn)
        if xid in self.completed:
            return self._drop()
        self.progress.pop(xid, None)
        started = xid in self.streams_open
        self.streams_open.discard(xid)
        self.sub_aborts = {s for s in self.sub_aborts if s[0] != xid}
        self._complete(xid, end_lsn)
        if started or not isinstance(item[1], StreamCommit):
            return [item]
        # Every block of it was empty and held back: pgoutput streams a block for
        # changes it then filters out (tables outside the publication).  Downstream
        # must see the transaction start before it commits: one empty first block.
        start = encode_xlogdata(0, 0, 0, encode_stream_start(xid, True))
        stop = encode_xlogdata(0, 0, 0, encode_stream_stop())
        commit = item[1]
        return [(INVALID_LSN, StreamStart(commit.xid, True), start), (INVALID_LSN, StreamStop(), stop), item]

    def between_transactions(self) -> bool:
        """No transaction or stream block open: the next frame should start one (or be outside any)."""
        return self._txn is None and self._block is None

    @property
    def open_transactions(self) -> int:
        """Transactions downstream has seen start but not end (any kind)."""
        return len(self.progress)


def run_tail(run: ChangeFrames, first: int) -> ChangeFrames:
    """The frames of `run` from its `first` on, as a run of their own."""
    pos, blob, head = 0, run.blob, run.head
    for _ in range(first):
        pos += head + RUN_FRAME_LENGTH.unpack_from(blob, pos)[0]
    return ChangeFrames(blob[pos:], run.in_stream, run.xid, run.lsns[first:], head)


def _without_xid(item: Item) -> Item:
    """A Relation or Type message from inside a stream block, re-encoded for outside one."""
    lsn, msg, payload = item
    header = payload[:XLOGDATA_HEADER_SIZE]
    if isinstance(msg, Relation):
        msg = Relation(None, msg.relid, msg.namespace, msg.name, msg.replident, msg.columns)
        body = encode_relation(msg.relid, msg.namespace, msg.name, msg.replident, msg.columns)
    else:
        assert isinstance(msg, TypeMsg)
        msg = TypeMsg(None, msg.type_oid, msg.namespace, msg.name)
        body = encode_type(msg.type_oid, msg.namespace, msg.name)
    return (lsn, msg, header + body)
