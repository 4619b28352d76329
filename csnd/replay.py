"""`csnd replay`: the embedded pipeline over one or more sources.

    source ─► DecoderPool ─► NodeSender ─┐  (one thread per node, bounded queue each)
    source ─► DecoderPool ─► NodeSender ─┼─► CsnMerge ─► JSON lines ─► confirm live slots
    source ─► DecoderPool ─► NodeSender ─┘  (this thread)

With one local node there is nothing to merge: its released transactions
are written in the order they come (`_write_alone`), with the merge's own
checks of a node's order kept (`coordinator.alone`).

Each node pipeline runs in its own thread and hands finished transactions and
watermarks to the merge through a bounded per-node `Outbox`, what each
decoder batch released in one hand-off (not one per transaction); the merge thread
only takes from a node while the merge wants more from it, so a node far
ahead blocks on its own queue (back-pressure) instead of being buffered
without limit.

Live slots are confirmed only after the transactions are written out (and,
for a file, fsynced): for each node, the end LSN up to which every committed
transaction of that node is written (`ConfirmTracker`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Final

from csnd.coordinator import (
    JSON_TAIL,
    AloneOrder,
    CsnMerge,
    NodeBatch,
    NodeCommit,
    TxnPart,
    TxnStart,
    check_modes,
    json_changes,
    json_head,
)
from csnd.core.durable import Writeback, sync_directory
from csnd.core.errors import ConfigError, CsndError, os_error_text
from csnd.decoder.change import DecodedRun
from csnd.decoder.pool import BATCH_END, DecoderPool
from csnd.nodeitems import (
    BatchItem,
    EndItem,
    NodeItem,
    Outbox,
    TxnItem,
    WatermarkItem,
    cut_batches,
    whole_batch,
    whole_list,
)
from csnd.progress import ReplayProgress
from csnd.reader.recorded import RecordedSource
from csnd.sender import FinishedTxn, NodeSender
from csnd.sources import SourceSpec, parse_lsn_arg, parse_source
from csnd.stopping import ignore_stop_signals

# Finished transactions (or watermarks) waiting per node between its pipeline
# thread and the merge.  Small: the merge keeps its own bounded buffer.
NODE_QUEUE_DEPTH: Final = 64
# Output is handed to the file in chunks of this many bytes: fewer GIL
# round trips for the merge thread, at most this much held in memory.
OUTPUT_CHUNK_BYTES: Final = 1 << 20
# Pieces per writev() call at most (the system's IOV_MAX; Linux's is 1024).
_IOV_MAX: Final = min(os.sysconf("SC_IOV_MAX"), 1024)
_NEWLINE: Final = b"\n"
# How often output is flushed/fsynced and live slots confirmed.
CONFIRM_INTERVAL_S: Final = 1.0


class ConfirmTracker:
    """Which end LSN of one node may be confirmed, given how many of its transactions are written.

    The sender reports, after each release, `confirmable_lsn` (every
    transaction of this node committed at or before it has been released).
    That becomes safe to confirm once every transaction released up to that
    moment is also written.
    """

    __slots__ = ("released", "written", "_marks", "safe")

    def __init__(self) -> None:
        self.released = 0
        self.written = 0
        self._marks: deque[tuple[int, int]] = deque()  # (released count, confirmable lsn)
        self.safe = 0

    def on_release(self, confirmable: int) -> None:
        self.released += 1
        self._marks.append((self.released, confirmable))

    def on_written(self) -> None:
        self.written += 1
        while self._marks and self._marks[0][0] <= self.written:
            self.safe = max(self.safe, self._marks.popleft()[1])


class NodePipeline:
    """reader -> decoder pool -> sender for one node, in its own thread."""

    def __init__(self, source: Any, decoders: int, spill_dir: str | None = None) -> None:
        self.source = source
        self.node: str = source.node
        enums = source.enum_types() if source.binary and hasattr(source, "enum_types") else None
        self.pool = DecoderPool(self.node, decoders, source.binary, enums=enums)
        self.sender = NodeSender(self.node, source.mode)
        self.out = Outbox(NODE_QUEUE_DEPTH)
        self.wakeup: threading.Event | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"csnd-node-{self.node}", daemon=True)

    def start(self, wakeup: threading.Event) -> None:
        self.wakeup = wakeup
        self.thread.start()

    def _put(self, items: list[NodeItem]) -> None:
        while True:
            try:
                self.out.put_many(items, timeout=0.5)
                break
            except queue.Full:
                if self._stop.is_set():
                    return
        assert self.wakeup is not None
        self.wakeup.set()

    def _run(self) -> None:
        released: list[NodeItem] = []  # handed on at the end of each decoder batch
        try:
            sender = self.sender
            feed = sender.feed
            last_wm: int | None = None
            for lsn, item in self.pool.run(self.source.events(raw_changes=True)):
                if type(item) is DecodedRun:
                    feed(lsn, item)  # changes release nothing and move no watermark
                    continue
                if item is BATCH_END:
                    wm = sender.watermark
                    if wm is not None and wm != last_wm:
                        last_wm = wm  # the last one covers every transaction before it
                        released.append(WatermarkItem(wm))
                    if released:
                        self._put(released)
                        released = []
                    if self._stop.is_set():  # (once a decoder batch: soon enough, and not per event)
                        break
                    continue
                for txn in feed(lsn, item):
                    released.append(TxnItem(txn, sender.confirmable_lsn))
            if not self._stop.is_set():
                sender.finish()
            self._put([*released, EndItem()])
        except OSError as e:  # reading the source: say which node and file
            where = getattr(self.source, "path", None) or "its source"
            err = CsndError(f"cannot read {where}: {e.strerror or e}", node=self.node)
            self._put([*released, EndItem(err)])
        except BaseException as e:  # noqa: BLE001 - handed to the merge thread
            self._put([*released, EndItem(e)])

    def stop(self) -> None:
        self._stop.set()
        self.source.close()
        self.pool.close()


def open_source(spec: SourceSpec, args: argparse.Namespace, index: int) -> Any:
    if spec.is_grpc:
        from csnd.remote import RemoteNode

        address = spec.target.removeprefix("grpc://").rstrip("/")
        return RemoteNode(address, name=spec.name, give_up_s=getattr(args, "agent_give_up", None) or 30.0)
    if spec.is_live:
        from csnd.reader.live import LiveOptions, LiveSource

        if not args.slot or not args.publication:
            raise ConfigError(f"live source {spec.target}: --slot and --publication are required")
        opts = LiveOptions(
            conninfo=spec.target,
            slot=args.slot,
            publication=args.publication,
            create_slot=args.create_slot,
            until_lsn=parse_lsn_arg(args.until_lsn) if args.until_lsn else None,
            binary=not args.text,
            reconnect_give_up_s=getattr(args, "give_up", 300.0),
        )
        return LiveSource(spec.name or f"dn{index + 1}", opts, mode=args.mode)
    if not os.path.exists(spec.target):
        raise ConfigError(f"source {spec.target!r}: no such file (a live node is postgresql://...)")
    return RecordedSource(spec.target, name=spec.name)


class _Output:
    """JSON lines to stdout or to FILE (written as FILE.partial, renamed when complete).

    Pieces are encoded as they come and handed to the kernel about every
    `OUTPUT_CHUNK_BYTES` in one `os.writev`: one system call (one GIL hand-off
    to win back from the reader and pipeline threads) per chunk, and no
    copy of the chunk in between -- joining the pieces into one string and
    encoding that cost the merge thread four times what the gathering write
    does.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.partial = f"{path}.partial" if path else None
        if path and (path.endswith(os.sep) or os.path.isdir(path)):
            raise ConfigError(f"--output {path} is a directory; name the file to write")
        if self.partial:
            try:
                self.fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as e:
                raise CsndError(f"cannot create the output {self.partial}: {e.strerror or e}") from None
            self._writeback: Writeback | None = Writeback(self.fd)
        else:
            sys.stdout.flush()  # anything printed before goes first
            self.fd = sys.stdout.fileno()
            self._writeback = None
        self.lines = 0
        self.bytes_out = 0
        self._synced_bytes = -1  # (an empty output is synced once too: its file must exist)
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, text: str, end: bytes = b"") -> None:
        """Write `text`, then `end` as its own piece (a line's newline: no copy of `text` to add it)."""
        piece = text.encode("utf-8")
        self._pending += (piece, end) if end else (piece,)
        self._pending_bytes += len(piece) + len(end)
        if self._pending_bytes >= OUTPUT_CHUNK_BYTES:
            self._drain()

    def end_line(self, tail: str) -> None:
        self.write(tail, _NEWLINE)
        self.lines += 1

    def _drain(self) -> None:
        pending = self._pending
        while pending:
            batch = pending[:_IOV_MAX]
            try:
                written = os.writev(self.fd, batch)
            except OSError as e:
                raise self._failed(e.strerror or str(e)) from None
            if not written and any(batch):
                raise self._failed("it takes no bytes")
            self.bytes_out += written
            if self._writeback:
                self._writeback.wrote(written)
            # A short write (a pipe, a signal): drop what went out, keep the rest of a piece.
            done = 0
            while done < len(batch) and written >= len(batch[done]):
                written -= len(batch[done])
                done += 1
            if done < len(batch) and written:
                pending[done] = pending[done][written:]
            del pending[:done]
        self._pending_bytes = 0

    def _failed(self, reason: str) -> CsndError:
        self._pending.clear()  # nothing more goes out: abandon() must not try again
        return CsndError(f"cannot write the output to {self.partial or 'standard output'}: {reason}")

    def sync(self) -> None:
        self._drain()
        if self.partial and self.bytes_out != self._synced_bytes:  # (nothing new: nothing to wait for)
            try:
                os.fsync(self.fd)
            except OSError as e:
                raise self._failed(f"fsync failed ({e.strerror or e})") from None
            self._synced_bytes = self.bytes_out

    def commit(self) -> None:
        self.sync()
        if self.partial and self.path:
            os.close(self.fd)
            try:
                os.replace(self.partial, self.path)
            except OSError as e:
                raise CsndError(
                    f"cannot rename the complete output {self.partial} to {self.path}: {e.strerror or e}"
                ) from None
            try:
                sync_directory(self.path)  # the rename itself, so a crash cannot leave only the .partial
            except OSError as e:
                raise CsndError(
                    f"the output {self.path} is complete, but syncing its directory failed: {e.strerror or e}"
                ) from None

    def discard(self) -> None:
        """Give up before anything was written: close and remove FILE.partial."""
        if self.partial:
            os.close(self.fd)
            with contextlib.suppress(OSError):
                os.unlink(self.partial)

    def abandon(self) -> str | None:
        self._drain()
        if self.partial:
            os.close(self.fd)
            return self.partial
        return None


