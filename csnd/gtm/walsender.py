"""One node's WAL and walsender, emulated: what pgoutput v2 sends, and when.

The workload (`gtm.workload`) writes *WAL records* on a node -- changes,
logical messages, subtransaction aborts, PREPARE, COMMIT PREPARED, ROLLBACK --
and this module turns them into the CopyData frames a PostgreSQL 15 walsender
with `proto_version '2', streaming 'on', messages 'true'` would send, in the
order it would send them:

    WAL record                 what goes out, and when
    change / tx message        buffered in the txn's reorder-buffer entry; when the
                               node's buffered bytes reach `work_mem` the largest txn
                               is streamed: Stream Start .. its buffered changes (each
                               with its (sub)xid) .. Stream Stop, right away
    non-tx message             one Message frame, at once, outside any txn
    ROLLBACK TO SAVEPOINT      if that subxact's changes were already streamed: Stream
                               Abort(xid, subxid) (children first); the rest is dropped
    COMMIT PREPARED            not streamed: Begin, (Relation,) changes, Commit;
                               streamed: a last block with the rest, then Stream Commit
    ROLLBACK [PREPARED]        streamed: Stream Abort per streamed subxact, then
                               (xid, xid); not streamed: nothing at all
    PREPARE                    nothing (no two-phase decoding)

Positions follow walsender.c / pgoutput.c (docs/design.md section 9): a frame's
dataStart and walEnd are both the "write location" -- the change's or
message's LSN, Begin at the txn's first record, Stream Start/Stop at the
block's first/last change, Commit / Stream Commit / Stream Abort at the end
of their record -- and Relation frames are 0/0.

Relation messages: a non-streamed txn sends one before its first change of a
table whose current shape was not sent yet on this node (`sent`); a streamed
txn keeps its own set per top-level xid, merged into the node's when it
commits and cleared by any Stream Abort (`cleanup_rel_sync_cache`).  A DDL
commit invalidates the table everywhere, so the next change re-sends it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from csnd.core.markers import PREFIX
from csnd.gtm.shapes import Shape
from csnd.reader.pgoutput import (
    encode_begin,
    encode_commit,
    encode_delete,
    encode_insert,
    encode_keepalive,
    encode_message,
    encode_stream_abort,
    encode_stream_commit,
    encode_stream_start,
    encode_stream_stop,
    encode_truncate,
    encode_update,
    encode_xlogdata,
)
from csnd.reader.streamfile import StreamWriter

# Sizes of WAL records in bytes: only their order of magnitude matters (they
# space LSNs realistically); all are MAXALIGNed to 8 like the real thing.
RECORD_HEADER: Final = 24
CHANGE_OVERHEAD: Final = 50  # heap record header + tuple header
MESSAGE_OVERHEAD: Final = 40
COMMIT_RECORD: Final = 88
PREPARE_RECORD: Final = 160
ABORT_RECORD: Final = 56

# Reorder-buffer accounting per change: sizeof(ReorderBufferChange) plus the
# tuple, as ReorderBufferChangeSize counts it.
RB_CHANGE_OVERHEAD: Final = 80

# Item kinds in a txn's buffer.
INSERT: Final = "I"
UPDATE: Final = "U"
DELETE: Final = "D"
TRUNCATE: Final = "T"
MESSAGE: Final = "M"

# One buffered change: (lsn, xid, kind, relid, shape, payload, rb_size).  A
# plain tuple: a big run buffers hundreds of thousands of them.
Item = tuple[int, int, str, Any, Any, Any, int]


class RbTxn:
    """A top-level transaction's reorder-buffer entry on one node."""

    __slots__ = ("xid", "first_lsn", "items", "bytes", "streamed", "sent", "streamed_subxids")

    def __init__(self, xid: int, first_lsn: int) -> None:
        self.xid = xid
        self.first_lsn = first_lsn  # its first WAL record: Begin's position
        self.items: list[Item] = []
        self.bytes = 0
        self.streamed = False
        self.sent: dict[str, Shape] = {}  # Relation messages sent in this streamed txn
        self.streamed_subxids: dict[int, None] = {}  # subxacts with changes in a sent block


