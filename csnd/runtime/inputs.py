"""What the merger reads: one `NodeInput` per node, local or remote.

    NodePipeline: source ─► DecoderPool ─► NodeSender ─► Outbox   (this process, its own thread)
    RemoteNode:   node agent ══ gRPC Stream ══► Outbox              (csnd.runtime.remote)

Either way the runtime sees the same thing: a node name and CSN mode, an
`Outbox` of items (`csnd.runtime.items`) it drains, a wake-up event the input
sets when it put something there, and -- for an input with a slot behind it --
`confirm(lsn)` to move the slot once the runtime's sink says the lines up to
`lsn` are durable.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Final, Protocol

from csnd.core.errors import CsndError
from csnd.core.ids import Csn, Lsn
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.decoder.pool import BATCH_END, BatchEnd, DecoderPool
from csnd.runtime.items import EndItem, NodeItem, Outbox, TxnItem, WatermarkItem
from csnd.runtime.sources import FileSource, LiveNode, NodeSource, OpenedSource, SlotSource
from csnd.runtime.stats import NodeStats
from csnd.sender import SPILL_BYTES, NodeSender

# Lists of finished transactions (or watermarks) waiting per node between its
# pipeline thread and the coordinator.  Small: the merge keeps its own bounded buffer.
NODE_QUEUE_DEPTH: Final = 64


class NodeInput(Protocol):
    """One node's stream as the merger reads it."""

    node: str
    mode: str
    out: Outbox  # what the runtime drains (one consumer thread)
    # Whether the input has a slot behind it that `confirm` moves: only then
    # are its lines tracked for confirmation.
    confirms: bool
    # Whether its items are whole transactions in release order (a local
    # pipeline): a lone such input skips the merge.
    releases_whole: bool

    def start(self, wakeup: threading.Event, *, alone: bool) -> None:
        """Start producing; `wakeup` is set after each hand-off to `out`.

        `alone`: this input releases whole and is the run's only one, so its
        transactions are written as they come (`write_alone`): a local
        pipeline's decoders may then write single-node lines themselves.
        """

    def stop(self) -> None:
        """Stop producing and release what the input holds (idempotent; from any thread)."""

    def confirm(self, lsn: Lsn) -> None:
        """Every transaction of this node committed before `lsn` is durable downstream."""

    def confirm_final(self, lsn: Lsn) -> None:
        """As `confirm`, once the stream has ended: make the slot move even though streaming stopped."""

    def stats(self) -> NodeStats:
        """Where the input is now, for every report of the node (any thread; never waits)."""


