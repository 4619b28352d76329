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

Relation versions.  Each Relation message whose rendering (`decoder.schema`,
names from the Type messages before it) differs from the table's last one
is a new version, first in force with the first transaction *released*
among those that finish after it arrived: every change of the table after
the message in the stream is of that version, and of those transactions the
first released has the smallest CSN (release is in CSN order), while one
that finished before the message -- released later or not -- wrote none of
the new version.  A transaction skipped, dropped as already durable, or
aborted passes the version on to the next one released.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter, eq, itemgetter, le
from typing import Any, Final, NoReturn, cast

from csnd.core.errors import (
    ConfigError,
    CsndError,
    InternalError,
    LsnOrderViolation,
    MarkerError,
    MessageOutOfPlace,
    ProtocolError,
    TruncatedStream,
)
from csnd.core.ids import Csn, Lsn, Xid, lsn_to_str
from csnd.core.markers import PREFIX as MARKER_PREFIX
from csnd.core.markers import (
    START_PREFIX,
    TRANSACTIONAL,
    WATERMARK_PREFIX,
    Marker,
    check_transactional,
    parse_fields,
)
from csnd.core.modes import MODES
from csnd.decoder.change import DecodedChange, DecodedItem, DecodedRun, PassThroughItem, WholeTxn, WholeTxns
from csnd.decoder.schema import relation_body
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
from csnd.sender.confirmable import ConfirmableLsn
from csnd.sender.opentxn import OpenTxn, open_at_end, position_error
from csnd.sender.ordering import CsnOrderer
from csnd.sender.txn import FinishedTxn, WrittenLines
from csnd.sender.txnbuf import SPILL_BYTES, TxnBuffer

Key = str | int  # gid in GTM mode, top-level xid in single-node mode

