"""CsnMerge against the brute-force oracle of `scenario.py` (docs/design.md invariants 1-3 and 8)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.coordinator.scenario import Harness, Scenario, check_txn, scenarios

# A 2-core shared machine: enough examples to reach the rare interleavings, no per-example deadline.
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Back-pressure limits from "one batch" to "unbounded": tiny ones make wants_more() bite all the time.
max_batches = st.sampled_from([1, 2, 3, 10**9])
max_bytes = st.sampled_from([1, 600, 10**12])


@SETTINGS
@given(sc=scenarios(), max_batches=max_batches, max_bytes=max_bytes, data=st.data())
def test_random_interleavings_match_oracle(
    sc: Scenario, max_batches: int, max_bytes: int, data: st.DataObject
) -> None:
    """Deliveries in a random interleaving, pop_ready() at random points: exactly the oracle's output."""
    h = Harness(sc, max_batches, max_bytes)
    pops = 0
    while any(h.remaining(i) for i in range(len(sc.names))):
        choices = h.eligible()
        pop_allowed = pops < 3 * sum(len(e) for e in sc.events) + 5
        pick = data.draw(st.sampled_from([*choices, -1] if pop_allowed else choices), label="node or pop")
        if pick == -1:
            pops += 1
            h.pop()
        else:
            h.deliver(pick)
    h.finish()


@SETTINGS
@given(sc=scenarios(), data=st.data())
def test_slow_node_last(sc: Scenario, data: st.DataObject) -> None:
    """One node delivers nothing until every other node is done: nothing may overtake what it holds."""
    h = Harness(sc)
    slow = data.draw(st.integers(0, len(sc.names) - 1), label="slow node")
    for i in range(len(sc.names)):
        if i != slow:
            while h.remaining(i):
                h.deliver(i)
                h.pop()
    h.finish()


@SETTINGS
@given(sc=scenarios())
def test_fully_buffered_is_node_order_within_cid(sc: Scenario) -> None:
    """With every batch already here, changes come by cid, then node order, then stream order.

    That is the order the generator's expected.jsonl writes, so a replay whose
    nodes are never late reproduces it byte for byte.
    """
    h = Harness(sc)
    for i in range(len(sc.names)):
        while h.remaining(i):
            h.deliver(i)
    got = h.pop()
    assert [g.csn for g in got] == [t.csn for t in sc.txns]
    for g, t in zip(got, sc.txns, strict=True):
        check_txn(sc, g, t)
        want = sorted(
            ((sc.names[i], c, lsn, b) for i in sorted(t.parts) for c, lsn, b in t.parts[i].changes),
            key=lambda ch: ch[1],
        )
        assert g.changes == want


class MergeMachine(RuleBasedStateMachine):
    """The same oracle as a state machine: deliver from any node the merge wants, pop at any time."""

    h: Harness

    @initialize(sc=scenarios(), max_batches=max_batches, max_bytes=max_bytes)
    def start(self, sc: Scenario, max_batches: int, max_bytes: int) -> None:
        self.h = Harness(sc, max_batches, max_bytes)

    @precondition(lambda self: hasattr(self, "h") and bool(self.h.eligible()))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        self.h.deliver(data.draw(st.sampled_from(self.h.eligible()), label="node"))

    @precondition(lambda self: hasattr(self, "h"))
    @rule()
    def pop(self) -> None:
        self.h.pop()

    @invariant()
    def internally_consistent(self) -> None:
        if hasattr(self, "h"):
            self.h.merge._check()

    def teardown(self) -> None:
        if hasattr(self, "h"):
            self.h.finish()


MergeMachine.TestCase.settings = settings(SETTINGS, stateful_step_count=60)
test_merge_state_machine = MergeMachine.TestCase
