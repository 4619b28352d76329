"""The decoder pool: N worker processes turning raw tuple data into rows.

    reader thread                    workers (processes)              collector
    ─────────────                    ───────────────────              ─────────
    events ─► cut batches ─┬─► in[0] ─► worker 0 ─► out[0] ─┐
                           ├─► in[1] ─► worker 1 ─► out[1] ─┼─► read in the same
                           └─► in[k] ─► worker k ─► out[k] ─┘   rotation ─► sender
           skeletons (stream order) ───────────────────────────►  zip back in

Decoding is ~70% of the work of logical decoding (GaussDB's profile,
docs/design.md section 1), so it is what runs in parallel.  The reader cuts
the stream into batches and hands the *changes* of batch i to worker i mod N;
everything else (Begin, Commit, stream control, messages) stays in the
batch's skeleton in this process.  The collector reads results in the same
rotation, so stream order comes back by construction, never by sorting -- as
openGauss does.

Relation and Type messages end the current batch and are *broadcast* to every
worker's queue in stream order: each worker's queue is FIFO, so every worker
reloads table metadata before it decodes any later change of that table.

Work crosses the process boundary as one typed message per batch
(`decoder.messages`, which holds every message to and from a worker) whose
entries are plain tuples (cheap to pickle).  A recorded file's row changes come as `ChangeFrames`: runs of frames
still in their recorded framing, one bytes slice each, which the workers
parse -- so the reader thread, the one serial step in front of them, spends a
few operations per change instead of parsing each one and building its
tuple.  Every queue is bounded, and its depth is sampled into `stats`.  A
worker that dies fails the run with a `WorkerError` naming it -- never a hang.

A live node's small batch, cut while the workers hold no batch, is
decoded in the reader thread instead (`decoder.inline`, the workers' own
code): live, a batch is a transaction or a few, and a worker's round trip
-- the queue's feeder thread, the worker, a second wake-up of the collector
-- cost more than the decoding.  It reaches the collector through the same
skeleton queue, with its bodies, so stream order holds as before.  When
nothing waits in that queue and the collector is idle, the reader hands such
a batch to the consumer itself (`collect_here`, `decoder.skeletons`): live,
a transaction then goes from the socket to the sender without waking the
collector's thread.

The workers are forked from a fork server (`start_worker_server`): one
process with no threads that has imported the decoding layer once, so a
worker starts ready to decode and this process never forks itself.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.resource_tracker as mp_resource_tracker
import os
import pickle
import queue
import select
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from typing import Any, Final, cast

from csnd.core.errors import ConfigError, CsndError, InternalError, RemoteTraceback, WorkerError
from csnd.core.ids import INVALID_LSN, Lsn
from csnd.decoder.change import DecodedItem, DecodedRun, PassThroughItem, WholeTxn, WholeTxns
from csnd.decoder.feed import (
    BATCH_CHANGES,
    BatchFeed,
    CutBatch,
    HereDecoder,
    RunSlot,
    Stopped,
    WholesSlot,
)
from csnd.decoder.inline import INLINE_CHANGES, InlineDecoder
from csnd.decoder.messages import (
    DecodeBatch,
    Decoded,
    Failed,
    Stop,
    Sync,
    ToWorker,
)
from csnd.decoder.skeletons import Skeletons
from csnd.reader.events import EventStream
from csnd.reader.pgoutput import (
    Truncate,
)

# Batches in flight per worker (input queue bound).  Enough to keep a worker
# busy while the collector is momentarily slow; memory is about
# N x QUEUE_DEPTH x BATCH_BYTES of input, and their results.
QUEUE_DEPTH: Final = 4
# What each pipe to and from a worker may hold (see `_widen_pipe`).
PIPE_BYTES: Final = 1 << 20
# How often a blocked wait checks that the workers are still alive.
LIVENESS_POLL_S: Final = 0.5

# How long close() waits for the workers, all together, before ending them.
STOP_GRACE_S: Final = 0.5


@dataclass
class QueueStats:
    """Depth and peak of one bounded queue (every queue exposes both as metrics)."""

    name: str
    capacity: int
    depth: int = 0
    peak: int = 0

    def observe(self, depth: int) -> None:
        self.depth = depth
        if depth > self.peak:
            self.peak = depth


@dataclass
class PoolStats:
    """Batches and changes decoded; each worker's input queue, then the batches in flight (last)."""

    batches: int = 0
    changes: int = 0
    queues: list[QueueStats] = field(default_factory=list)
    inline_batches: int = 0  # of `batches`: decoded in the reader thread (`decoder.inline`)
    batches_here: int = 0  # batches no worker held, handed to the consumer by the reader's thread