# Single-node mode's CSN is an LSN.  `int` itself, typed: `Csn(lsn)` would add a
# Python-level call per transaction for what is the same number.
_as_csn: Final[Callable[[int], Csn]] = int  # type: ignore[assignment]


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
        self._start_content = None if start_token is None else start_token.encode("ascii")
        self._orderer: CsnOrderer[Key] = CsnOrderer(node, settling=start_token is not None)
        self._cur: OpenTxn | None = None  # non-streamed txn between Begin and Commit
        self._streams: dict[int, OpenTxn] = {}  # streamed txns by top-level xid
        self._block: OpenTxn | None = None  # txn of the open stream block
        self._ready: dict[Key, FinishedTxn] = {}  # committed, waiting in the orderer
        self._confirm = ConfirmableLsn()
        self._last_lsn = Lsn(0)
        self._type_names: dict[int, tuple[str, str]] = {}  # Type messages: oid -> (namespace, name)
        self._relation_bodies: dict[int, str] = {}  # relid -> its latest version's body
        # New versions not yet given to a released transaction: (the finish count when
        # they arrived, body); a transaction released with a `seq` at or past it takes them.
        self._new_relations: list[tuple[int, str]] = []
        self._finished = 0  # transactions finished so far (their `seq`)
        # An error of a transaction in a run, after others of the run were released: raised
        # by the next call, so those go on first, as when each was fed apart (`_wholes`).
        self._deferred: CsndError | None = None
        # statistics
        self.released = 0
        self.skipped_empty = 0
        self.dropped_resumed = 0
        self.spilled_txns = 0
        self.spilled_bytes = 0

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
        return self._finish_txn(txn, m.commit_lsn, m.end_lsn, m.commit_time)

    def _wholes(self, run: WholeTxns) -> list[FinishedTxn]:
        """Whole transactions with their lines written (single-node mode): released as one if they may be, else one by one.

        The common case takes `_released_together`'s one pass; anything else
        takes `_whole` for each, which also reports errors.  An error after
        some were released is raised by the next call, so those go on first,
        as when each was fed apart.
        """
        together = self._released_together(run)
        if together is not None:
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

    def _released_together(self, run: WholeTxns) -> FinishedTxn | None:
        """All of `run` released as one `FinishedTxn` carrying their lines, or None (nothing changed) if they may not be.

        They may when nothing is open, nothing waits, no relation versions
        are to attach and no restart is to skip past, and their positions
        are as their Begins and Commits say: then one pass of checks and one
        call of the orderer release them all (`FinishedTxn.written`).
        """
        txns = run.txns
        if (
            self._gtm
            or self._cur is not None
            or self._block is not None
            or self._new_relations
            or self._ready
        ):
            return None
        commit_lsns: list[Lsn] = list(map(_commit_lsn_of, txns))
        lsns_each: list[list[Lsn]] = list(map(_lsns_of, txns))
        if not _all_in_place(txns, commit_lsns, lsns_each):
            return None
        csns = cast("list[Csn]", commit_lsns)  # (single-node mode: the commit LSN is the CSN)
        ticks = cast("list[Csn]", [end - 1 for end in map(_end_lsn_of, txns)])
        resume = self.resume_csn
        if (resume is not None and csns[0] <= resume) or not self._orderer.commit_run(csns, ticks):
            return None  # (a restart's re-sent ones are dropped one by one)
        n = len(txns)
        last = txns[-1]
        if last.commit_at:
            self._last_lsn = last.commit_at
        self._finished += n
        xids: list[Xid] = list(map(_xid_of, txns))
        finished = FinishedTxn(
            self.node,
            csns[-1],
            None,
            xids[-1],
            last.commit_lsn,
            last.end_lsn,
            last.commit_time,
            (),
            sum(map(len, lsns_each)),
        )
        finished.written = WrittenLines(csns, xids, commit_lsns, run.lines)
        finished.seq = self._finished - 1
        confirm = self._confirm
        confirm.passed(last.end_lsn)
        finished.confirmable = confirm.value
        self.released += n
        return finished

    def _whole(self, w: WholeTxn, line: str) -> list[FinishedTxn]:
        """A whole transaction with its line written (single-node mode): `_begin`, the changes and `_commit` in one.

        The same checks, without a buffer: it holds no changes, only the
        worker's line (`FinishedTxn.written`).
        """
        xid, commit_lsn, end_lsn = w.xid, w.commit_lsn, w.end_lsn
        lsns = cast("list[Lsn]", w.lsns)  # (never None in a WholeTxn)
        if self._gtm:
            raise InternalError(
                "a whole transaction's line reached a gtm-mode sender; its csn comes from a marker",
                node=self.node,
                lsn=commit_lsn,
                xid=xid,
            )
        if self._cur is not None or self._block is not None or not _all_in_place([w], [commit_lsn], [lsns]):
            self._whole_refused(w, lsns)
        if w.commit_at:
            self._last_lsn = w.commit_at
        seq = self._finished
        self._finished = seq + 1
        csn = _as_csn(commit_lsn)
        if self.resume_csn is not None and csn <= self.resume_csn:
            self.dropped_resumed += 1
            self._confirm.passed(end_lsn)
            return []
        released = self._orderer.commit(xid, csn, lsn=commit_lsn, xid=xid, tick=_as_csn(end_lsn - 1))
        finished = FinishedTxn(self.node, csn, None, xid, commit_lsn, end_lsn, w.commit_time, (), len(lsns))
        finished.written = WrittenLines([csn], [xid], [commit_lsn], [line])
        finished.seq = seq
        return self._release(xid, None, finished, released)

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
        return self._finish_txn(txn, m.commit_lsn, m.end_lsn, m.commit_time)

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
            self._confirm.passed(m.wal_end)
            if not self._gtm:
                # (single-node mode: CSNs are commit LSNs, and the next commit may start at the WAL end)
                self._orderer.tick(_as_csn(m.wal_end - 1))
        return []

    def _ignore(self, lsn: Lsn, m: Origin) -> list[FinishedTxn]:
        return []

    def _type(self, lsn: Lsn, m: TypeMsg) -> list[FinishedTxn]:
        self._type_names[m.type_oid] = (m.namespace, m.name)
        return []

    def _relation(self, lsn: Lsn, m: Relation) -> list[FinishedTxn]:
        body = relation_body(m, self._type_names)
        if self._relation_bodies.get(m.relid) != body:  # (pgoutput sends it again unchanged, often)
            self._relation_bodies[m.relid] = body
            self._new_relations.append((self._finished, body))
        return []

    def _with_relations(self, txn: FinishedTxn) -> None:
        """Give the released `txn` the new relation versions it is the first to be released with."""
        new = self._new_relations
        n = 0
        while n < len(new) and new[n][0] <= txn.seq:
            n += 1
        if n:
            txn.relations = tuple(body for _, body in new[:n])
            del new[:n]

    # --- csn markers -------------------------------------------------------------------

    def _message(self, lsn: Lsn, m: LogicalMessage) -> list[FinishedTxn]:
        if m.prefix != MARKER_PREFIX:
            if m.prefix == START_PREFIX:
                return self._start_message(m)
            if m.prefix == WATERMARK_PREFIX and m.transactional:
                txn = self._block if self._block is not None else self._cur
                if txn is not None:
                    txn.watermark = True
            return []
        if not self._gtm:
            txn = self._block or self._cur
            raise MarkerError(
                f"csn marker {m.content[:80]!r}"
                + (f" in transaction {txn.xid}" if txn is not None else "")
                + " on a node in single-node mode; markers mean a gtm cluster: "
                "run this node in gtm mode (stream header / --mode)",
                node=self.node,
                lsn=m.lsn or lsn or None,
                xid=txn.xid if txn is not None else m.xid,
            )
        where = m.lsn or lsn
        kind, gid, value = parse_fields(m.content, self.node, where or None, m.xid)
        if m.transactional is not TRANSACTIONAL[kind]:
            check_transactional(
                Marker(kind, gid, value), m.transactional, node=self.node, lsn=where or None, xid=m.xid
            )
        if kind == "committing":
            assert gid is not None and value is not None
            self._orderer.committing(gid, value, lsn=where)
            self._confirm.committing(gid, where)
            self._orderer.tick(value)
            return []
        if kind == "abort":
            assert gid is not None
            if (
                self.resume_csn is not None or self.start_token is not None
            ) and not self._orderer.is_committing(gid):
                return []  # (its `committing` lay before the stream's start)
            self._confirm.resolved(gid)
            return self._take(self._orderer.abort(gid, lsn=where))
        if kind == "tick":
            assert value is not None
            self._orderer.tick(value)
            return []
        txn = self._block if self._block is not None else self._cur
        if txn is None:
            raise MarkerError(
                f"transactional csn marker {m.content.decode('ascii', 'replace')!r} outside any "
                "transaction; the stream is corrupt",
                node=self.node,
                lsn=where or None,
                xid=m.xid,
            )
        assert value is not None
        if kind == "cid":
            if value < txn.cid:
                raise MarkerError(
                    f"cid marker {value} after cid {txn.cid} in transaction {txn.xid}; command ids "
                    "never decrease within a transaction",
                    node=self.node,
                    lsn=where or None,
                    xid=txn.xid,
                )
            txn.cid = value
            return []
        # commit
        assert gid is not None
        if txn.gid is not None:
            raise MarkerError(
                f"second commit marker in transaction {txn.xid}: 'commit {gid} {value}' after "
                f"'commit {txn.gid} {txn.csn}'; a local transaction belongs to one global transaction",
                node=self.node,
                lsn=where or None,
                xid=txn.xid,
            )
        txn.gid, txn.csn, txn.marker_sub = gid, value, m.xid
        return []

    def _start_message(self, m: LogicalMessage) -> list[FinishedTxn]:
        """A `csnd.start` message: this stream's own (its token) settles it; another start's is nothing."""
        if self._orderer.settling and not m.transactional and m.content == self._start_content:
            return self._take(self._orderer.settle())
        return []

    # --- commit and release --------------------------------------------------------------

    def _finish_txn(self, txn: OpenTxn, commit_lsn: Lsn, end_lsn: Lsn, commit_time: int) -> list[FinishedTxn]:
        buf = txn.buf
        orderer = self._orderer
        gid = txn.gid
        seq = self._finished
        self._finished = seq + 1
        if self._gtm:
            if gid is None:
                if buf.n_changes:
                    n = buf.n_changes
                    buf.close()
                    raise MarkerError(
                        f"transaction {txn.xid} committed at {lsn_to_str(commit_lsn)} with {n} changes but "
                        "no commit marker; in gtm mode every writing transaction must log "
                        "'commit <gid> <csn>' (transactional) before it commits",
                        node=self.node,
                        lsn=commit_lsn,
                        xid=txn.xid,
                    )
                return self._skip(buf, end_lsn)
            key: Key = gid
            csn = txn.csn
        else:
            if not buf.n_changes and not txn.watermark:
                return self._skip(buf, end_lsn)
            key = txn.xid
            csn = _as_csn(commit_lsn)  # single-node mode: the commit LSN is the CSN
        if self.resume_csn is not None and csn <= self.resume_csn:
            self.dropped_resumed += 1
            released: list[Key] = []
            if gid is not None and orderer.is_committing(gid):
                self._confirm.resolved(gid)
                released = orderer.abort(gid, lsn=commit_lsn)
            buf.close()
            self._confirm.passed(end_lsn)
            return self._take(released)
        try:
            # A commit ticks: every later transaction gets a larger CSN (gtm) or commits later (single).
            released = orderer.commit(
                key, csn, lsn=commit_lsn, xid=txn.xid, tick=csn if self._gtm else _as_csn(end_lsn - 1)
            )
        except ProtocolError:
            buf.close()
            raise
        if buf.spilled:
            self.spilled_txns += 1
            self.spilled_bytes += buf.spilled_bytes
        n = buf.n_changes
        finished = FinishedTxn(self.node, csn, gid, txn.xid, commit_lsn, end_lsn, commit_time, buf.drain(), n)
        finished.seq = seq
        return self._release(key, gid, finished, released)

    def _release(
        self, key: Key, gid: str | None, finished: FinishedTxn, released: list[Key]
    ) -> list[FinishedTxn]:
        """`finished` has committed and the orderer released `released` with it: hand them on."""
        # Released at once, the common case: no round trip through `_ready`
        # and the confirmable LSN's holds (`_take` would leave both as they
        # are now, and the confirmable LSN where `passed` puts it).
        confirm = self._confirm
        end_lsn = finished.end_lsn
        at_once = len(released) == 1 and released[0] == key
        if not at_once:
            self._ready[key] = finished
            confirm.hold(end_lsn)
        confirm.passed(end_lsn)
        if not at_once:
            return self._take(released)
        if gid is not None:
            confirm.resolved(gid)
        finished.confirmable = confirm.value
        if self._new_relations:
            self._with_relations(finished)
        self.released += 1
        return [finished]

    def _take(self, keys: list[Key]) -> list[FinishedTxn]:
        """Release the waiting transactions `keys`, in order, each with its own confirmable LSN.

        One event can release several (a commit that frees those waiting
        behind a committing marker, an abort).  The confirmable LSN after
        the group may lie past the commits of all of them, but the first may
        become durable alone -- the others can still sit in the merge behind
        another node -- so each carries the value as it stands once it, and
        only the ones before it, are released: the holds of the ones after
        it still cap it.
        """
        if not keys:
            return []
        out = []
        ready, confirm = self._ready, self._confirm
        for key in keys:
            txn = ready.pop(key)
            confirm.unhold(txn.end_lsn)
            if isinstance(key, str):
                confirm.resolved(key)
            confirm.update()
            txn.confirmable = confirm.value
            if self._new_relations:
                self._with_relations(txn)
            out.append(txn)
        self.released += len(out)
        return out

    def _skip(self, buf: TxnBuffer, end_lsn: Lsn) -> list[FinishedTxn]:
        buf.close()
        self.skipped_empty += 1
        self._confirm.passed(end_lsn)
        return []

    # --- state ----------------------------------------------------------------------------

    @property
    def watermark(self) -> Csn | None:
        """Largest CSN `w` such that no transaction with CSN `<= w` can still be released; None: unknown.

        Never decreases.  Unknown until the first tick (explicit, or derived as
        described in the module docstring): before it nothing bounds the CSN
        of a transaction that has logged nothing yet.
        """
        return self._orderer.watermark

    @property
    def confirmable_lsn(self) -> Lsn:
        """The LSN this node's slot may be confirmed to once everything released so far is durable.

        The largest `L` (0: none yet) such that a restart from `L` loses
        nothing and breaks no ordering (`sender.confirmable` says how).  It never
        decreases.  The caller confirms it only after every transaction
        released before it read this value is durable (and should restart
        with `resume_csn` = the last durable CSN).
        """
        return self._confirm.value

    @property
    def orderer(self) -> CsnOrderer[Key]:
        return self._orderer

    def statistics(self) -> NodeSenderStatistics:
        open_txns = list(self._streams.values())
        if self._cur is not None:
            open_txns.append(self._cur)
        return NodeSenderStatistics(
            node=self.node,
            open_txns=len(open_txns),
            committing=self._orderer.n_committing,
            waiting=self._orderer.n_waiting,
            released=self.released,
            skipped_empty=self.skipped_empty,
            dropped_resumed=self.dropped_resumed,
            spilled_txns=self.spilled_txns,
            spilled_bytes=self.spilled_bytes,
            buffered_bytes=sum(t.buf.mem_bytes for t in open_txns),
            watermark=self.watermark,
            confirmable_lsn=self._confirm.value,
        )

    def _raise_deferred(self) -> None:
        e, self._deferred = self._deferred, None
        assert e is not None
        raise e

    def finish(self) -> None:
        """The stream ended: it must not end inside a transaction or with one still committing."""
        if self._deferred is not None:
            self._raise_deferred()
        node = self.node
        err = open_at_end(node, self._last_lsn, self._cur, self._block, self._streams)
        if err is not None:
            raise err
        if self._orderer.settling and self._orderer.n_waiting:
            # (with nothing gathered, nothing is lost: the slot was confirmed no further, and
            # the next run's start is settled anew)
            held = self._orderer.waiting()
            raise TruncatedStream(
                f"stream ended at {lsn_to_str(self._last_lsn)} before its start was settled (the "
                f"csnd.start message {self.start_token} never came); {len(held)} committed transactions "
                f"wait unreleased (the first: global transaction {held[0][0]}, csn {held[0][1]})"
                ": a transaction committing since before the stream's start may be missing its "
                "committing marker, so nothing can be ordered yet; run again without --until-lsn, "
                "or with one past the start message",
                node=node,
                lsn=self._last_lsn or None,
            )
        open_ = self._orderer.open_committing()
        if open_:
            gid, csn = open_[0]
            marker_lsn = (self._confirm.marker_lsn(gid) if isinstance(gid, str) else None) or 0
            waiting = self._orderer.n_waiting
            raise TruncatedStream(
                f"stream ended with global transaction {gid} committing (committing csn {csn}, logged at "
                f"{lsn_to_str(marker_lsn)}) but neither committed nor aborted"
                + (f"; {len(open_) - 1} more committing" if len(open_) > 1 else "")
                + (f"; {waiting} committed transactions wait behind it, unreleased" if waiting else "")
                + "; the stream is truncated or the writer lost the transaction",
                node=node,
                lsn=marker_lsn or None,
            )
        assert not self._ready, "committed transactions left without a committing one to wait for"

    def close(self) -> None:
        """Discard every open transaction and free spill files (error paths, shutdown)."""
        if self._cur is not None:
            self._cur.buf.close()
            self._cur = None
        for t in self._streams.values():
            t.buf.close()
        self._streams.clear()
        self._block = None
        self._ready.clear()

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
        self._orderer._check()
        assert set(self._ready) == {k for k, _ in self._orderer.waiting()}
        committing = {k for k, _ in self._orderer.open_committing() if isinstance(k, str)}
        self._confirm._check(
            holding=[t.end_lsn for t in self._ready.values()],
            capping=committing | {k for k in self._ready if isinstance(k, str)},
        )
        if self._block is not None:
            assert self._block is self._streams.get(self._block.xid)
        assert self._cur is None or self._block is None


