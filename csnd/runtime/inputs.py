"""What the coordinator runtime reads: one `NodeInput` per node, local or remote.

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
from typing import TYPE_CHECKING, Final, Protocol, TypeGuard

from csnd.core.errors import CsndError
from csnd.core.ids import Csn
from csnd.decoder.change import DecodedRun
from csnd.decoder.pool import BATCH_END, DecoderPool
from csnd.runtime.items import EndItem, NodeItem, Outbox, TxnItem, WatermarkItem
from csnd.runtime.stats import NodeStats
from csnd.sender import SPILL_BYTES, NodeSender

if TYPE_CHECKING:  # (only for types: reader.live imports psycopg, which a replay of files never needs)
    from csnd.reader.events import Event
    from csnd.reader.live import LiveSource
    from csnd.reader.recorded import RecordedSource

# Lists of finished transactions (or watermarks) waiting per node between its
# pipeline thread and the coordinator.  Small: the merge keeps its own bounded buffer.
NODE_QUEUE_DEPTH: Final = 64


class NodeInput(Protocol):
    """One node's stream as the coordinator runtime reads it."""

    node: str
    mode: str
    out: Outbox  # what the runtime drains (one consumer thread)
    # Whether the input has a slot behind it that `confirm` moves: only then
    # are its lines tracked for confirmation.
    confirms: bool
    # Whether its items are whole transactions in release order (a local
    # pipeline): a lone such input skips the merge.
    releases_whole: bool

    def start(self, wakeup: threading.Event) -> None:
        """Start producing; `wakeup` is set after each hand-off to `out`."""

    def stop(self) -> None:
        """Stop producing and release what the input holds (idempotent; from any thread)."""

    def confirm(self, lsn: int) -> None:
        """Every transaction of this node committed before `lsn` is durable downstream."""

    def confirm_final(self, lsn: int) -> None:
        """As `confirm`, once the stream has ended: make the slot move even though streaming stopped."""

    def stats(self) -> NodeStats:
        """Where the input is now, for every report of the node (any thread; never waits)."""


class NodeSource(Protocol):
    """What a node pipeline reads: a live node's `LiveSource` or a `RecordedSource` (csnd.reader).

    Besides these, the pipeline looks up by name what a source may have:
    `enum_types`, `on_drained`, `options`, `path` and the progress attributes
    `stats` reads.  A `SlotSource` has a replication slot to confirm as well.
    """

    node: str
    mode: str  # "gtm" or "single" (csnd.core.modes)
    binary: bool  # pgoutput's binary mode: how the decoders read values

    def events(self, raw_changes: bool = False) -> Iterator[Event]:
        """The stream; `raw_changes`: a recorded file's row changes as `ChangeFrames` runs."""

    def confirm(self, lsn: int) -> None:
        """Everything committed before `lsn` is durable downstream (a file: nothing to do)."""

    def close(self) -> None:
        """Stop reading and let go of the source (idempotent; from any thread)."""


class SlotSource(NodeSource, Protocol):
    """A source with a replication slot behind it, confirmed as the output becomes durable."""

    def confirm_final(self, lsn: int) -> None:
        """As `confirm`, once the stream has ended: the slot moves although streaming stopped."""


def _has_slot(source: NodeSource) -> TypeGuard[SlotSource]:
    return hasattr(source, "confirm_final")


if TYPE_CHECKING:

    def _both_sources_fit(live: LiveSource, recorded: RecordedSource) -> tuple[SlotSource, NodeSource]:
        """Never called: mypy checks here that the two sources are what a pipeline reads."""
        return live, recorded