class NodePipeline:
    """reader -> decoder pool -> sender for one node, in its own thread (live, a batch the reader
    decoded itself may be released in the reader's thread: `DecoderPool.run`'s `collect_here`).

    `opened` says what kind of source it reads (`csnd.runtime.sources`): a
    live node's slot is confirmed and its pauses end decoder batches; a
    file's path names it in a read error and its progress is a fraction.
    """

    releases_whole = True

    def __init__(
        self,
        opened: OpenedSource,
        decoders: int,
        resume_csn: Csn | None = None,
        *,
        spill_dir: str | None = None,
        spill_bytes: int | None = None,
    ) -> None:
        source: NodeSource = opened.source
        self.source = source
        self.node: str = source.node
        self.mode: str = source.mode
        # (a live node: its slot is ours to confirm; a file: none)
        self._slot: SlotSource | None = opened.source if isinstance(opened, LiveNode) else None
        self._file: FileSource | None = None if isinstance(opened, LiveNode) else opened.source
        self.confirms: bool = self._slot is not None
        # A live gtm node's stream starts mid-way: its sender holds every release until this
        # start is settled (csnd.reader.settle), which `_run` does before the stream starts.
        self._start_token: str | None = None
        if self._slot is not None and self.mode == "gtm":
            from csnd.reader.settle import new_start_token

            self._start_token = new_start_token()
        # (told in both forms: a text stream's arrays of them are JSON arrays too)
        self.pool = DecoderPool(self.node, decoders, source.binary, types=source.user_types())
        # resume_csn: what the output already holds (a service restarting
        # over its changelog); the sender drops the re-sent transactions.
        # spill_dir / spill_bytes: where and beyond what a big transaction spills
        # (None: the system's temp directory, `sender.SPILL_BYTES`)
        self.sender = NodeSender(
            self.node,
            source.mode,
            spill_bytes=spill_bytes or SPILL_BYTES,
            spill_dir=spill_dir,
            resume_csn=resume_csn,
            start_token=self._start_token,
        )
        self.out = Outbox(NODE_QUEUE_DEPTH)
        # What the sender released and has not yet been handed on, and the last watermark
        # handed on (`_release`, in whichever thread takes the batch: one at a time).
        self._released: list[NodeItem] = []
        self._last_wm: Csn | None = None
        self._last_confirmable = Lsn(0)
        slot = self._slot
        self._until_lsn: Lsn | None = slot.options.until_lsn if slot is not None else None
        self.wakeup: threading.Event | None = None
        self._write_lines = False  # (set by `start`)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"csnd-node-{self.node}", daemon=True)

    @property
    def slot_name(self) -> str | None:
        """The live node's replication slot (None for a file)."""
        return self._slot.options.slot if self._slot is not None else None

    def start(self, wakeup: threading.Event, *, alone: bool) -> None:
        # Alone in single-node mode the decoders write whole transactions' lines.  (In
        # gtm mode a transaction's CSN comes from a marker the sender reads, so its
        # line is the coordinator's to write.)
        self._write_lines = alone and self.mode == "single"
        self.wakeup = wakeup
        self.thread.start()

    def confirm(self, lsn: Lsn) -> None:
        if self._slot is not None:
            self._slot.confirm(lsn)

    def confirm_final(self, lsn: Lsn) -> None:
        if self._slot is not None:
            self._slot.confirm_final(lsn)

    def stats(self) -> NodeStats:
        slot, file = self._slot, self._file
        sent = self.sender.statistics()
        return NodeStats(
            node=self.node,
            mode=self.mode,
            received_lsn=slot.received_lsn if slot is not None else 0,
            confirmed_lsn=slot.confirmed_lsn if slot is not None else 0,
            read_fraction=file.read_fraction() if file is not None else None,
            reconnecting=slot.reconnecting if slot is not None else False,
            decoded_changes=self.pool.stats.changes,
            inboxes=tuple(self.pool.inbox_depths()),
            released=sent.released,
            dropped_resumed=sent.dropped_resumed,
            watermark_csn=int(sent.watermark or 0),
            waiting_committing=sent.committing,
            waiting_commit=sent.waiting,
            spill_bytes=sent.spilled_bytes,
        )

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
        try:
            if self._start_token is not None and not self._settle_start(self._start_token):
                self._put([EndItem()])  # (stopped while it waited)
                return
            slot = self._slot
            if slot is not None:  # (a live node: a paused stream ends the decoder pool's batch)
                events = slot.events(raw_changes=True, pauses=self.pool)
            else:
                events = self.source.events(raw_changes=True)
            decoded = self.pool.run(
                events,
                write_lines=self._write_lines,
                reports_pauses=slot is not None,
                # Live, a batch the reader decoded itself is released in its thread when this
                # one is idle (csnd.decoder.skeletons): one wake-up fewer a transaction.
                collect_here=self._release_all if slot is not None else None,
            )
            take = self._release
            for lsn, item in decoded:
                if take(lsn, item) and self._stop.is_set():  # (once a decoder batch: soon enough)
                    break
            if not self._stop.is_set():
                self.sender.finish()
            self._put([*self._released, EndItem()])
        except OSError as e:  # reading the source: say which node and file
            where = self._file.path if self._file is not None else "its source"
            err = CsndError(f"cannot read {where}: {e.strerror or e}", node=self.node)
            self._put([*self._released, EndItem(err)])
        except BaseException as e:  # (handed to the merger's thread)
            self._put([*self._released, EndItem(e)])

    def _release(self, lsn: Lsn, item: DecodedItem | BatchEnd) -> bool:
        """One decoded item to the sender; what it released handed on at the batch's end (True then)."""
        if type(item) is DecodedRun:
            self.sender.feed(lsn, item)  # changes release nothing and move no watermark
            return False
        if item is BATCH_END:
            sender = self.sender
            wm, confirmable = sender.watermark, sender.confirmable_lsn
            # A source that ends at an LSN (--until-lsn) hands on an idle position only up
            # to it: WAL the server has past that point is not this run's to confirm.
            until = self._until_lsn
            if until is not None and confirmable > until:
                confirmable = max(until, self._last_confirmable)
            if wm is not None and (wm != self._last_wm or confirmable != self._last_confirmable):
                # the last one covers every transaction before it
                self._last_wm, self._last_confirmable = wm, confirmable
                self._released.append(WatermarkItem(wm, confirmable))
            if self._released:
                released, self._released = self._released, []
                self._put(released)
            return True
        for txn in self.sender.feed(lsn, item):
            # (each its own: one event may release several, and the value
            # after the last would confirm past the commits of the others)
            self._released.append(TxnItem(txn, txn.confirmable))
        return False

    def _release_all(self, items: Iterator[tuple[Lsn, DecodedItem | BatchEnd]]) -> None:
        """`_release` for each item of a batch, in the reader's thread (`DecoderPool.run`'s `collect_here`)."""
        take = self._release
        for lsn, item in items:
            take(lsn, item)

    def _settle_start(self, token: str) -> bool:
        """The slot at its position (made now if asked), then the start settled; False if stopped meanwhile."""
        from csnd.reader.settle import settle_start

        slot = self._slot
        assert slot is not None, "only a live node's stream starts mid-way"
        slot.prepare()  # (one query for a slot that exists; `csnd stream --create-slot` makes it here)
        o = slot.options
        return settle_start(o.conninfo, self.node, o.slot, token, self._stop) is not None

    def stop(self) -> None:
        self._stop.set()
        self.source.close()
        self.pool.close()
