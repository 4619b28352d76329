"""What guards a source's slot: `ConfirmTracker` and the node agent's `AckWindow`, against brute-force models.

Invariant 7: a slot is never confirmed past a commit whose transaction is not
durable downstream -- a slot confirmed to an LSN never sends again what
committed before it.  The machines below release transactions whose commits
are out of LSN order (a GTM node releases in CSN order), write and make them
durable at arbitrary moments, and check the tracker after every step.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from csnd.coordinator.wire import BEFORE_ALL, Position
from csnd.core.ids import Csn, Lsn, Xid
from csnd.decoder.change import DecodedRun
from csnd.reader.pgoutput import Begin, Commit, LogicalMessage
from csnd.runtime.confirm import ConfirmTracker
from csnd.runtime.items import TxnItem, WatermarkItem
from csnd.runtime.merger import Merger
from csnd.runtime.window import AckWindow
from csnd.sender import FinishedTxn, NodeSender
from tests.runtime.queued import EndedLines, QueuedInput


class ConfirmMachine(RuleBasedStateMachine):
    """Transactions i = 0..n-1 released in this order; commit LSN c_i (any order), end LSN c_i + 8."""

    @initialize(slots=st.lists(st.integers(1, 200), unique=True, min_size=1, max_size=25))
    def setup(self, slots: list[int]) -> None:
        self.commits = [16 * s for s in slots]  # multiples of 16: c_j < c_i + 8 exactly when c_j <= c_i
        self.tracker = ConfirmTracker()
        self.released = self.written = self.durable = 0
        self.reports: list[int] = []  # the sender's confirmable after each release

    def confirmable(self, released: int) -> int:
        """What a sender may report: the end LSN of a released commit with every commit at or before it released."""
        done = self.commits[:released]
        ok = [c + 8 for c in done if all(j < released for j, cj in enumerate(self.commits) if cj <= c)]
        return max(ok, default=0)

    @precondition(lambda self: self.released < len(self.commits))
    @rule()
    def release(self) -> None:
        self.released += 1
        report = self.confirmable(self.released)
        self.reports.append(report)
        self.tracker.on_release(Lsn(report))

    @precondition(lambda self: self.written < self.released)
    @rule()
    def write(self) -> None:  # a node's transactions reach the sink in release order
        self.written += 1
        self.tracker.on_written()

    @rule()
    def make_durable(self) -> None:
        before = self.tracker.safe
        self.durable = self.written
        assert self.tracker.on_durable() == self.tracker.safe >= before

    @rule(data=st.data())
    def sync_finishes(self, data: st.DataObject) -> None:
        """A background sync that began after the n-th write finishes (the service's group commit)."""
        n = data.draw(st.integers(self.durable, self.written))
        before = self.tracker.safe
        self.durable = n
        assert self.tracker.on_durable(n) == self.tracker.safe >= before

    @invariant()
    def checks(self) -> None:
        self.tracker._check()

    @invariant()
    def never_past_a_commit_that_is_not_durable(self) -> None:
        pending = self.commits[self.durable :]  # not durable: released or not
        assert all(self.tracker.safe <= c for c in pending), (self.tracker.safe, pending)

    @invariant()
    def as_far_as_what_is_durable_allows(self) -> None:
        # The largest report covered by durable transactions: the tracker holds nothing back.
        assert self.tracker.safe == max(self.reports[: self.durable], default=0)

    def teardown(self) -> None:
        # Once everything is released, written and durable, the slot may go to the end of the last commit.
        while self.released < len(self.commits):
            self.release()
        while self.written < self.released:
            self.write()
        self.make_durable()
        self.checks()
        assert self.tracker.safe == max(self.commits) + 8


TestConfirmTracker = ConfirmMachine.TestCase
TestConfirmTracker.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


class WindowMachine(RuleBasedStateMachine):
    """An agent's producer appends batches and watermarks; coordinators acknowledge and subscribe."""

    def __init__(self) -> None:
        super().__init__()
        self.window: AckWindow[str] = AckWindow(capacity=4)  # small: `full` is reached often
        self.next_csn = 1
        self.last_pos: Position = BEFORE_ALL
        self.acked: Position = BEFORE_ALL
        self.model: list[tuple[int, Position, bool]] = []  # (seq, pos, is batch) the window must hold
        self.seq = 0

    def _appended(self, pos: Position, is_batch: bool) -> None:
        kept = self.window.append(pos, f"{pos}", is_batch)
        assert kept == (not is_batch or pos > self.acked)  # only a batch the coordinator has is dropped
        if kept:
            self.seq += 1
            self.model.append((self.seq, pos, is_batch))

    @rule(parts=st.integers(1, 3))
    def produce_transaction(self, parts: int) -> None:
        for index in range(parts):
            self.last_pos = (self.next_csn, index)
            self._appended(self.last_pos, True)
        self.next_csn += 1

    @rule()
    def produce_watermark(self) -> None:
        self._appended(self.last_pos, False)

    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        """An Ack, or a new subscription's `after` (possibly ahead of this agent: it restarted)."""
        received = data.draw(
            st.tuples(st.integers(-1, self.next_csn + 2), st.integers(-1, 3)).map(
                lambda p: p if p[0] >= 0 else BEFORE_ALL
            )
        )
        self.window.ack(received)
        self.acked = max(self.acked, received)
        # The oracle: a batch goes once the coordinator has it; a watermark once a later position is acknowledged.
        self.model = [
            (seq, pos, batch)
            for seq, pos, batch in self.model
            if (pos > self.acked if batch else pos >= self.acked)
        ]

    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        """What a subscriber at `after` that was sent up to `sent_seq` gets next, against a scan of the model."""
        sent_seq = data.draw(st.integers(0, self.seq + 1))
        after = data.draw(st.sampled_from([BEFORE_ALL, self.acked, self.last_pos]))
        entry, new_seq = self.window.next_to_send(sent_seq, after)
        wanted = [
            (seq, pos) for seq, pos, batch in self.model if seq > sent_seq and (not batch or pos > after)
        ]
        if wanted:
            assert entry is not None and (entry.seq, entry.pos) == wanted[0] and new_seq == entry.seq
        else:
            assert entry is None
            assert new_seq == max([sent_seq, *(seq for seq, _, _ in self.model)])

    @invariant()
    def holds_exactly_what_is_unacknowledged(self) -> None:
        self.window._check()
        assert [(e.seq, e.pos, e.is_batch) for e in self.window.entries] == self.model
        assert self.window.full == (len(self.model) >= 4)


TestAckWindow = WindowMachine.TestCase
TestAckWindow.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_an_idle_position_is_confirmed_only_with_what_was_released_before_it() -> None:
    """`on_position` (an idle keepalive's confirmable LSN) becomes safe with the releases before it."""
    t = ConfirmTracker()
    t.on_position(Lsn(100))  # nothing released: safe at the next on_durable
    t._check()
    assert t.on_durable() == 100
    t.on_release(Lsn(200))
    t.on_position(Lsn(300))  # covers the release: waits for it to be written and durable
    t._check()
    assert t.on_durable() == 100
    t.on_written()
    t._check()
    assert t.on_durable() == 300
    t.on_position(Lsn(250))  # an older position never moves `safe` back
    assert t.on_durable() == 300
    t._check()


def test_a_durable_count_outside_what_was_written_is_refused() -> None:
    t = ConfirmTracker()
    t.on_release(Lsn(100))
    t.on_written()
    assert t.on_durable(0) == 0
    assert t.on_durable(1) == 100
    for bad in (0, 2):  # (behind what is durable already; past what was written)
        try:
            t.on_durable(bad)
        except ValueError as e:
            assert "outside 1..1" in str(e)
        else:
            raise AssertionError(f"on_durable({bad}) was accepted")


# --- one event releases several: each carries its own confirmable LSN ------------------------


def _gtm_txn(sender: NodeSender, xid: int, gid: str, csn: int, commit_lsn: int) -> list[FinishedTxn]:
    """Feed one GTM transaction with one change and its commit marker; what it released."""
    first = commit_lsn - 0x40
    out = sender.feed(Lsn(first), Begin(Lsn(commit_lsn), xid * 10, Xid(xid)))
    out += sender.feed(Lsn(first), DecodedRun(None, [Lsn(first)], [f'"x": {xid}']))
    marker = f"commit {gid} {csn}".encode()
    out += sender.feed(Lsn(first + 0x10), LogicalMessage(None, True, Lsn(first + 0x10), "csn", marker))
    out += sender.feed(Lsn(commit_lsn + 0x30), Commit(0, Lsn(commit_lsn), Lsn(commit_lsn + 0x30), xid * 10))
    return out


def test_a_group_released_at_once_never_confirms_past_a_commit_still_in_the_merge() -> None:
    """g1 commits last and frees g2 and g3, which waited behind its committing marker.

    dn2's watermark lets the merge pass only g1 (csn 11); g2 and g3 stay in
    the merge, unwritten.  The slot of dn1 may then be confirmed up to g2's
    commit at most: a restart from further on would never send g2 again.
    """
    sender = NodeSender("dn1", "gtm")
    assert sender.feed(Lsn(0x100), LogicalMessage(None, False, Lsn(0x100), "csn", b"committing g1 10")) == []
    assert _gtm_txn(sender, 702, "g2", 12, 0x200) == []  # waits behind g1's committing csn 10
    assert _gtm_txn(sender, 703, "g3", 13, 0x300) == []
    group = _gtm_txn(sender, 701, "g1", 11, 0x400)
    assert [t.gid for t in group] == ["g1", "g2", "g3"]

    dn1, dn2 = QueuedInput("dn1", "gtm", confirms=True), QueuedInput("dn2", "gtm", confirms=False)
    dn1.out.put_many([TxnItem(t, t.confirmable) for t in group])
    dn2.out.put_many([WatermarkItem(Csn(11))])  # dn2 may still send csn 12
    sink = EndedLines()
    runtime = Merger([dn1, dn2], sink, confirm_interval_s=0.0)
    for _ in range(3):
        for p in (dn1, dn2):
            runtime._poll(p)
        runtime._render()
        runtime._confirm(final=False)
    assert [csn for csn, _ in sink.ended] == [11]
    assert dn1.confirmed and max(dn1.confirmed) <= 0x200, [hex(c) for c in dn1.confirmed]

    # dn2 moves on: g2 and g3 are written, and the slot goes past all three.
    dn2.out.put_many([WatermarkItem(Csn(20))])
    for p in (dn1, dn2):
        runtime._poll(p)
    runtime._render()
    runtime._confirm(final=False)
    assert [csn for csn, _ in sink.ended] == [11, 12, 13]
    assert max(dn1.confirmed) == 0x430


def test_an_abort_that_frees_several_gives_each_its_own_confirmable_lsn() -> None:
    sender = NodeSender("dn1", "gtm")
    sender.feed(Lsn(0x100), LogicalMessage(None, False, Lsn(0x100), "csn", b"committing g1 10"))
    sender.feed(Lsn(0x110), LogicalMessage(None, False, Lsn(0x110), "csn", b"committing g4 10"))
    assert _gtm_txn(sender, 702, "g2", 12, 0x200) == []
    assert _gtm_txn(sender, 703, "g3", 13, 0x300) == []
    assert _gtm_txn(sender, 701, "g1", 11, 0x400) == []  # g4 is still committing at 10
    group = sender.feed(Lsn(0x500), LogicalMessage(None, False, Lsn(0x500), "csn", b"abort g4"))
    assert [t.gid for t in group] == ["g1", "g2", "g3"]
    for i, t in enumerate(group):
        assert all(t.confirmable <= later.commit_lsn for later in group[i + 1 :]), (i, hex(t.confirmable))
    assert group[-1].confirmable == sender.confirmable_lsn