class NodeStream:
    """A node's WAL position, xid counter and walsender output, written to `writer`."""

    def __init__(
        self,
        name: str,
        writer: StreamWriter,
        start_lsn: int,
        first_xid: int,
        work_mem: int,
        clock: Callable[[], int],
    ) -> None:
        self.name = name
        self.writer = writer
        self.pos = start_lsn  # where the next WAL record starts (= end of the last one)
        self.next_xid = first_xid
        self.work_mem = work_mem
        self.clock = clock
        self.txns: dict[int, RbTxn] = {}
        self.sent: dict[str, Shape] = {}
        self.buffered = 0
        self.stream_blocks = 0
        self._write = writer.write_frame

    # --- WAL ------------------------------------------------------------------

    def reserve(self, size: int) -> int:
        """Reserve a WAL record of `size` bytes; returns its LSN (its end is `self.pos`)."""
        lsn = self.pos
        self.pos = lsn + ((RECORD_HEADER + size + 7) & ~7)
        return lsn

    def assign_xid(self) -> int:
        xid = self.next_xid
        self.next_xid += 1
        return xid

    def begin(self, xid: int, first_lsn: int) -> RbTxn:
        txn = RbTxn(xid, first_lsn)
        self.txns[xid] = txn
        return txn

    def add(self, txn: RbTxn, item: Item) -> None:
        """Buffer one decoded change; stream the largest txn when memory is full."""
        txn.items.append(item)
        txn.bytes += item[6]
        self.buffered += item[6]
        if self.buffered >= self.work_mem:
            self._check_memory()

    def _check_memory(self) -> None:
        # ReorderBufferCheckMemoryLimit: stream the largest top-level txn
        # (ties: the oldest) until the buffered total is under the limit.
        while self.buffered >= self.work_mem:
            largest: RbTxn | None = None
            for txn in self.txns.values():
                if largest is None or txn.bytes > largest.bytes:
                    largest = txn
            if largest is None or not largest.items:
                return
            self._stream_block(largest)

    # --- frames ---------------------------------------------------------------

    def _frame(self, lsn: int, msg: bytes) -> None:
        self._write(encode_xlogdata(lsn, lsn, self.clock(), msg))

    def _relation(self, relid: int, shape: Shape, xid: int | None, sent: dict[str, Shape]) -> None:
        if sent.get(shape.table) is not shape:
            self._write(encode_xlogdata(0, 0, self.clock(), shape.relation_message(relid, xid)))
            sent[shape.table] = shape

    def _emit(self, item: Item, xid: int | None, sent: dict[str, Shape]) -> None:
        lsn, _, kind, relid, shape, payload, _ = item
        if kind == MESSAGE:
            self._frame(lsn, encode_message(PREFIX, payload, lsn, True, xid=xid))
            return
        if kind == TRUNCATE:
            for r, s in zip(relid, shape, strict=True):
                self._relation(r, s, xid, sent)
            self._frame(lsn, encode_truncate(list(relid), payload, xid=xid))
            return
        self._relation(relid, shape, xid, sent)
        if kind == INSERT:
            msg = encode_insert(relid, payload, xid=xid)
        elif kind == UPDATE:
            old, old_kind, new = payload
            msg = encode_update(relid, new, old, old_kind, xid=xid)
        else:
            old, old_kind = payload
            msg = encode_delete(relid, old, old_kind, xid=xid)
        self._frame(lsn, msg)

    def _stream_block(self, txn: RbTxn) -> None:
        items = txn.items
        self._frame(items[0][0], encode_stream_start(txn.xid, not txn.streamed))
        top, sent, subs = txn.xid, txn.sent, txn.streamed_subxids
        for item in items:
            xid = item[1]
            self._emit(item, xid, sent)
            if xid != top:
                subs[xid] = None
        self._frame(items[-1][0], encode_stream_stop())
        txn.streamed = True
        self.buffered -= txn.bytes
        txn.items = []
        txn.bytes = 0
        self.stream_blocks += 1

    def _drop(self, txn: RbTxn) -> None:
        self.buffered -= txn.bytes
        del self.txns[txn.xid]

    # --- records with output --------------------------------------------------

    def message(self, content: str) -> int:
        """A non-transactional `csn` message: WAL-logged and sent at once."""
        raw = content.encode("ascii")
        lsn = self.reserve(MESSAGE_OVERHEAD + len(raw))
        self._frame(lsn, encode_message(PREFIX, raw, lsn, False))
        return lsn

    def subxact_abort(self, txn: RbTxn, aborted: list[int]) -> None:
        """ROLLBACK TO SAVEPOINT: `aborted` lists the released children, then the subxact."""
        self.reserve(ABORT_RECORD + 4 * len(aborted))
        end = self.pos
        if txn.streamed:
            sent_abort = False
            for x in aborted:
                if x in txn.streamed_subxids:
                    del txn.streamed_subxids[x]
                    self._frame(end, encode_stream_abort(txn.xid, x))
                    sent_abort = True
            if sent_abort:
                txn.sent.clear()
        gone = set(aborted)
        keep = [it for it in txn.items if it[1] not in gone]
        freed = txn.bytes - sum(it[6] for it in keep)
        txn.items = keep
        txn.bytes -= freed
        self.buffered -= freed

    def abort(self, txn: RbTxn, subxids: list[int], prepared: bool) -> None:
        """ROLLBACK or ROLLBACK PREPARED of the whole txn; `subxids`: its released subxacts."""
        self.reserve((PREPARE_RECORD if prepared else ABORT_RECORD) + 4 * len(subxids))
        end = self.pos
        if txn.streamed:
            for x in subxids:
                if x in txn.streamed_subxids:
                    self._frame(end, encode_stream_abort(txn.xid, x))
            self._frame(end, encode_stream_abort(txn.xid, txn.xid))
        self._drop(txn)

    def prepare(self) -> None:
        """PREPARE TRANSACTION: WAL only; without two-phase decoding nothing is sent."""
        self.reserve(PREPARE_RECORD)

    def commit(self, txn: RbTxn, commit_time: int) -> tuple[int, int]:
        """COMMIT PREPARED: send the txn; returns (commit_lsn, end_lsn)."""
        commit_lsn = self.reserve(COMMIT_RECORD)
        end_lsn = self.pos
        if txn.streamed:
            if txn.items:
                self._stream_block(txn)
            self._frame(end_lsn, encode_stream_commit(txn.xid, commit_lsn, end_lsn, commit_time))
            self.sent.update(txn.sent)
        elif txn.items:  # pgoutput skips empty txns; ours always hold their commit marker
            self._frame(txn.first_lsn, encode_begin(commit_lsn, commit_time, txn.xid))
            sent = self.sent
            for item in txn.items:
                self._emit(item, None, sent)
            self._frame(end_lsn, encode_commit(commit_lsn, end_lsn, commit_time))
        self._drop(txn)
        return commit_lsn, end_lsn

    def invalidate(self, table: str) -> None:
        """A committed DDL on `table`: every Relation cache entry for it is stale."""
        self.sent.pop(table, None)
        for txn in self.txns.values():
            txn.sent.pop(table, None)

    def keepalive(self, reply: bool = False) -> None:
        self._write(encode_keepalive(self.pos, self.clock(), reply))

    def gap(self, size: int) -> None:
        """WAL of other databases, checkpoints, vacuum: positions move, nothing is sent."""
        self.reserve(size)