class NodePipeline:
    """reader -> decoder pool -> sender for one node, in its own thread."""

    releases_whole = True

    def __init__(
        self,
        source: NodeSource,
        decoders: int,
        resume_csn: Csn | None = None,
        *,
        spill_dir: str | None = None,
        spill_bytes: int | None = None,
    ) -> None:
        self.source = source
        self.node: str = source.node
        self.mode: str = source.mode
        self._slot = source if _has_slot(source) else None  # (a live node: its slot is ours to confirm)
        self.confirms: bool = self._slot is not None
        # A live gtm node's stream starts mid-way: its sender holds every release until this
        # start is settled (csnd.reader.settle), which `_run` does before the stream starts.
        self._start_token: str | None = None
        if self._slot is not None and self.mode == "gtm":
            from csnd.reader.settle import new_start_token

            self._start_token = new_start_token()
        enums = source.enum_types() if source.binary and hasattr(source, "enum_types") else None
        self.pool = DecoderPool(self.node, decoders, source.binary, enums=enums)
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
        self.wakeup: threading.Event | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"csnd-node-{self.node}", daemon=True)

    def write_whole_lines(self) -> None:
        """This node is the only one: let the decoders write whole transactions' lines (single-node mode).

        Called before `start`.  In gtm mode a transaction's CSN comes from a
        marker the sender reads, so its line is the coordinator's to write.
        """
        if self.mode == "single":
            self.pool.write_lines = True

    def start(self, wakeup: threading.Event) -> None:
        self.wakeup = wakeup
        self.thread.start()

    def confirm(self, lsn: int) -> None:
        if self.confirms:
            self.source.confirm(lsn)

    def confirm_final(self, lsn: int) -> None:
        if self._slot is not None:
            self._slot.confirm_final(lsn)

    def stats(self) -> NodeStats:
        source = self.source
        read_fraction = getattr(source, "read_fraction", None)
        sent = self.sender.statistics()
        return NodeStats(
            node=self.node,
            mode=self.mode,
            received_lsn=int(getattr(source, "received_lsn", 0) or 0),
            confirmed_lsn=int(getattr(source, "confirmed_lsn", 0) or 0),
            read_fraction=read_fraction() if read_fraction is not None else None,
            reconnecting=bool(getattr(source, "reconnecting", False)),
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
        released: list[NodeItem] = []  # handed on at the end of each decoder batch
        try:
            if self._start_token is not None and not self._settle_start(self._start_token):
                self._put([EndItem()])  # (stopped while it waited)
                return
            sender = self.sender
            feed = sender.feed
            last_wm: int | None = None
            last_confirmable = 0
            # A source that ends at an LSN (--until-lsn) hands on an idle
            # position only up to it: WAL the server has past that point is
            # not this run's to confirm, the next run reads it.
            options = getattr(self.source, "options", None)
            until = getattr(options, "until_lsn", None)
            if hasattr(self.source, "on_drained"):  # (a live node: a paused stream ends the batch)
                self.source.on_drained = self.pool.drained
                self.pool.reports_pauses = True
            for lsn, item in self.pool.run(self.source.events(raw_changes=True)):
                if type(item) is DecodedRun:
                    feed(lsn, item)  # changes release nothing and move no watermark
                    continue
                if item is BATCH_END:
                    wm, confirmable = sender.watermark, sender.confirmable_lsn
                    if until is not None and confirmable > until:
                        confirmable = max(until, last_confirmable)
                    if wm is not None and (wm != last_wm or confirmable != last_confirmable):
                        # the last one covers every transaction before it
                        last_wm, last_confirmable = wm, confirmable
                        released.append(WatermarkItem(wm, confirmable))
                    if released:
                        self._put(released)
                        released = []
                    if self._stop.is_set():  # (once a decoder batch: soon enough, and not per event)
                        break
                    continue
                for txn in feed(lsn, item):
                    # (each its own: one event may release several, and the value
                    # after the last would confirm past the commits of the others)
                    released.append(TxnItem(txn, txn.confirmable))
            if not self._stop.is_set():
                sender.finish()
            self._put([*released, EndItem()])
        except OSError as e:  # reading the source: say which node and file
            where = getattr(self.source, "path", None) or "its source"
            err = CsndError(f"cannot read {where}: {e.strerror or e}", node=self.node)
            self._put([*released, EndItem(err)])
        except BaseException as e:  # (handed to the coordinator thread)
            self._put([*released, EndItem(e)])

    def _settle_start(self, token: str) -> bool:
        """The slot at its position (made now if asked), then the start settled; False if stopped meanwhile."""
        from csnd.reader.live import LiveSource
        from csnd.reader.settle import settle_start

        source = self.source
        assert isinstance(source, LiveSource), "only a live node's stream starts mid-way"
        source.prepare()  # (one query for a slot that exists; `csnd stream --create-slot` makes it here)
        o = source.options
        return settle_start(o.conninfo, self.node, o.slot, token, self._stop) is not None

    def stop(self) -> None:
        self._stop.set()
        self.source.close()
        self.pool.close()