def run_replay(args: argparse.Namespace) -> int:
    specs = [parse_source(s) for s in args.sources]
    sources = [open_source(spec, args, i) for i, spec in enumerate(specs)]
    names = [s.node for s in sources]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"node name {sorted(dup)[0]!r} is used by several sources; name them NAME=SOURCE")
    check_modes({s.node: s.mode for s in sources})
    # Node order is name order, not command-line order: it decides the order
    # of "nodes" in the output and ties inside one cid, which should not
    # depend on how the sources were listed.
    sources.sort(key=lambda s: s.node)
    out = _Output(args.output)  # before any decoder starts: a bad path fails at once
    verbose = getattr(args, "verbose", False)
    try:
        pipelines: list[Any] = [
            s if getattr(s, "source", None) is s else NodePipeline(s, args.decoders) for s in sources
        ]  # a RemoteNode is its own pipeline
    except BaseException:
        out.discard()  # nothing was written: leave no FILE.partial behind
        raise
    progress = ReplayProgress(sys.stderr, pipelines) if verbose or sys.stderr.isatty() else None
    try:
        _merge_loop(pipelines, out, progress)
    except BaseException as e:
        for p in pipelines:
            p.stop()
        try:
            partial = out.abandon()
        except CsndError:  # (the output failing too: the first error is the one to tell)
            partial = out.partial
        if isinstance(e, KeyboardInterrupt) and partial:
            e.partial = partial  # type: ignore[attr-defined]  # (for the command line's one line)
        if isinstance(e, OSError):  # not one of ours: still one line, with where the output is
            e = CsndError(os_error_text(e))
        if partial and isinstance(e, CsndError):
            raise _with_partial(e, partial) from None
        raise e from None
    # Every source ended and every line is written: the run is complete, and
    # a Ctrl-C or SIGTERM now would only turn a finished output into a
    # ".partial" reported as interrupted.  (The closing fsync is short: the
    # output was written back as it grew.)
    ignore_stop_signals()
    try:
        out.commit()
    finally:
        for p in pipelines:
            p.stop()
    if progress is not None:
        progress.done(out.lines, out.bytes_out)
    return 0


