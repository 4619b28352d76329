"""The decoder pool's reader side: a node's events cut into batches, their changes to the workers.

    events ──► BatchFeed.run ──┬─► DecodeBatch to worker i mod N   (the batch's changes, `Wire` each)
                               ├─► ApplyMeta to every worker       (Relation, Type: a broadcast)
                               └─► CutBatch to the collector       (the skeleton: everything else,
                                                                    in stream order, a `RunSlot` or
                                                                    `WholesSlot` where changes stood)

It runs in the reader's thread (`DecoderPool` starts it), the one serial
step in front of the workers, so its loop does a few operations per event
and dispatches on one `type(msg)`.  What it shares between its steps -- the
batch being gathered, the run a change may join, a Begin whose transaction
may turn out whole -- is the state of a `BatchFeed`; where it puts its
output is the pool's (`FeedOutlet`), so this module holds the cutting alone.

A batch ends at `batch_changes` changes or `BATCH_BYTES` of raw change data,
at a Relation or Type message (broadcast after the cut, so every worker
takes it before any later change of that table), at a keepalive, when the
source says it is drained (`cut_drained`), and at the end.  A live node's
small batch, cut while the decoders are idle, is decoded here instead
(`decoder.inline`): it reaches the collector with its bodies, in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Protocol, TypeAlias, cast, final

from csnd.core.ids import Lsn, Xid
from csnd.decoder.change import PassThroughItem, WholeTxn
from csnd.decoder.messages import LINE, RUN, WHOLE, ApplyMeta, DecodeBatch, ToWorker, Wire, truncate_wire
from csnd.reader.events import Event
from csnd.reader.pgoutput import (
    Begin,
    Change,
    ChangeFrames,
    Commit,
    Keepalive,
    Relation,
    Truncate,
    TxnFrames,
    TxnRun,
    TypeMsg,
    scanned_txn,
    scanned_txn_frames,
)

# A batch ends at this many changes or this many bytes of raw change data,
# whichever comes first.  Bigger batches amortise pickling, pipe hand-offs
# and the collector's per-batch work (2048 against 512 cut the main
# process's CPU by about a tenth on the wide rows); the byte bound keeps a
# batch of wide TOASTed rows from holding hundreds of megabytes.
BATCH_CHANGES: Final = 2048
BATCH_BYTES: Final = 1 << 20
# A keepalive ends the batch being gathered only while fewer batches than this
# wait for their results: downstream is idle, a partial batch goes on at once.
KEEPALIVE_CUT_BELOW: Final = 2

_CONTROL_KINDS: Final = (Relation, TypeMsg)
_NO_RUN: Final = object()  # no run open: the next change starts one


class Stopped(Exception):
    """The pool is closing: the reader thread stops quietly."""


@final  # (the collector tests `type(msg) is RunSlot`: mypy then narrows both ways)
class RunSlot:
    """In a batch's skeleton: where a run of row changes of one (sub)xid stood, and their LSNs."""

    __slots__ = ("xid", "lsns")

    def __init__(self, xid: Xid | None) -> None:
        self.xid = xid
        self.lsns: list[Lsn] = []


@final
class WholesSlot:
    """In a batch's skeleton: consecutive whole transactions whose lines the workers write (`WholeTxn`)."""

    __slots__ = ("txns",)

    def __init__(self, txns: list[WholeTxn]) -> None:
        self.txns = txns


# An entry of a batch's skeleton: a run of row changes stands for them, a Truncate
# for its decoded tables; everything else goes on as it is.
SkeletonItem: TypeAlias = PassThroughItem | Truncate | RunSlot | WholesSlot


class CutBatch:
    """A cut of the event stream: its skeleton in order; its changes went to worker `worker` (-1: none).

    `decoded`: the bodies of its changes when they were decoded in the
    reader's thread (`decoder.inline`); then `worker` is -1 and no worker
    holds a result for it.
    """

    __slots__ = ("events", "worker", "n_changes", "decoded")

    def __init__(self) -> None:
        self.events: list[tuple[Lsn, SkeletonItem]] = []
        self.worker = -1
        self.n_changes = 0
        self.decoded: list[Any] | None = None


class FeedOutlet(Protocol):
    """Where a `BatchFeed` puts what it cut (`DecoderPool`): each put waits while its queue is full."""

    def put_work(self, worker: int, message: ToWorker) -> None:
        """To worker `worker`'s inbox; raises `Stopped` if the pool closes meanwhile."""

    def put_skeleton(self, batch: CutBatch) -> None:
        """To the collector, in stream order."""

    def batches_waiting(self) -> int:
        """Batches cut and not yet collected."""

    def batches_decoding(self) -> int:
        """Batches sent to the workers whose results the collector has not yet read."""

    def stopping(self) -> bool:
        """Whether the pool is closing."""


class HereDecoder(Protocol):
    """Decodes a small batch in the reader's thread (`decoder.inline.InlineDecoder`)."""

    def apply(self, meta: ApplyMeta) -> None:
        """A Relation or Type message, in stream order."""

    def decode(self, wires: list[Wire], n_changes: int) -> list[Any]:
        """The bodies a worker would have sent back for `wires`."""


