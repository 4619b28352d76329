"""The merger: node inputs in, one CSN-ordered stream of transactions out through a sink.

    NodeInput dn1 ─ Outbox ─┐                                        ┌─► Sink (JSON lines, changelog)
    NodeInput dn2 ─ Outbox ─┼─► poll ─► CsnMerge ─► render (lines) ──┤
    NodeInput dnK ─ Outbox ─┘   (this thread; back-pressure:         └─ make_durable ─► confirm each
                                 a node is read only while the          ConfirmTracker's safe LSN
                                 merge wants more of it)                to its input's slot

The work is done in rounds: take from each input what the merge wants
(`_poll`), hand the merge's events to the sink as lines (`_render`), then the
timed duties (`_tick`: progress, and once a `confirm_interval_s` make the
sink durable and confirm).  The merger's thread sleeps on the inputs' shared
wake-up event only when a round moved nothing.

Live, the input that hands a transaction over runs the round itself when no
round is under way (`HandOver`): one thread fewer for a transaction to wake
on its way to the changelog.  A lock makes rounds one at a time, whichever
thread runs them; while draining a backlog the merger's own thread runs them
all, so the inputs go on reading while it writes.

With one local node there is nothing to merge: its released transactions are
written in the order they come (`_poll_alone`, `write_alone`), with the
merge's own checks of a node's order kept (`coordinator.alone`).  The merge
of one stream is the identity, and its keys, events and their objects were
two thirds of this thread's work per transaction.

Slots are confirmed only after the sink says the lines are durable: for each
node, the end LSN up to which every committed transaction of that node is
written (`ConfirmTracker`).

The names: `csnd.coordinator` is the merge itself (pure, no threads); this
module runs it, in the thread of whichever process coordinates the nodes --
`csnd replay` or `csnd serve`, with node agents or without.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Final

from csnd.coordinator import (
    JSON_TAIL,
    AloneOrder,
    CsnMerge,
    NodeBatch,
    NodeCommit,
    TxnPart,
    TxnStart,
    json_changes,
    json_head,
)
from csnd.core.errors import CsndError, InternalError
from csnd.core.ids import Csn
from csnd.runtime.confirm import ConfirmTracker
from csnd.runtime.inputs import NodeInput
from csnd.runtime.items import (
    BatchItem,
    EndItem,
    NodeItem,
    TxnItem,
    WatermarkItem,
    cut_batches,
    whole_batch,
    whole_list,
)
from csnd.runtime.jsonsink import OUTPUT_CHUNK_BYTES
from csnd.runtime.replay_progress import ReplayProgress
from csnd.runtime.sinks import GroupCommit, Sink
from csnd.runtime.switching import SwitchPolicy
from csnd.sender import FinishedTxn

# How often the sink is made durable and slots confirmed.  Shorter: a slot
# closer behind the output (less to re-read after a restart); longer: fewer
# fsyncs.
CONFIRM_INTERVAL_S: Final = 1.0
# How long an idle round sleeps at most before looking again (an input wakes it sooner).
IDLE_WAIT_S: Final = 0.2
# Alone, how many transactions between looks at the clock for a due confirmation.
_CLOCK_EVERY: Final = 64


class Merger:
    """Merges `inputs` (in this order: it decides ties and the nodes' order in a line) into `sink`."""

    def __init__(
        self,
        inputs: Sequence[NodeInput],
        sink: Sink,
        progress: ReplayProgress | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        confirm_interval_s: float = CONFIRM_INTERVAL_S,
        durable_always: bool = False,
        switching: SwitchPolicy | None = None,
    ) -> None:
        self.inputs = list(inputs)
        self.sink = sink
        self.progress = progress
        self.clock = clock
        self.confirm_interval_s = confirm_interval_s
        # Make the sink durable on schedule even with no slot to confirm (a
        # service: consumers see only what is durable).
        self.durable_always = durable_always
        self.changes_out = 0  # changes handed to the sink
        # The switch interval by regime: short while caught up, the process's own while draining.
        self.switching = switching if switching is not None else SwitchPolicy.around_current()
        self._stopping = threading.Event()
        self.merge = CsnMerge([p.node for p in self.inputs])
        self.wakeup = threading.Event()
        # One round at a time, in this thread or an input's (`HandOver`); `_rounds_over` is
        # set under it as the loop ends, so no round runs after the run has finished.
        self._round_lock = threading.Lock()
        self._rounds_over = False
        self._handed_failure: BaseException | None = None  # raised by a round an input ran
        self.hand_over = HandOver(self.wakeup, self._round_handed_over)
        # Only an input with a slot has its writes tracked.
        self.confirming = [p for p in self.inputs if p.confirms]
        self.trackers = {p.node: ConfirmTracker() for p in self.confirming}
        lone = self.inputs[0] if len(self.inputs) == 1 else None
        self.alone = AloneOrder(lone.node) if lone is not None and lone.releases_whole else None
        self.ended: set[str] = set()
        # A group-commit sink syncs in its own thread: each confirmation round asks for
        # a sync and confirms what an earlier, finished one covered (_confirm_behind).
        self._group_commit = sink.group_commit
        self._durable_asks: deque[tuple[int, dict[str, int]]] = deque()  # (ticket, written per node)
        self._asked_at_ended = -1  # sink.ended at the newest ask
        self._group_commit_now = True
        self.durable_wake = DurableWake(self.wakeup, self._has_unasked)
        if self._group_commit is not None and (self.confirming or durable_always):
            # Group commit takes what is ready, not what a timer allows: a round that
            # ended transactions asks for a sync at once unless one is under way, and
            # the sync's end wakes this thread to ask for what piled up meanwhile --
            # only then: live, a sync usually covers all there was (`DurableWake`).
            self._group_commit.wake_on_durable(self.durable_wake)
        else:
            self._group_commit_now = False
        self._feeding: dict[str, Iterator[NodeBatch] | None] = {}  # each node's transaction being fed in
        # The current transaction's text not yet handed to the sink, and whether its next part is its first.
        self._line: list[str] = []
        self._line_chars = 0
        self._first_part = True
        self._last_confirm = clock()

    # --- the loop -------------------------------------------------------------------

    def run(self) -> None:
        """Until every input has ended and every line is written and durable; raises the first failure."""
        for p in self.inputs:
            # (alone, a local pipeline's decoders may write the lines: `write_alone`)
            p.start(self.hand_over, alone=self.alone is not None)
        try:
            self._loop()
        finally:
            with self._round_lock:
                self._rounds_over = True
            self.switching.restore()

    def _loop(self) -> None:
        inputs, ended, merge, stopping = self.inputs, self.ended, self.merge, self._stopping
        while True:
            self.wakeup.clear()
            with self._round_lock:
                if self._handed_failure is not None:
                    raise self._handed_failure
                if stopping.is_set() or (len(ended) == len(inputs) and not merge.has_pending()):
                    self._rounds_over = True
                    break
                progressed = self._round()
            if not progressed:
                self._check_stall()
                self.switching.caught_up()
                self.wakeup.wait(IDLE_WAIT_S)
        if stopping.is_set():
            # Stopped mid-stream: nothing more leaves the merge (an input
            # stopped now must not count as ended, or a smaller CSN it has not
            # sent could be overtaken).  What was written is made durable and
            # confirmed first, so that a live source's last status update, sent
            # as it stops, carries it; the sources re-send the rest after a restart.
            if self.confirming:
                self._confirm(final=False)
            for p in inputs:
                p.stop()
        self._finish()

    def _round(self) -> bool:
        """Take what the inputs hold, write what the merge lets out, the timed duties; whether
        anything moved.  Only under `_round_lock`."""
        progressed = False
        for p in self.inputs:
            if p.node not in self.ended and self._poll(p):
                progressed = True
        if self._render():
            progressed = True
        if self._group_commit_now:
            self._ask_durable()
        self._tick(self.clock())
        return progressed

    def _round_handed_over(self) -> bool:
        """A round in the calling input's thread, if no round is under way and the merger keeps up;
        whether it ran (if not, the merger's thread is woken to run it).

        A failure is kept for the merger's thread to raise: the run fails as if its own
        round had met it, and the input goes on as after any hand-over.
        """
        if self.switching.live is not True or self._handed_failure is not None:
            return False  # (draining: the inputs read on while the merger's thread writes)
        if not self._round_lock.acquire(blocking=False):
            return False
        try:
            if self._rounds_over or self._stopping.is_set():
                return False
            # (again while a round moves something: one may stop early, for a confirmation due)
            while self._round() and self.switching.live is True:
                pass
        except BaseException as e:
            self._handed_failure = e
            return False
        finally:
            self._round_lock.release()
        # A round that met a backlog left the rest to the merger's thread (`switching`).
        return self.switching.live is True

    def request_stop(self) -> None:
        """Make `run()` return soon, with everything written so far durable and confirmed (any thread)."""
        self._stopping.set()
        self.wakeup.set()

    def _poll(self, p: NodeInput) -> bool:
        """Take from `p` while the merge wants more of it; whether anything moved."""
        if self.alone is not None:
            return self._poll_alone(p)
        node, merge, out = p.node, self.merge, p.out
        tracker = self.trackers.get(node)
        progressed = False
        # A transaction goes in batch by batch, only while the merge wants
        # more, so a huge (spilled) one is never read in whole.
        while merge.wants_more(node):
            if self._feed_more(node):
                progressed = True
                continue
            try:
                item = out.get_nowait()
            except queue.Empty:
                break
            progressed = True
            if not self._take(node, tracker, item):
                break
        else:  # (the merge holds all it may of this node, with more waiting: a backlog)
            self.switching.backlog()
        return progressed

    def _feed_more(self, node: str) -> bool:
        """The next batch of the node's transaction being fed in, if any; whether one was added."""
        batches = self._feeding.get(node)
        if batches is None:
            return False
        batch = next(batches, None)
        if batch is None:
            self._feeding[node] = None
            return False
        self.merge.add_batch(node, batch)
        return True

    def _take(self, node: str, tracker: ConfirmTracker | None, item: NodeItem) -> bool:
        """One item of `node` into the merge; False once the node has ended."""
        if isinstance(item, TxnItem):
            if tracker is not None:
                tracker.on_release(item.confirmable)
            whole = whole_batch(item.txn)
            if whole is not None:
                self.merge.add_batch(node, whole)
            else:
                self._feeding[node] = cut_batches(item.txn)
        elif isinstance(item, BatchItem):  # a node agent's, already cut
            if item.confirmable is not None and tracker is not None:
                tracker.on_release(item.confirmable)
            self.merge.add_batch(node, item.batch)
        elif isinstance(item, WatermarkItem):
            self.merge.add_watermark(node, item.csn)
            if item.confirmable is not None and tracker is not None:
                tracker.on_position(item.confirmable)
        else:
            self._end(node, item)
            return False
        return True

    def _poll_alone(self, p: NodeInput) -> bool:
        """The lone local node: its transactions straight to the sink, a bounded round at a time.

        A round ends after as many transactions as the merge would hold or,
        for a node with a slot, once a confirmation is due, so a node that
        releases faster than its lines are written still gets its slot
        confirmed on time by `_tick`.
        """
        assert self.alone is not None
        node, out, sink, order = p.node, p.out, self.sink, self.alone
        tracker = self.trackers.get(node)
        limit = self.merge.max_pending_batches
        clock, interval = self.clock, self.confirm_interval_s
        progressed = False
        unclocked = 0  # transactions written since the clock was last looked at
        for _ in range(limit):
            if tracker is not None and unclocked >= _CLOCK_EVERY:
                unclocked = 0
                if clock() - self._last_confirm >= interval:
                    break
            try:
                item = out.get_nowait()
            except queue.Empty:
                break
            progressed = True
            if type(item) is TxnItem:
                written = item.txn.written
                unclocked += 1 if written is None else len(written.csns)  # (a run: as many as it holds)
                if tracker is not None:
                    tracker.on_release(item.confirmable)
                    self.changes_out += write_alone(sink, item.txn, order)
                    tracker.on_written()
                else:
                    self.changes_out += write_alone(sink, item.txn, order)
            elif not self._take(node, tracker, item):
                break
        else:  # (a whole round's worth was waiting: a backlog)
            self.switching.backlog()
        return progressed

    def _end(self, node: str, item: EndItem) -> None:
        if item.error is not None:
            raise item.error
        self.merge.node_ended(node)
        self.ended.add(node)

    # --- output ---------------------------------------------------------------------

    def _render(self) -> bool:
        """The merge's ready events as lines to the sink; whether there were any.

        A transaction's line is gathered and handed to the sink once (most
        lines are short); a big one goes out part by part.
        """
        events = self.merge.pop_events()
        if not events:
            return False
        sink, trackers = self.sink, self.trackers
        line, line_chars, first_part = self._line, self._line_chars, self._first_part
        for ev in events:
            if isinstance(ev, TxnStart):
                if ev.relations:  # (taken before their transaction: kept or written, as the sink says)
                    sink.relations(ev.csn, ev.relations)
                sink.start_transaction(ev.csn)
                line = [json_head(ev.csn, ev.gid, ev.commit_time, ev.nodes)]
                line_chars = 0
                first_part = True
            elif isinstance(ev, TxnPart):
                self.changes_out += len(ev.changes)
                text = json_changes(ev.node, ev.changes, first_part)
                line.append(text)
                line_chars += len(text)
                first_part = False
                if line_chars >= OUTPUT_CHUNK_BYTES:
                    sink.write("".join(line))
                    line, line_chars = [], 0
            else:
                line.append(JSON_TAIL)
                sink.end_transaction(ev.csn, "".join(line))
                line = []
                for node in ev.nodes:
                    tracker = trackers.get(node)
                    if tracker is not None:
                        tracker.on_written()
        self._line, self._line_chars, self._first_part = line, line_chars, first_part
        return True

    # --- timed duties ---------------------------------------------------------------

    def _tick(self, now: float) -> None:
        if self.progress is not None:
            self.progress.tick(now, self.sink.transactions, self.sink.bytes_out)
        if (self.confirming or self.durable_always) and now - self._last_confirm >= self.confirm_interval_s:
            if self._group_commit is not None:
                self._confirm_behind(self._group_commit)
            else:
                self._confirm(final=False)
            self._last_confirm = now

    def _ask_durable(self) -> None:
        """A sync of what is new, unless one is under way (its end wakes the loop to ask again)."""
        sink, asks = self._group_commit, self._durable_asks
        assert sink is not None
        sink.raise_failure()  # (a failed sync ends the run now, appends or not)
        if sink.ended != self._asked_at_ended and (not asks or asks[-1][0] <= sink.durable_ticket):
            self._asked_at_ended = sink.ended
            asks.append((sink.request_durable(), self._written()))

    def _has_unasked(self) -> bool:
        """Whether a transaction ended since the newest ask, or the sync failed (the sync thread asks)."""
        sink = self._group_commit
        return sink is None or sink.ended != self._asked_at_ended or sink.failed

    def _confirm_behind(self, sink: GroupCommit) -> None:
        """Ask for a sync of what is new; move each slot to what the syncs finished so far cover."""
        asks = self._durable_asks
        sink.raise_failure()
        if not self._group_commit_now and sink.ended != self._asked_at_ended:
            self._asked_at_ended = sink.ended
            asks.append((sink.request_durable(), self._written()))
        done = sink.durable_ticket
        covered: dict[str, int] | None = None
        while asks and asks[0][0] <= done:
            covered = asks.popleft()[1]
        if covered is None and not asks:  # nothing new since the last finished sync: all is durable
            covered = self._written()
        if covered is not None:
            for p in self.confirming:
                p.confirm(self.trackers[p.node].on_durable(covered[p.node]))

    def _written(self) -> dict[str, int]:
        """How many transactions each confirming node has had written so far."""
        return {p.node: self.trackers[p.node].written for p in self.confirming}

    def _confirm(self, final: bool) -> None:
        """Make the sink durable, then move each slot to what that covers."""
        self.sink.make_durable()
        self._durable_asks.clear()  # (covered: everything written is durable now)
        self._asked_at_ended = -1
        for p in self.confirming:
            safe = self.trackers[p.node].on_durable()
            if final:
                p.confirm_final(safe)
            else:
                p.confirm(safe)

    def _check_stall(self) -> None:
        if len(self.ended) == len(self.inputs) and self.merge.has_pending():
            raise CsndError("merge stalled with transactions pending after every node ended; this is a bug")

    def _finish(self) -> None:
        if self.confirming:
            self._confirm(final=True)
        else:
            self.sink.make_durable()


class HandOver(threading.Event):
    """What an input sets after each hand-over: the round run in its own thread, or the merger woken.

    Live, a transaction crossed the input's thread, then the merger's, on its
    way to the changelog: a wake-up and a GIL hand-over each time, for a round
    that is a few dozen microseconds of work.  Now the input runs that round
    itself when it can (`Merger._round_handed_over`) and the merger's thread
    stays asleep; when a round is under way there, or the merger drains a
    backlog, the merger's thread is woken as before.  No hand-over is lost: a
    round under way in the merger's thread either took the item or is followed
    by another, since the wake-up is set after the item was put.
    """

    def __init__(self, wakeup: threading.Event, run_round: Callable[[], bool]) -> None:
        super().__init__()
        self._wakeup = wakeup
        self._run_round = run_round
        self.ran = 0  # rounds run by an input's thread

    def set(self) -> None:
        if self._run_round():
            self.ran += 1
        else:
            self._wakeup.set()


class DurableWake(threading.Event):
    """What the group commit's sync thread sets as each sync finishes: the merger's wake-up, when needed.

    A sync's end woke the merger so that it asks for what piled up during
    the sync.  Live, nothing usually did: the sync covered the one
    transaction there was, and the wake-up was one more thread switch a
    transaction (and a GIL hand-over) for a round that found nothing.  Now
    it passes only when a transaction ended since the merger's newest ask,
    or the sync failed.  No ask is lost: the merger asks whenever no sync
    is under way (`Merger._ask_durable`), and the sync thread updates its
    durable ticket before it sets this, so a transaction ended after this
    look finds the sync over and is asked for by the merger's own round.
    A slot's confirmation of that sync waits for the merger's next round
    (the next input, or `IDLE_WAIT_S`): the slot may trail, never lead.
    """

    def __init__(self, wakeup: threading.Event, wanted: Callable[[], bool]) -> None:
        super().__init__()
        self._wakeup = wakeup
        self._wanted = wanted
        self.passed = 0  # sets that woke the merger
        self.dropped = 0  # sets that found nothing to ask for

    def set(self) -> None:
        if self._wanted():
            self.passed += 1
            self._wakeup.set()
        else:
            self.dropped += 1


def write_alone(sink: Sink, txn: FinishedTxn, order: AloneOrder) -> int:
    """Write the line of a transaction of the only node, as the merge would, after the merge's checks.

    Returns how many changes it holds."""
    written = txn.written
    if written is not None:  # lines written whole by the decoder workers (the common case)
        if not order.take_run(written.csns):
            # As one by one: the lines before the bad one are written, then it raises.
            rows = zip(written.csns, written.xids, written.commit_lsns, written.lines, strict=True)
            for line_csn, xid, commit_lsn, line in rows:
                order.check(line_csn, None, xid, commit_lsn)
                sink.start_transaction(line_csn)
                sink.end_transaction(line_csn, line)
            raise InternalError("a run of transactions out of order passed the order checks one by one")
        _relations_of(sink, txn, written.csns[0])  # (in force from the first of them)
        sink.append_lines(written.csns, written.lines)
        return txn.n_changes
    csn = txn.csn
    order.check(csn, txn.gid, txn.xid, txn.commit_lsn)
    _relations_of(sink, txn, csn)
    head = json_head(
        csn, txn.gid, txn.commit_time, {txn.node: NodeCommit(txn.xid, txn.commit_lsn, txn.commit_time)}
    )
    sink.start_transaction(csn)
    changes = whole_list(txn)
    if changes is not None:  # the common case: one write per line, its text copied once
        # (a bigger transaction goes out batch by batch below: its text is never held whole)
        sink.end_transaction(csn, "".join((head, json_changes(txn.node, changes, True), JSON_TAIL)))
        return len(changes)
    sink.write(head)
    first = True
    count = 0
    for batch in cut_batches(txn):  # a spilled transaction is read back batch by batch
        if batch.changes:
            sink.write(json_changes(txn.node, batch.changes, first))
            first = False
            count += len(batch.changes)
    sink.end_transaction(csn, JSON_TAIL)
    return count


def _relations_of(sink: Sink, txn: FinishedTxn, csn: Csn) -> None:
    """Hand the sink the relation versions first in force with `txn` (at `csn`)."""
    if txn.relations:
        sink.relations(csn, [(txn.node, body) for body in txn.relations])