def _sorted(lsns: list[Lsn]) -> bool:
    """Positions that never go backwards (C-level and linear on a sorted list; a run of one skips it)."""
    return len(lsns) < 2 or sorted(lsns) == lsns


# A `WholeTxn`'s fields, for the C-level passes of `_released_together`.
_final_lsn_of: Final[Callable[[WholeTxn], Lsn]] = attrgetter("final_lsn")
_commit_lsn_of: Final[Callable[[WholeTxn], Lsn]] = attrgetter("commit_lsn")
_end_lsn_of: Final[Callable[[WholeTxn], Lsn]] = attrgetter("end_lsn")
_xid_of: Final[Callable[[WholeTxn], Xid]] = attrgetter("xid")
_lsns_of: Final[Callable[[WholeTxn], list[Lsn]]] = attrgetter("lsns")  # (never None in a WholeTxn)
_last_of: Final[Callable[[list[Lsn]], Lsn]] = itemgetter(-1)


def _all_in_place(txns: list[WholeTxn], commit_lsns: list[Lsn], lsns_each: list[list[Lsn]]) -> bool:
    """Whether whole transactions' positions are as their Begins and Commits say: each one's changes in order, none past its commit.

    `commit_lsns` and `lsns_each` are the transactions' own columns, which
    the caller has taken already.  (C-level passes: a Python call per
    transaction was a tenth of the sender's time on one-row transactions.)
    """
    return (
        all(map(eq, map(_final_lsn_of, txns), commit_lsns))  # (as their Begins announced)
        and all(map(le, map(_last_of, lsns_each), commit_lsns))  # (no change past its commit)
        and all(map(_sorted, [lsns for lsns in lsns_each if len(lsns) > 1]))
    )


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