def _write_alone(out: _Output, txn: FinishedTxn, order: AloneOrder) -> None:
    """Write the line of a transaction of the only node, as the merge would, after the merge's checks."""
    csn = txn.csn
    order.check(csn, txn.gid, txn.xid, txn.commit_lsn)
    head = json_head(
        csn, txn.gid, txn.commit_time, {txn.node: NodeCommit(txn.xid, txn.commit_lsn, txn.commit_time)}
    )
    changes = whole_list(txn)
    if changes is not None:  # the common case: one write per line, its text copied once
        # (a bigger transaction goes out batch by batch below: its text is never held whole)
        out.end_line("".join((head, json_changes(txn.node, changes, True), JSON_TAIL)))
        return
    out.write(head)
    first = True
    for batch in cut_batches(txn):  # a spilled transaction is read back batch by batch
        if batch.changes:
            out.write(json_changes(txn.node, batch.changes, first))
            first = False
    out.end_line(JSON_TAIL)


def _with_partial(e: CsndError, partial: str) -> CsndError:
    e.args = (f"{e}; the incomplete output is in {partial}",)
    return e


def _merge_loop(pipelines: list[Any], out: _Output, progress: ReplayProgress | None = None) -> None:
    merge = CsnMerge([p.node for p in pipelines])
    wakeup = threading.Event()
    live = [p for p in pipelines if hasattr(p.source, "confirmed_lsn")]
    # Only a live source has a slot to confirm, so only its writes are tracked.
    trackers = {p.node: ConfirmTracker() for p in live}
    by_node = {p.node: p for p in pipelines}
    for p in pipelines:
        p.start(wakeup)
    # One node's released transactions are already in the output's order (its
    # sender releases them in increasing CSN order), so the merge of that one
    # stream is the identity and they skip it: its keys, events and their
    # objects were two thirds of this thread's work per transaction.
    order = (  # set when alone: the merge's checks, kept
        AloneOrder(pipelines[0].node)
        if len(pipelines) == 1 and isinstance(pipelines[0], NodePipeline)
        else None
    )
    ended: set[str] = set()
    feeding: dict[str, Iterator[NodeBatch] | None] = {}  # each node's transaction being fed in
    first_part = True  # the next TxnPart is the first of its transaction
    line: list[str] = []  # the current transaction's text not yet handed to the output
    line_chars = 0
    last_confirm = time.monotonic()
    while len(ended) < len(pipelines) or merge.has_pending():
        progressed = False
        wakeup.clear()
        for p in pipelines:
            if p.node in ended:
                continue
            tracker = trackers.get(p.node)
            taken = 0  # alone: items written this round
            while True:
                # A transaction goes in batch by batch, only while the merge
                # wants more, so a huge (spilled) one is never read in whole.
                # Alone, a round ends after as many transactions as the merge
                # would hold or, for a live node, once a confirm is due, so a
                # node that releases faster than its lines are written still
                # gets its slot confirmed on time by the code below.
                if order is not None:
                    if taken == merge.max_pending_batches or (
                        live and taken % 64 == 63 and time.monotonic() - last_confirm >= CONFIRM_INTERVAL_S
                    ):
                        break
                    taken += 1
                elif not merge.wants_more(p.node):
                    break
                batches = feeding.get(p.node)
                if batches is not None:
                    batch = next(batches, None)
                    if batch is not None:
                        merge.add_batch(p.node, batch)
                        progressed = True
                        continue
                    feeding[p.node] = None
                try:
                    item = p.out.get_nowait()
                except queue.Empty:
                    break
                progressed = True
                if isinstance(item, TxnItem):
                    if tracker is not None:
                        tracker.on_release(item.confirmable)
                    if order is not None:
                        _write_alone(out, item.txn, order)
                        if tracker is not None:
                            tracker.on_written()
                        continue
                    whole = whole_batch(item.txn)
                    if whole is not None:
                        merge.add_batch(p.node, whole)
                    else:
                        feeding[p.node] = cut_batches(item.txn)
                elif isinstance(item, BatchItem):  # a node agent's, already cut
                    if item.confirmable is not None and tracker is not None:
                        tracker.on_release(item.confirmable)
                    merge.add_batch(p.node, item.batch)
                elif isinstance(item, WatermarkItem):
                    merge.add_watermark(p.node, item.csn)
                else:
                    if item.error is not None:
                        raise item.error
                    merge.node_ended(p.node)
                    ended.add(p.node)
                    break
        for ev in merge.pop_events():
            # A transaction's line is gathered and handed to the output once
            # (most lines are short); a big one goes out part by part.
            if isinstance(ev, TxnStart):
                line = [json_head(ev.csn, ev.gid, ev.commit_time, ev.nodes)]
                line_chars = 0
                first_part = True
            elif isinstance(ev, TxnPart):
                text = json_changes(ev.node, ev.changes, first_part)
                line.append(text)
                line_chars += len(text)
                first_part = False
                if line_chars >= OUTPUT_CHUNK_BYTES:
                    out.write("".join(line))
                    line, line_chars = [], 0
            else:
                line.append(JSON_TAIL)
                out.end_line("".join(line))
                line = []
                for node in ev.nodes:
                    if node in trackers:
                        trackers[node].on_written()
            progressed = True
        now = time.monotonic()
        if progress is not None:
            progress.tick(now, out.lines, out.bytes_out)
        if live and now - last_confirm >= CONFIRM_INTERVAL_S:
            out.sync()
            for p in live:
                p.source.confirm(trackers[p.node].safe)
            last_confirm = now
        if not progressed:
            if len(ended) == len(pipelines) and merge.has_pending():
                raise CsndError(
                    "merge stalled with transactions pending after every node ended; this is a bug"
                )
            wakeup.wait(0.2)
    out.sync()
    for p in live:
        p.source.confirm_final(trackers[p.node].safe)
    del by_node
