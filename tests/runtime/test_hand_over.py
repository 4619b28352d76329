"""Live, the input that hands a transaction over writes it itself; otherwise the merger's thread does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from csnd.core.errors import CsnOrderViolation
from csnd.core.ids import Csn, Lsn, Xid
from csnd.runtime.items import EndItem, NodeItem, TxnItem
from csnd.runtime.merger import HandOver, Merger
from csnd.runtime.switching import SwitchPolicy
from csnd.sender.txn import FinishedTxn
from tests.runtime.queued import EndedLines, QueuedInput


def _txn(csn: int) -> FinishedTxn:
    changes = [(0, 0x100 + csn, f'"lsn": "0/{csn:X}", "body": "t{csn}"')]
    return FinishedTxn(
        "dn1", Csn(csn), None, Xid(700 + csn), Lsn(0x900 + csn), Lsn(0x910 + csn), 5, changes, 1
    )


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30  # a ceiling for a stalled run, not a timing goal
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


class HandingInput(QueuedInput):
    """A queued input that keeps the hand-over it is started with, for the test to hand items over."""

    def start(self, wakeup: threading.Event, *, alone: bool) -> None:
        self.handed = wakeup

    def hand(self, items: list[NodeItem]) -> None:
        """What a pipeline's thread does with what a decoder batch released."""
        self.out.put_many(items)
        self.handed.set()


class ThreadedLines(EndedLines):
    """Keeps the name of the thread each transaction was ended in; `hold` stops the one with that csn."""

    def __init__(self, hold: int | None = None) -> None:
        super().__init__()
        self.threads: dict[int, str] = {}
        self.hold = hold
        self.held = threading.Event()
        self.release = threading.Event()

    def end_transaction(self, csn: Csn, tail: str) -> None:
        if csn == self.hold:
            self.held.set()
            assert self.release.wait(30)
        self.threads[csn] = threading.current_thread().name
        super().end_transaction(csn, tail)


class Running:
    """A merger over one handing input, run in a thread named "merger", past its first wait for input.

    At exit the input ends, and the run must end (a failure it ended with is in `failures`)."""

    def __init__(self, sink: ThreadedLines) -> None:
        self.node = HandingInput("dn1", "single", confirms=False)
        self.merger = Merger([self.node], sink, switching=SwitchPolicy(0.005, 0.005, apply=lambda s: None))
        self.failures: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="merger", daemon=True)

    def _run(self) -> None:
        try:
            self.merger.run()
        except BaseException as e:
            self.failures.append(e)

    def __enter__(self) -> Running:
        self.thread.start()
        _until(lambda: self.merger.switching.live is True, "the merger never waited for input")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            _hand_from(self.node, [EndItem()])
            self.thread.join(30)
        assert not self.thread.is_alive()


def _hand_from(node: HandingInput, items: list[NodeItem], name: str = "input") -> None:
    thread = threading.Thread(target=node.hand, args=(items,), name=name, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()


def test_a_live_transaction_is_written_in_the_thread_that_hands_it_over() -> None:
    sink = ThreadedLines()
    with Running(sink) as run:
        _hand_from(run.node, [TxnItem(_txn(10), Lsn(0x920))])
        # Written before the hand-over returned: in the input's thread, the merger's left asleep.
        assert sink.threads == {10: "input"}
        assert run.merger.hand_over.ran == 1
    assert not run.failures
    assert [csn for csn, _ in sink.ended] == [10]
    assert isinstance(run.merger.hand_over, HandOver)


def test_a_hand_over_during_a_round_wakes_the_merger_and_nothing_waits() -> None:
    """A round under way in the merger's thread (held in its sink): the next hand-over does not wait
    for it, and the transaction it handed over is written by the merger's thread right after."""
    sink = ThreadedLines(hold=10)
    try:
        with Running(sink) as run:
            run.merger.switching.live = False  # (the first as a backlog: the merger's thread writes it)
            _hand_from(run.node, [TxnItem(_txn(10), Lsn(0x920))])
            assert sink.held.wait(30)
            run.merger.switching.live = True
            _hand_from(run.node, [TxnItem(_txn(20), Lsn(0x930))])  # (returns while the round is held)
            assert run.merger.hand_over.ran == 0
            sink.release.set()
            _until(
                lambda: len(sink.ended) == 2, "the transaction handed over during a round was left waiting"
            )
            assert sink.threads == {10: "merger", 20: "merger"}
    finally:
        sink.release.set()
    assert not run.failures


def test_a_failure_in_a_handed_over_round_ends_the_run_not_the_input() -> None:
    """A transaction out of CSN order, written in the input's thread: the hand-over returns, and the
    merger's run raises the violation, naming the node, as if its own round had met it."""
    sink = ThreadedLines()
    with Running(sink) as run:
        _hand_from(run.node, [TxnItem(_txn(20), Lsn(0x930))])
        _hand_from(run.node, [TxnItem(_txn(10), Lsn(0x940))])
        run.thread.join(30)
        assert not run.thread.is_alive(), "the merger went on after a handed-over round failed"
    assert len(run.failures) == 1 and isinstance(run.failures[0], CsnOrderViolation)
    assert run.failures[0].node == "dn1"
    assert [csn for csn, _ in sink.ended] == [20]


@pytest.mark.parametrize("live", [False, None], ids=["draining", "not-yet-waited"])
def test_while_draining_the_merger_thread_writes(live: bool | None) -> None:
    """Draining (or before the merger first waited), an input only wakes the merger: the inputs read on
    while the merger's thread writes."""
    sink = ThreadedLines()
    with Running(sink) as run:
        run.merger.switching.live = live
        _hand_from(run.node, [TxnItem(_txn(10), Lsn(0x920))])
        _until(lambda: len(sink.ended) == 1, "the transaction was never written")
        assert sink.threads == {10: "merger"} and run.merger.hand_over.ran == 0
    assert not run.failures
