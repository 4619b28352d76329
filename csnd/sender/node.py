"""One node's sender: decoded changes in, finished transactions out, in commit-CSN order.

    (lsn, item) in stream order ──► NodeSender.feed ──► [FinishedTxn, ...] in CSN order
        Begin / Commit                 open txn ──► TxnBuffer (spills beyond spill_bytes)
        Stream Start/Stop/Commit/Abort streamed txns by top-level xid, interleaved
        DecodedRun                     into the open Begin txn (xid None) or the open
                                       stream block's txn (xid = its subtransaction)
        WholeTxns (single-node mode)   whole transactions, their lines written by the
                                       decoders: released as they are
        Message 'csn' (GTM mode)       committing / abort / tick ─► CsnOrderer
                                       commit / cid ─► the transaction they are in
        Keepalive                      tick (single-node mode) and confirmable LSN
                                       while no transaction is open

Pure logic: the only I/O is a large transaction's spill file (`sender.txnbuf`).
How far the slot may be confirmed is `sender.confirmable`'s bookkeeping; an open
transaction's state is `sender.opentxn`.

CSNs.  GTM mode: a transaction's CSN is its `commit <gid> <csn>` marker, applied
at its Commit / Stream Commit (the marker travels inside the transaction, so a
rolled-back one never counts).  Single-node mode: the CSN is the commit LSN.

Derived ticks (bounds the orderer may use besides explicit `tick` markers):

* GTM mode, every CSN read from a `committing` or `commit` marker: a writer
  logs `committing` on every node before it takes its commit CSN from the GTM,
  so a transaction that is not committing on this node yet at this point of
  the stream will take a CSN larger than any CSN already handed out.
* single-node mode, each commit's end LSN and an idle keepalive's WAL end: the
  next commit record starts at or after them, so the tick is that LSN - 1
  (a tick promises later CSNs greater than it).

Empty transactions.  pgoutput skips transactions without changes, but one
holding only logical messages still arrives, and so does one whose changes
were all rolled back to savepoints.  Without changes and without a commit
marker there is nothing to deliver and nothing to order: it is skipped
silently (in both modes) -- unless, in single-node mode, it carries an
incremental snapshot's high watermark (a `csnd.snapshot` message), to which
the service attaches the chunk's rows (`csnd.snapshot.watermark`).  A GTM transaction *with* a commit marker is always
released, even with no changes -- a distributed transaction's coordinator
needs every node's part (its xid and commit LSN) to assemble it.

Starting mid-stream (GTM mode, `start_token`).  A live slot's stream starts
somewhere in the node's history, and a transaction that logged `committing`
before that point but commits after it arrives without its marker: nothing
would hold larger CSNs back for it.  Such a sender starts settling
(`sender.ordering`): it releases nothing and promises no watermark until the
`csnd.start <token>` message of its own start arrives, which
`csnd.reader.settle` writes once every transaction that could have logged
`committing` before the start has ended -- so each of their commits (or
rollbacks) lies before that message.  What came meanwhile is then released in
CSN order.  An `abort` marker for a gid never seen committing is accepted
from such a stream: a writer logs it after its rollback, so it may come
after the start message.

Relation versions: `sender.relations`.  Who is released when, and how far
the slot may be confirmed: `sender.release`.  The markers: `sender.markers`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn, cast

from csnd.core.errors import (
    ConfigError,
    CsndError,
    InternalError,
    LsnOrderViolation,
    MessageOutOfPlace,
)
from csnd.core.ids import Csn, Lsn, Xid, lsn_to_str
from csnd.core.modes import MODES
from csnd.decoder.change import DecodedChange, DecodedItem, DecodedRun, PassThroughItem, WholeTxn, WholeTxns
from csnd.reader.pgoutput import (
    Begin,
    Commit,
    Keepalive,
    LogicalMessage,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    TypeMsg,
    scanned_txn_frames,
)
from csnd.sender.markers import MarkerReader
from csnd.sender.opentxn import OpenTxn, open_at_end, position_error
from csnd.sender.ordering import CsnOrderer
from csnd.sender.positions import all_in_place
from csnd.sender.positions import lsns_sorted as _sorted
from csnd.sender.relations import RelationVersions
from csnd.sender.release import Key, Releaser
from csnd.sender.txn import FinishedTxn
from csnd.sender.txnbuf import SPILL_BYTES, TxnBuffer


@dataclass(frozen=True, slots=True)
class NodeSenderStatistics:
    """A snapshot of one node sender, for metrics and the dashboard."""

    node: str
    open_txns: int  # begun or streaming, not yet committed / aborted
    committing: int  # committing markers without commit / abort yet
    waiting: int  # committed, held back by a smaller committing CSN
    released: int
    skipped_empty: int
    dropped_resumed: int
    spilled_txns: int
    spilled_bytes: int
    buffered_bytes: int  # estimated memory of the open transactions' changes
    watermark: Csn | None
    confirmable_lsn: Lsn


class NodeSender:
    """Consumes one node's stream in order and releases its transactions in CSN order.

    This class is the intake: it follows the stream's structure (which
    transaction is open, where each change belongs, positions that only go
    forward) and hands each committed transaction to its `Releaser`
    (`sender.release`), which decides when it goes; logical messages go to
    its `MarkerReader` (`sender.markers`), Type and Relation messages to its
    `RelationVersions` (`sender.relations`).

    `resume_csn`: the stream was restarted from a confirmed position and every
    transaction of this node with CSN `<= resume_csn` is already durable
    downstream.  Those are re-sent by the server; they are dropped here (their
    `committing` entries stop holding others back), and an `abort` marker for
    a gid never seen is accepted, because its `committing` may lie before the
    restart position.

    `start_token` (GTM mode): the stream starts mid-way, at a slot's position;
    release nothing until the non-transactional `csnd.start` message with
    this content arrives (see "Starting mid-stream" in the module docstring).
    """

    def __init__(
        self,
        node: str,
        mode: str,
        spill_bytes: int = SPILL_BYTES,
        spill_dir: str | None = None,
        resume_csn: Csn | None = None,
        start_token: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"unknown csn mode {mode!r}; expected 'gtm' or 'single'", node=node)
        if start_token is not None and mode != "gtm":
            raise ConfigError(
                "a start token is for a gtm-mode stream (single mode has no markers)", node=node
            )
        self.node = node
        self.mode = mode
        self.spill_bytes = spill_bytes
        self.spill_dir = spill_dir
        self.resume_csn = resume_csn
        self._gtm = mode == "gtm"
        self.start_token = start_token
        self._relations = RelationVersions()
        self._release = Releaser(node, self._gtm, resume_csn, start_token is not None, self._relations)
        self._markers = MarkerReader(node, self._gtm, self._release, start_token, resume_csn is not None)
        self._cur: OpenTxn | None = None  # non-streamed txn between Begin and Commit
        self._streams: dict[int, OpenTxn] = {}  # streamed txns by top-level xid
        self._block: OpenTxn | None = None  # txn of the open stream block
        self._last_lsn = Lsn(0)
        # An error of a transaction in a run, after others of the run were released: raised
        # by the next call, so those go on first, as when each was fed apart (`_wholes`).
        self._deferred: CsndError | None = None

    # --- the stream -----------------------------------------------------------------

    def feed(self, lsn: Lsn, item: DecodedItem) -> list[FinishedTxn]:
        """Take the next stream item; returns the transactions it released, in CSN order."""
        if self._deferred is not None:
            self._raise_deferred()
        if type(item) is WholeTxns:  # a lone node's hot path: whole transactions, their lines written
            return self._wholes(item)
        if type(item) is DecodedRun:  # the hot path: runs of changes between other events
            sub = item.xid
            txn = self._cur if sub is None else self._block
            if txn is None:
                if item.lsns:
                    raise self._stray_change(lsn, item.changes()[0])
                return []
            lsns = item.lsns
            if lsns:
                # Positions go forward inside a transaction and stay at or before its commit
                # (equal ones are fine: one multi-insert gives several rows one LSN).
                last = lsns[-1]
                if lsns[0] < txn.last_lsn or last > txn.bound or not _sorted(lsns):
                    raise position_error(self.node, txn, lsns, sub)
                txn.last_lsn = last
            txn.buf.extend(txn.cid, sub, lsns, item.bodies)
            return []
        if lsn:
            self._last_lsn = lsn
        handler = _HANDLERS.get(item.__class__)
        if handler is None:
            raise InternalError(
                f"unexpected {type(item).__name__} in the sender's input; it takes pgoutput messages "
                "and decoded changes",
                node=self.node,
                lsn=lsn or None,
            )
        return handler(self, lsn, item)

    def _begin(self, lsn: Lsn, m: Begin) -> list[FinishedTxn]:
        if self._cur is not None or self._block is not None:
            other = self._cur or self._block
            assert other is not None
            raise MessageOutOfPlace(
                f"Begin of transaction {m.xid} inside transaction {other.xid} (begun at "
                f"{lsn_to_str(other.first_lsn)}), which never ended; the stream is corrupt",
                node=self.node,
                lsn=lsn,
                xid=m.xid,
            )
        self._cur = OpenTxn(m.xid, self._new_buf(m.xid), lsn, m.final_lsn)
        return []

    def _commit(self, lsn: Lsn, m: Commit) -> list[FinishedTxn]:
        txn = self._cur
        if txn is None:
            raise MessageOutOfPlace(
                f"Commit (commit lsn {lsn_to_str(m.commit_lsn)}) without a Begin; the stream is corrupt "
                "or starts mid-transaction",
                node=self.node,
                lsn=lsn or m.end_lsn,
            )
        self._cur = None
        if txn.final_lsn != m.commit_lsn:
            txn.buf.close()
            raise LsnOrderViolation(
                f"transaction {txn.xid} commits at {lsn_to_str(m.commit_lsn)} but its Begin announced "
                f"{lsn_to_str(txn.final_lsn or 0)}; the stream is spliced or corrupt",
                node=self.node,
                lsn=m.commit_lsn,
                xid=txn.xid,
            )
        return self._release.finish(txn, m.commit_lsn, m.end_lsn, m.commit_time)

    def _wholes(self, run: WholeTxns) -> list[FinishedTxn]:
        """Whole transactions with their lines written (single-node mode): released as one if they may be, else one by one.

        The common case takes `Releaser.together`'s one pass (with nothing
        open); anything else takes `_whole` for each, which also reports
        errors.  An error after some were released is raised by the next
        call, so those go on first, as when each was fed apart.
        """
        if not self._gtm and self._cur is None and self._block is None:
            together = self._release.together(run)
            if together is not None:
                last_at = run.txns[-1].commit_at
                if last_at:
                    self._last_lsn = last_at
                return [together]
        out: list[FinishedTxn] = []
        for w, line in zip(run.txns, run.lines, strict=True):
            try:
                out += self._whole(w, line)
            except CsndError as e:
                if not out:
                    raise
                self._deferred = e
                break
        return out

    def _whole(self, w: WholeTxn, line: str) -> list[FinishedTxn]:
        """A whole transaction with its line written (single-node mode): `_begin`, the changes and `_commit` in one.

        The same checks, without a buffer: it holds no changes, only the
        worker's line (`FinishedTxn.written`).
        """
        lsns = cast("list[Lsn]", w.lsns)  # (never None in a WholeTxn)
        if self._gtm:
            raise InternalError(
                "a whole transaction's line reached a gtm-mode sender; its csn comes from a marker",
                node=self.node,
                lsn=w.commit_lsn,
                xid=w.xid,
            )
        if self._cur is not None or self._block is not None or not all_in_place([w], [w.commit_lsn], [lsns]):
            self._whole_refused(w, lsns)
        if w.commit_at:
            self._last_lsn = w.commit_at
        return self._release.whole(w, lsns, line)

    def _whole_refused(self, w: WholeTxn, lsns: list[Lsn]) -> NoReturn:
        """A whole transaction that failed a check: its error, as the message-by-message path finds it."""
        txn_frames = scanned_txn_frames(w)
        self._begin(txn_frames.begin_at, txn_frames.begin)
        txn = self._cur
        assert txn is not None
        if lsns[-1] > txn.bound or not _sorted(lsns):
            txn.buf.close()
            self._cur = None
            raise position_error(self.node, txn, lsns, None)
        self._commit(txn_frames.commit_at, txn_frames.commit)
        raise InternalError("a whole transaction failed a check and passed it again", node=self.node)

    def _stream_start(self, lsn: Lsn, m: StreamStart) -> list[FinishedTxn]:
        if self._cur is not None or self._block is not None:
            other = self._cur or self._block
            assert other is not None
            raise MessageOutOfPlace(
                f"Stream Start of transaction {m.xid} inside transaction {other.xid}; the stream is corrupt",
                node=self.node,
                lsn=lsn or None,
                xid=m.xid,
            )
        txn = self._streams.get(m.xid)
        if txn is None:
            if not m.first_segment:
                raise MessageOutOfPlace(
                    f"stream block continues transaction {m.xid}, whose first block was never seen; "
                    "its earlier changes are missing",
                    node=self.node,
                    lsn=lsn or None,
                    xid=m.xid,
                )
            txn = self._streams[m.xid] = OpenTxn(m.xid, self._new_buf(m.xid), lsn, None)
        elif m.first_segment:
            raise MessageOutOfPlace(
                f"first stream block of transaction {m.xid}, which is already streaming since "
                f"{lsn_to_str(txn.first_lsn)}",
                node=self.node,
                lsn=lsn or None,
                xid=m.xid,
            )
        self._block = txn
        return []

    def _stream_stop(self, lsn: Lsn, m: StreamStop) -> list[FinishedTxn]:
        if self._block is None:
            raise MessageOutOfPlace("Stream Stop without a Stream Start", node=self.node, lsn=lsn or None)
        self._block = None
        return []

    def _stream_commit(self, lsn: Lsn, m: StreamCommit) -> list[FinishedTxn]:
        self._no_block("Stream Commit", m.xid, lsn)
        txn = self._streams.pop(m.xid, None)
        if txn is None:
            raise MessageOutOfPlace(
                f"Stream Commit of transaction {m.xid}, which never streamed; its changes are missing",
                node=self.node,
                lsn=m.commit_lsn,
                xid=m.xid,
            )
        if txn.last_lsn > m.commit_lsn:  # (a non-streamed transaction's bound is checked per change)
            txn.buf.close()
            txn.bound = m.commit_lsn
            raise position_error(self.node, txn, [txn.last_lsn], None)
        return self._release.finish(txn, m.commit_lsn, m.end_lsn, m.commit_time)

    def _stream_abort(self, lsn: Lsn, m: StreamAbort) -> list[FinishedTxn]:
        self._no_block("Stream Abort", m.xid, lsn)
        txn = self._streams.get(m.xid)
        if txn is None:
            return []  # nothing of it was seen, nothing to drop
        if m.subxid == m.xid:
            del self._streams[m.xid]
            txn.buf.close()
            return []
        txn.buf.abort_subxact(m.subxid)
        if txn.marker_sub == m.subxid:  # the commit marker was rolled back with its savepoint
            txn.gid, txn.csn, txn.marker_sub = None, Csn(0), None
        return []

    def _keepalive(self, lsn: Lsn, m: Keepalive) -> list[FinishedTxn]:
        # Only while no transaction is open: a keepalive sent while a transaction's
        # output is under way may carry a WAL end beyond that transaction's commit.
        if self._cur is None and self._block is None and not self._streams:
            self._release.idle(m.wal_end)
        return []

    def _ignore(self, lsn: Lsn, m: Origin) -> list[FinishedTxn]:
        return []

    def _type(self, lsn: Lsn, m: TypeMsg) -> list[FinishedTxn]:
        self._relations.type_message(m)
        return []

    def _relation(self, lsn: Lsn, m: Relation) -> list[FinishedTxn]:
        self._relations.relation_message(m, self._release.finished)
        return []

    def _message(self, lsn: Lsn, m: LogicalMessage) -> list[FinishedTxn]:
        return self._markers.message(lsn, m, self._block if self._block is not None else self._cur)

    # --- state ----------------------------------------------------------------------------

    @property
    def watermark(self) -> Csn | None:
        """Largest CSN `w` such that no transaction with CSN `<= w` can still be released; None: unknown.

        Never decreases.  Unknown until the first tick (explicit, or derived as
        described in the module docstring): before it nothing bounds the CSN
        of a transaction that has logged nothing yet.
        """
        return self._release.orderer.watermark

    @property
    def confirmable_lsn(self) -> Lsn:
        """The LSN this node's slot may be confirmed to once everything released so far is durable.

        The largest `L` (0: none yet) such that a restart from `L` loses
        nothing and breaks no ordering (`sender.confirmable` says how).  It never
        decreases.  The caller confirms it only after every transaction
        released before it read this value is durable (and should restart
        with `resume_csn` = the last durable CSN).
        """
        return self._release.confirm.value

    @property
    def orderer(self) -> CsnOrderer[Key]:
        return self._release.orderer

    def statistics(self) -> NodeSenderStatistics:
        open_txns = list(self._streams.values())
        if self._cur is not None:
            open_txns.append(self._cur)
        release = self._release
        return NodeSenderStatistics(
            node=self.node,
            open_txns=len(open_txns),
            committing=release.orderer.n_committing,
            waiting=release.orderer.n_waiting,
            released=release.released,
            skipped_empty=release.skipped_empty,
            dropped_resumed=release.dropped_resumed,
            spilled_txns=release.spilled_txns,
            spilled_bytes=release.spilled_bytes,
            buffered_bytes=sum(t.buf.mem_bytes for t in open_txns),
            watermark=self.watermark,
            confirmable_lsn=release.confirm.value,
        )

    def _raise_deferred(self) -> None:
        e, self._deferred = self._deferred, None
        assert e is not None
        raise e

    def finish(self) -> None:
        """The stream ended: it must not end inside a transaction or with one still committing."""
        if self._deferred is not None:
            self._raise_deferred()
        err = open_at_end(self.node, self._last_lsn, self._cur, self._block, self._streams)
        if err is not None:
            raise err
        self._release.check_end(self._last_lsn, self.start_token)

    def close(self) -> None:
        """Discard every open transaction and free spill files (error paths, shutdown)."""
        if self._cur is not None:
            self._cur.buf.close()
            self._cur = None
        for t in self._streams.values():
            t.buf.close()
        self._streams.clear()
        self._block = None
        self._release.ready.clear()

    # --- helpers ------------------------------------------------------------------------

    def _new_buf(self, xid: Xid) -> TxnBuffer:
        return TxnBuffer(self.node, xid, self.spill_bytes, self.spill_dir)

    def _no_block(self, what: str, xid: Xid, lsn: Lsn) -> None:
        if self._block is not None:
            raise MessageOutOfPlace(
                f"{what} of transaction {xid} inside the open stream block of transaction "
                f"{self._block.xid}; the stream is corrupt",
                node=self.node,
                lsn=lsn or None,
                xid=xid,
            )

    def _stray_change(self, lsn: Lsn, ch: DecodedChange) -> MessageOutOfPlace:
        if ch.xid is None:
            where = (
                f"inside the stream block of transaction {self._block.xid} without a subtransaction xid"
                if self._block is not None
                else "outside any transaction"
            )
        else:
            where = f"of subtransaction {ch.xid} outside any stream block"
        return MessageOutOfPlace(
            f"{ch.op} change at {lsn_to_str(ch.lsn)} {where}; the stream is corrupt or truncated at its start",
            node=self.node,
            lsn=ch.lsn or lsn or None,
            xid=ch.xid,
        )

    def _check(self) -> None:
        """Assert every invariant of the sender's bookkeeping (tests call it after each step)."""
        self._release._check()
        if self._block is not None:
            assert self._block is self._streams.get(self._block.xid)
        assert self._cur is None or self._block is None


# What `feed` does with each `PassThroughItem`.  A handler takes the message of its
# key's class (Any: a dict's value type cannot depend on the key).
_HANDLERS: Final[dict[type[PassThroughItem], Callable[[NodeSender, Lsn, Any], list[FinishedTxn]]]] = {
    Begin: NodeSender._begin,
    Commit: NodeSender._commit,
    StreamStart: NodeSender._stream_start,
    StreamStop: NodeSender._stream_stop,
    StreamCommit: NodeSender._stream_commit,
    StreamAbort: NodeSender._stream_abort,
    LogicalMessage: NodeSender._message,
    Keepalive: NodeSender._keepalive,
    Relation: NodeSender._relation,
    TypeMsg: NodeSender._type,
    Origin: NodeSender._ignore,
}