class BatchFeed:
    """Cuts one node's events into batches for `workers` decoder processes (see the module docstring).

    `write_lines` (a lone node in single-node mode): a transaction whose
    Begin, row changes and Commit fall in one batch, nothing else between
    them, goes to a worker whole, which writes its line (`WholeTxn`).
    `gated`: the source reports its pauses (`cut_drained`), so a keepalive
    cuts only while the decoders are idle.  `here`: decodes a batch of at
    most `inline_changes` changes cut while no batch is with the
    workers, in this thread (a live node; None: every batch to a worker).
    """

    __slots__ = (
        "_out",
        "_workers",
        "_limit",
        "_write_lines",
        "_gated",
        "_rotation",
        "_batch",
        "_wires",
        "_keep",
        "_wire",
        "_pending",
        "_pending_bytes",
        "_run_xid",
        "_run_lsns",
        "_whole_at",
        "_whole_pending",
        "_here",
        "_here_limit",
    )

    def __init__(
        self,
        out: FeedOutlet,
        workers: int,
        batch_changes: int,
        write_lines: bool,
        gated: bool,
        here: HereDecoder | None = None,
        inline_changes: int = 0,
    ) -> None:
        self._out = out
        self._workers = workers
        self._limit = batch_changes
        self._write_lines = write_lines
        self._gated = gated
        self._rotation = 0  # the worker the next batch's changes go to
        self._batch = CutBatch()
        self._wires: list[Wire] = []  # the batch's changes
        self._keep = self._batch.events.append  # (rebound at each cut, as `_wire`)
        self._wire = self._wires.append
        self._pending = 0  # row changes (and truncates) in `_wires`
        self._pending_bytes = 0  # their raw data
        self._run_xid: object = _NO_RUN  # xid of the run the next change may join
        self._run_lsns: list[Lsn] = []  # the open run's (none yet)
        # Where the open Begin stands in the batch's skeleton while everything after
        # it is row changes of its own (-1: no such Begin), and how many changes the
        # batch held before it.
        self._whole_at = -1
        self._whole_pending = 0
        self._here = here
        self._here_limit = inline_changes

    def run(self, events: Iterable[Event]) -> None:
        """Feed every event of `events`, then cut the last batch.

        `event` is Any: the loop picks each event's branch by one `type(msg)` kept in
        `cls`, which mypy cannot follow (it narrows only on `type(msg)`
        written out in each test, a call each on the hot path).
        """
        limit = self._limit
        write_lines = self._write_lines
        stopping = self._out.stopping
        cut = self.cut
        whole_txn = self._whole_txn
        event: Any
        for event in events:
            msg = event[1]
            cls = type(msg)
            if cls is TxnRun:  # a live node's whole transactions, as its compiled loop read them
                self._run_xid, self._whole_at = _NO_RUN, -1
                if write_lines:
                    self._scanned_wholes(msg)
                else:
                    for txn in msg.frames():
                        whole_txn(txn)
                if self._pending >= limit or self._pending_bytes >= BATCH_BYTES:
                    cut()
                continue
            if cls is ChangeFrames or cls is Change:  # the hot path: nearly every event of a busy node
                lsn = event[0]
                xid = msg.xid
                if xid is not None:
                    self._whole_at = -1
                if xid != self._run_xid:
                    run = RunSlot(xid)
                    self._keep((lsn, run))
                    self._run_lsns = run.lsns
                    self._run_xid = xid
                if cls is ChangeFrames:
                    self._run_lsns += msg.lsns
                    self._wire((lsn, RUN, xid, (msg.in_stream, msg.head), msg.blob))
                    self._pending += len(msg.lsns)
                    self._pending_bytes += len(msg.blob)
                else:
                    self._run_lsns.append(lsn)
                    self._wire((lsn, msg.kind, xid, msg.relid, msg.data))
                    self._pending += 1
                    self._pending_bytes += len(msg.data)
                if self._pending >= limit or self._pending_bytes >= BATCH_BYTES:
                    cut()
                continue
            self._run_xid = _NO_RUN
            if cls is Commit and self._whole_at >= 0 and self._pending > self._whole_pending:
                self._whole_commit(event[0], msg)
                continue
            self._whole_at = -1
            if cls is Begin or cls is Commit:  # the next most common: straight into the skeleton
                self._keep(event)
                if cls is Begin and write_lines:
                    self._whole_at, self._whole_pending = len(self._batch.events) - 1, self._pending
                continue
            if stopping():
                break
            self._other(event[0], msg)
        cut()

    def cut(self) -> None:
        """Hand on the batch being gathered: its changes to the next worker, its skeleton to the collector."""
        out = self._out
        if self._wires:
            self._batch.n_changes = self._pending
            here = self._here
            # Small, and the workers idle: live, one or a few transactions, cheaper
            # decoded here than sent round a worker.  (Not "no batch waiting": a
            # keepalive's skeleton not yet collected would send half of them round.)
            if here is not None and self._pending <= self._here_limit and out.batches_decoding() == 0:
                self._batch.decoded = here.decode(self._wires, self._pending)
            else:
                self._batch.worker = self._rotation
                out.put_work(self._rotation, DecodeBatch(self._wires))
                self._rotation = (self._rotation + 1) % self._workers
        if self._batch.events:
            out.put_skeleton(self._batch)
        self._batch, self._wires, self._pending, self._pending_bytes = CutBatch(), [], 0, 0
        self._keep, self._wire = self._batch.events.append, self._wires.append
        self._run_xid = _NO_RUN  # (the next change starts a run of the next batch)
        self._whole_at = -1  # (a transaction cut in two is no whole one)
        if out.stopping():
            raise Stopped

    def cut_drained(self) -> None:
        """The source has nothing more to read for now: cut the batch being gathered, if any.

        (Not once stopping: this runs inside the source's iterator, which a
        stop should end through its own close, saying where it got.)
        """
        if (self._wires or self._batch.events) and not self._out.stopping():
            self.cut()

    def _whole_txn(self, msg: TxnFrames) -> None:
        """A whole transaction into the batch as its messages, its changes one run (the caller cuts a full batch).

        (Where the workers write lines, this takes only transactions without
        changes: `_scanned_wholes` takes the rest.)
        """
        keep = self._keep
        changes = msg.changes
        if changes is None:
            keep((msg.begin_at, msg.begin))
            keep((msg.commit_at, msg.commit))
            return
        lsns = changes.lsns
        self._wire((lsns[0], RUN, None, (False, changes.head), changes.blob))
        run = RunSlot(None)
        run.lsns = lsns
        keep((msg.begin_at, msg.begin))
        keep((lsns[0], run))
        keep((msg.commit_at, msg.commit))
        self._pending += len(lsns)
        self._pending_bytes += len(changes.blob)

    def _scanned_wholes(self, msg: TxnRun) -> None:
        """A live reader's scanned whole transactions, their lines to be written by the workers."""
        keep, wire = self._keep, self._wire
        pending, pending_bytes = self._pending, self._pending_bytes
        wholes: WholesSlot | None = None  # the open stretch of ones with changes
        for t in msg.txns:
            blob = t.blob
            if blob is None:  # none: its Begin and Commit go on as they came
                wholes = None
                self._pending, self._pending_bytes = pending, pending_bytes
                self._whole_txn(scanned_txn_frames(t))
                pending, pending_bytes = self._pending, self._pending_bytes
                continue
            if wholes is None:
                wholes = WholesSlot([])
                keep((t.begin_at, wholes))
            wholes.txns.append(t)
            wire((t.commit_lsn, WHOLE, t.xid, t.commit_time, blob))
            pending += len(t.lsns)  # type: ignore[arg-type]  # (a transaction with a blob has its lsns)
            pending_bytes += len(blob)
        self._pending, self._pending_bytes = pending, pending_bytes

    def _whole_commit(self, commit_at: Lsn, commit: Commit) -> None:
        """Begin, row changes, Commit and nothing else, all in this batch: the worker writes the line (`WholeTxn`)."""
        events_now = self._batch.events
        whole_at = self._whole_at
        lsns: list[Lsn] = []
        for _, r in events_now[whole_at + 1 :]:
            lsns += cast("RunSlot", r).lsns  # (only runs follow the Begin)
        begin_at, begin = cast("tuple[Lsn, Begin]", events_now[whole_at])
        del events_now[whole_at:]
        self._keep((begin_at, WholesSlot([scanned_txn(begin_at, begin, None, lsns, commit_at, commit)])))
        self._wire((len(lsns), LINE, begin.xid, commit.commit_lsn, commit.commit_time))
        self._whole_at = -1

    def _other(self, lsn: Lsn, msg: Any) -> None:
        """Any other event: a Truncate, a Relation or Type message (a broadcast), or one that goes on as it is."""
        if isinstance(msg, Truncate):
            self._keep((lsn, msg))
            self._wire(truncate_wire(lsn, msg))
            self._pending += 1
            if self._pending >= self._limit:
                self.cut()
        elif isinstance(msg, _CONTROL_KINDS):
            self.cut()
            meta = ApplyMeta(lsn, msg)
            for i in range(self._workers):
                self._out.put_work(i, meta)
            if self._here is not None:  # (after the cut: the batch before it was decoded without it)
                self._here.apply(meta)
            self._keep((lsn, msg))
        else:
            self._keep((lsn, msg))
            # A keepalive is a moment the server had nothing to send.  From a
            # source that reports its pauses (`cut_drained`, which always cuts),
            # it cuts only while the decoders are idle: with batches cut
            # before still waiting, a small one would only wait behind them
            # (under load the server sends hundreds a second).  Nor does it
            # cut a batch of its own: live, the walsender sends one ahead of
            # about every other lone transaction, in the same read, and its own
            # cut cost the transaction behind it a pass through the pool and
            # the sender first (docs/performance.md, "Live latency").  It goes
            # on with what follows, or at the pause after it.
            if isinstance(msg, Keepalive) and (
                not self._gated
                or (self._out.batches_waiting() < KEEPALIVE_CUT_BELOW and len(self._batch.events) > 1)
            ):
                self.cut()