_END: Final = object()


class _CollectFailed(BaseException):
    """A consumer's failure on a batch the reader's thread handed it (`DecoderPool._take_here`).

    It may be raised inside the source's iterator (a pause cuts the batch there), whose handlers
    take a lost connection or an `OSError` for a reason to reconnect: carried in a BaseException
    it passes them, and the reader's thread ends with the consumer's own error (`_feed`).
    """

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class BatchEnd(enum.Enum):
    """The type of `BATCH_END`: an enum, so that mypy narrows on `item is BATCH_END`."""

    BATCH_END = "BATCH_END"

    def __repr__(self) -> str:
        return "BATCH_END"


BATCH_END: Final = BatchEnd.BATCH_END  # `DecoderPool.run`'s mark after each batch


class DecoderPool:
    """Runs `events` through N decoder processes and yields them back in order.

    `run(events)` yields `(lsn, item)` where item (a `DecodedItem`) is the original message, a
    `DecodedRun` in place of each run of consecutive row changes of one
    (sub)transaction (`lsn` its first change's) and of the tables of each
    TRUNCATE (`op` "truncate"), or a `WholeTxns` for consecutive whole
    transactions whose lines the workers wrote; and `(INVALID_LSN, BATCH_END)` (0/0) after each batch, where the
    next item may mean waiting for a worker (a consumer that hands results
    on to another thread hands them on there, in one go).

    `events` is a source's `EventStream`, read in a reader thread of the
    pool's own; a stop before its end closes it there (`_feed`).
    """

    def __init__(
        self,
        node: str,
        workers: int,
        binary: bool,
        batch_changes: int = BATCH_CHANGES,
        enums: list[tuple[int, int]] | None = None,
        types: list[tuple[int, str, int, int]] | None = None,
        inline_changes: int = INLINE_CHANGES,
    ) -> None:
        """`enums`: (type OID, array OID) of the source's enum types, readable in binary.

        `types`: the source's user types (`decoder.rows.USER_TYPES_QUERY`), enums included.
        `inline_changes`: a live node's batch of at most this many changes, cut while
        the decoders are idle, is decoded in the reader thread (0: never).
        """
        if workers < 1:
            raise ConfigError(f"--decoders must be at least 1, got {workers}", node=node)
        self.node = node
        self.n = workers
        self.binary = binary
        self.batch_changes = batch_changes
        self.inline_changes = inline_changes
        self._enums, self._types = list(enums or ()), list(types or ())
        ctx = start_worker_server()
        self._in: list[Any] = [ctx.Queue(QUEUE_DEPTH) for _ in range(workers)]
        # Results come back over one pipe per worker, not a Queue: the parent
        # holds no copy of the write end, so a worker killed halfway through a
        # message shows up as end-of-file here instead of a read that waits
        # forever for the rest of it.
        pipes = [ctx.Pipe(duplex=False) for _ in range(workers)]
        for conn in [r for r, _ in pipes] + [q._reader for q in self._in]:
            _widen_pipe(conn.fileno())
        self._out: list[Any] = [r for r, _ in pipes]
        for conn in self._out:  # read by `_recv_message`, never by a blocking recv()
            os.set_blocking(conn.fileno(), False)
        self._procs = [
            ctx.Process(
                target=_worker_entry,
                args=(i, node, binary, self._in[i], pipes[i][1], list(enums or ()), list(types or ())),
                name=f"csnd-decoder-{node}-{i}",
                daemon=True,
            )
            for i in range(workers)
        ]
        # batches cut by the reader thread, waiting for their results, in order
        pending = workers * (QUEUE_DEPTH + 1)
        self._skeletons: Skeletons[CutBatch | object] = Skeletons(pending)
        # Live, what takes a decoded batch's items in the reader's thread (`run`'s `collect_here`)
        self._collect_here: Callable[[Iterator[tuple[Lsn, DecodedItem | BatchEnd]]], None] | None = None
        self.stats = PoolStats(
            queues=[QueueStats(f"decoder-{node}-{i}-in", QUEUE_DEPTH) for i in range(workers)]
            + [QueueStats(f"decoder-{node}-in-flight", pending)]
        )
        # Batches sent to the workers (counted by the reader thread) and their results
        # read (by the collector): the difference is what the workers hold.
        self._sent_to_workers = 0
        self._results_read = 0
        self._next_liveness = (
            0.0  # (monotonic) when the collector next looks at the workers while decoding inline
        )
        self._reader_error: BaseException | None = None
        self._cut_drained: Callable[[], None] | None = None  # set by the reader thread's _feed
        self._stop = threading.Event()
        self._close_lock = threading.Lock()
        self._closed = False
        for p in self._procs:
            p.start()
        for _, w in pipes:
            w.close()

    # --- reader side (its own thread) ---------------------------------------------

    def _feed(self, events: EventStream, write_lines: bool, reports_pauses: bool) -> None:
        """The reader thread: `events` cut into batches (`decoder.feed`), then the end mark.

        A live node's (`reports_pauses`) small batches are decoded here when the
        decoders are idle (`decoder.inline`); a recorded file's go to the workers.
        """
        try:
            here: HereDecoder | None = None
            if reports_pauses and self.inline_changes > 0:
                here = InlineDecoder(self.node, self.binary, self._enums, self._types)
            feed = BatchFeed(
                self, self.n, self.batch_changes, write_lines, reports_pauses, here, self.inline_changes
            )
            self._cut_drained = feed.cut_drained
            feed.run(events)
        except _CollectFailed as e:
            self._reader_error = e.error
        except BaseException as e:  # (handed to the collector)
            self._reader_error = e
        finally:
            # A source left mid-stream (a stop) ends here, in the thread that ran it:
            # a live one then says where it got and hangs up, instead of holding its
            # replication connection (and the server its slot) until the process exits.
            with contextlib.suppress(Exception):
                events.close()
            self._put_skeleton(_END)

    def drained(self) -> None:
        """The source has nothing more to read for now: hand on the batch being gathered.

        Called by the source from inside its iterator, so in the reader
        thread, between two events: the pool is the `reader.events.PauseListener`
        a live stream is opened with (runtime.inputs).
        """
        cut = self._cut_drained
        if cut is not None:
            cut()

    def put_work(self, worker: int, message: ToWorker) -> None:
        """`FeedOutlet.put_work`: to worker `worker`'s inbox, waiting while it is full."""
        if type(message) is DecodeBatch:
            self._sent_to_workers += 1
        self._put(self._in[worker], message, worker)

    def put_skeleton(self, batch: CutBatch) -> None:
        """`FeedOutlet.put_skeleton`."""
        self._put_skeleton(batch)

    def batches_waiting(self) -> int:
        """`FeedOutlet.batches_waiting`."""
        return self._skeletons.qsize()

    def batches_decoding(self) -> int:
        """`FeedOutlet.batches_decoding` (each counter has one writer: no lock)."""
        return self._sent_to_workers - self._results_read

    def stopping(self) -> bool:
        """`FeedOutlet.stopping`."""
        return self._stop.is_set()

    def _put(self, q: Any, item: Any, worker: int) -> None:
        while True:
            try:
                q.put(item, timeout=LIVENESS_POLL_S)
                break
            except queue.Full:
                if self._stop.is_set():
                    raise Stopped from None
                self._check_worker(worker)
        with contextlib.suppress(NotImplementedError):  # qsize() is missing on macOS
            self.stats.queues[worker].observe(q.qsize())

    def _put_skeleton(self, item: CutBatch | object) -> None:
        if (
            type(item) is CutBatch
            and item.worker < 0
            and self._collect_here is not None
            and self._take_here(item)
        ):
            return
        while not self._stop.is_set():
            try:
                self._skeletons.put(item, timeout=LIVENESS_POLL_S)
            except queue.Full:
                continue
            self.stats.queues[-1].observe(self._skeletons.qsize())
            return

    def _take_here(self, batch: CutBatch) -> bool:
        """A batch no worker holds, to the consumer in this (the reader's) thread if it is next and
        the collector idle; whether it was.  A failure of the consumer's ends the reader as its own."""
        collect_here = self._collect_here
        assert collect_here is not None
        skeletons = self._skeletons
        if self._stop.is_set() or not skeletons.turn.acquire(blocking=False):
            return False
        try:
            if skeletons.qsize():  # (a batch waits before it: it goes behind, in order)
                return False
            try:
                collect_here(self._items_of(batch))
            except BaseException as e:
                raise _CollectFailed(e) from None
            self.stats.batches_here += 1
            return True
        finally:
            skeletons.turn.release()

    # --- collector side (the caller's thread) --------------------------------------

    def run(
        self,
        events: EventStream,
        *,
        write_lines: bool = False,
        reports_pauses: bool = False,
        collect_here: Callable[[Iterator[tuple[Lsn, DecodedItem | BatchEnd]]], None] | None = None,
    ) -> Iterator[tuple[Lsn, DecodedItem | BatchEnd]]:
        """The decoded stream (see the class docstring); once per pool.

        `write_lines` (a lone node in single-node mode): whole transactions
        come back as `WholeTxns`, their lines written by the workers.
        `reports_pauses`: the source calls `drained` at its pauses (a live
        node), so a keepalive need not end a batch while the decoders are busy.
        `collect_here`: what the caller does with each item yielded, for a batch
        the reader's thread hands over itself (see the module docstring): it
        must do exactly that, since those items are not yielded.
        """
        self._collect_here = collect_here
        feeder = threading.Thread(
            target=self._feed,
            args=(events, write_lines, reports_pauses),
            name=f"csnd-reader-{self.node}",
            daemon=True,
        )
        feeder.start()
        skeletons = self._skeletons
        try:
            while True:
                if not skeletons.wait(LIVENESS_POLL_S):
                    self._check_all()
                    continue
                # (taken and handled under the turn: the consumer handles each item before
                # this generator goes on, so the turn is let go once the batch is handled)
                with skeletons.turn:
                    item = skeletons.get_nowait()
                    if item is _END:
                        if self._reader_error is not None and not isinstance(self._reader_error, Stopped):
                            raise self._reader_error
                        if self._reader_error is None:
                            self._sync()
                        return
                    assert isinstance(item, CutBatch)
                    yield from self._items_of(item)
        finally:
            self.close()
            feeder.join(timeout=5)

    def _items_of(self, item: CutBatch) -> Iterator[tuple[Lsn, DecodedItem | BatchEnd]]:
        """A batch's items in stream order, its bodies zipped back in, then `BATCH_END`."""
        if item.decoded is not None:  # decoded in the reader thread: no worker holds it
            decoded = item.decoded
            self.stats.inline_batches += 1
            # No result is read from a worker now, so look at them on the clock: a
            # dead one fails the run (and a service restarts it) as it did when
            # every batch went round them, not at the next large batch.
            now = time.monotonic()
            if now >= self._next_liveness:
                self._next_liveness = now + LIVENESS_POLL_S
                self._check_all()
        elif item.worker < 0:  # no changes: no _Run or Truncate in the skeleton either
            yield from cast("list[tuple[Lsn, PassThroughItem]]", item.events)
            yield INVALID_LSN, BATCH_END
            return
        else:
            decoded = self._result(item.worker)
            self._results_read += 1
        self.stats.batches += 1
        self.stats.changes += item.n_changes
        at = 0  # results are in wire order: a run's bodies are consecutive
        wholes: list[WholeTxn] = []  # consecutive whole transactions, handed on as one
        lines: list[str] = []
        whole_at = INVALID_LSN
        for lsn, msg in item.events:
            if type(msg) is WholesSlot:
                if not wholes:
                    whole_at = lsn
                n = len(msg.txns)
                wholes += msg.txns
                lines += decoded[at : at + n]
                at += n
                continue
            if wholes:
                yield whole_at, WholeTxns(wholes, lines)
                wholes, lines = [], []
            if type(msg) is RunSlot:
                n = len(msg.lsns)
                yield lsn, DecodedRun(msg.xid, msg.lsns, decoded[at : at + n])
                at += n
            elif isinstance(msg, Truncate):
                bodies = decoded[at]
                if bodies:
                    yield lsn, DecodedRun(msg.xid, [lsn] * len(bodies), bodies, "truncate")
                at += 1
            else:
                yield lsn, msg
        if wholes:
            yield whole_at, WholeTxns(wholes, lines)
        yield INVALID_LSN, BATCH_END

    def _result(self, worker: int) -> list[Any]:
        try:
            reply = _recv_message(self._out[worker].fileno(), lambda: self._check_worker(worker))
        except (EOFError, OSError):
            self._procs[worker].join(timeout=5)
            self._check_worker(worker)
            raise WorkerError(
                f"decoder worker {worker} (pid {self._procs[worker].pid}) closed its result pipe "
                "without exiting",
                node=self.node,
            ) from None
        if type(reply) is Decoded:
            return reply.bodies
        assert type(reply) is Failed, reply
        err, tb = reply.error, reply.traceback
        if not isinstance(err, CsndError):  # (the worker sends only ours; anything else is a bug)
            err = InternalError(f"decoder worker {worker} failed: {err!r}", node=self.node)
        raise err from RemoteTraceback(tb)

    def _sync(self) -> None:
        """The stream ended: wait until every worker has applied all it was sent, and raise its error if any.

        A worker reports an error (a Relation it cannot decode, say) in place
        of its next result, and the collector reads a worker's results only
        when a batch went to it -- so an error on a Relation near the end of
        the stream, after the last batch of its worker, would otherwise go
        unread and the run end as a success.  Each worker answers the sync
        after everything queued before it, or its error comes first.
        """
        for i in range(self.n):
            self._put(self._in[i], Sync(), i)
        for i in range(self.n):
            self._result(i)

    def inbox_depths(self) -> list[tuple[int, int]]:
        """(batches waiting, capacity) of each worker's inbox now, for progress lines (any thread)."""
        depths = []
        for q, stats in zip(self._in, self.stats.queues, strict=False):
            try:
                depth = q.qsize()
            except (NotImplementedError, OSError, ValueError):  # (no qsize on macOS; a closed queue)
                depth = stats.depth
            depths.append((depth, stats.capacity))
        return depths

    def _check_worker(self, worker: int) -> None:
        p = self._procs[worker]
        if not p.is_alive():
            if _server_lost(p):
                raise WorkerError(
                    f"the decoder fork server died (decoder worker {worker}, pid {p.pid}, still runs and "
                    "leaves once idle); the run stops, nothing after the last complete transaction was written",
                    node=self.node,
                )
            code = p.exitcode
            how = (
                f"was killed by signal {-code} ({_signal_name(-code)})"
                if code is not None and code < 0
                else f"exited with status {code}"
            )
            raise WorkerError(
                f"decoder worker {worker} (pid {p.pid}) {how}; the run stops, nothing after the last "
                "complete transaction was written",
                node=self.node,
            )

    def _check_all(self) -> None:
        for i in range(self.n):
            self._check_worker(i)

    def close(self) -> None:
        """Stop the workers and free the queues; safe to call more than once, from any thread."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        for q in self._in:
            q.cancel_join_thread()  # first: nothing below may wait on a feeder stuck on a full inbox
        for i, p in enumerate(self._procs):
            if p.is_alive() or _server_lost(p):
                try:
                    self._in[i].put_nowait(Stop())
                except queue.Full:
                    # Stopped mid-run (Ctrl-C, an error): its inbox is full of
                    # batches nobody will read, so the stop message would only
                    # arrive after them -- end it now instead of waiting.
                    # (SIGKILL: the workers ignore SIGTERM, see `forkserver_init`.)
                    p.kill()
        # After a complete run the workers are idle and leave at once; after a
        # stop mid-run one may still be blocked handing back a result that
        # nobody reads.  Either way nothing they still hold is wanted, so the
        # wait is short and shared, and the rest are ended.
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        for q in self._in:
            q.close()
        for conn in self._out:
            conn.close()


def _recv_message(fd: int, idle: Callable[[], None]) -> Any:
    """One object as a worker's `Connection.send` framed it, read from non-blocking `fd`.

    Not `Connection.recv()`: once a message's first bytes are in, that waits
    for the rest with no timeout, and a worker stopped or orphaned halfway
    through writing a result larger than the pipe's free room never sends
    it -- the run hung instead of failing.  Here every wait is at most
    `LIVENESS_POLL_S`, after which `idle()` runs (the worker's liveness
    check: it raises to end the wait).  End-of-file raises EOFError.

    The framing is multiprocessing.connection's: a 4-byte big-endian signed
    length, or -1 and an 8-byte length for 2 GiB and more, then a pickle.
    """
    (size,) = struct.unpack("!i", _read_exactly(fd, 4, idle))
    if size == -1:
        (size,) = struct.unpack("!Q", _read_exactly(fd, 8, idle))
    return pickle.loads(_read_exactly(fd, size, idle))


def _read_exactly(fd: int, size: int, idle: Callable[[], None]) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    poller = None
    while got < size:
        try:
            n = os.readv(fd, [view[got:]])
        except BlockingIOError:
            if poller is None:  # (poll, not select: a busy service may hold fds above 1024)
                poller = select.poll()
                poller.register(fd, select.POLLIN)
            if not poller.poll(LIVENESS_POLL_S * 1000):
                idle()
            continue
        if n == 0:
            raise EOFError(f"end of file after {got} of {size} bytes")
        got += n
    return buf


def _server_lost(p: Any) -> bool:
    """Whether worker `p` only looks dead because its fork server died: it is still running.

    A forked worker's exit status reaches this process through the fork
    server; with the server gone, multiprocessing reports status 255 for a
    worker that may well be alive (and, orphaned, leaves by itself once idle).
    """
    if p.exitcode != 255 or p.pid is None:
        return False
    try:
        with open(f"/proc/{p.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def start_worker_server() -> ForkServerContext:
    """The multiprocessing context the workers start from; its fork server is started here if need be.

    The parent has threads, so it must never fork itself, and a spawned
    worker is a fresh interpreter that imports the decoding layer (psycopg
    most of it) on its own: about a quarter of a second of CPU per worker,
    six times over for three nodes of two decoders.  A fork server is a
    spawned process of no threads that imports the layer once and forks
    each worker from that, ready to decode.  Calling this early (as
    `csnd replay` does before its own imports) lets the server load while
    the parent sets up.  It ignores Ctrl-C from its start (when started
    from the main thread) and from its first import on (`forkserver_init`,
    whatever thread started it), and its workers inherit that: the parent
    decides how to stop.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["csnd.decoder.forkserver_init", "csnd.decoder.worker", "csnd.decoder.pool"])
    # The resource tracker first, outside the held signals: the fork server's start
    # starts it too if need be, and its start unblocks SIGTERM on the way out (its
    # own block-spawn-unblock), so the server would be spawned with SIGTERM open and
    # a group's SIGTERM during its imports would kill it (`_stop_signals_held`).
    mp_resource_tracker.ensure_running()
    with _stop_signals_held():
        mp_forkserver.ensure_running()
    return ctx


def _worker_entry(*args: Any) -> None:
    """The workers' target; `decoder.worker` is imported only here, so the parent never loads psycopg.

    (The fork server has imported both modules, so in a worker this costs nothing.)
    """
    from csnd.decoder.worker import worker_main

    worker_main(*args)


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Start the fork server with Ctrl-C ignored and SIGTERM, SIGHUP blocked: a spawned interpreter inherits both.

    Ctrl-C goes to the whole process group, and a server still importing
    when it arrives would die with a KeyboardInterrupt traceback on the
    terminal; a group's SIGTERM or SIGHUP would kill it, and the next pool
    started from it would fail (`forkserver_init`).  Those two are blocked,
    not ignored: one that reaches this process meanwhile is held and handled
    once unblocked, never lost (ignoring it here would drop the stop).  Only
    the main thread may change signal handlers, which is why `csnd replay`,
    `csnd serve` and `csnd node` start the server from the main thread
    first; from then on `forkserver_init` covers the server and its workers.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGHUP))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)


def _widen_pipe(fd: int) -> None:
    """Let the pipe hold `PIPE_BYTES`, several whole batches, where the system allows it.

    A batch's results are hundreds of kB (a wide-row batch of 512 changes:
    about 200 kB) and a pipe holds 64 kB by default, so a worker that
    finished a batch sat in send() until the collector -- one thread of a
    busy process, reading the workers in rotation -- came round to it, and
    lost its core meanwhile; the inputs likewise arrived in pieces.  With
    room for a whole batch a worker sends and goes on.  (A bounded queue
    still: `QUEUE_DEPTH` batches in, a pipe's worth out.)
    """
    if sys.platform != "linux":  # (F_SETPIPE_SZ is Linux's)
        return
    with contextlib.suppress(OSError):  # above /proc/sys/fs/pipe-max-size: keep the default
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
