"""Runs of whole transactions taken at once, against the same transactions taken one by one.

A lone single-node-mode node's whole transactions reach the sender, the
coordinator and the changelog as runs (`decoder.change.WholeTxns`); each of
those stages takes a run in one call where it can.  Each must end in the
state, and raise where, the one-by-one path does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.coordinator import AloneOrder
from csnd.core.errors import CsnOrderViolation, LsnOrderViolation
from csnd.core.ids import Csn, Lsn, Xid
from csnd.decoder.change import WholeTxn, WholeTxns
from csnd.runtime.merger import write_alone
from csnd.sender import FinishedTxn, NodeSender
from csnd.sender.ordering import CsnOrderer
from tests.runtime.queued import EndedLines

# Steps between consecutive commits: a commit's csn and how far past it its tick
# lies (single-node mode: the csn is the commit LSN, the tick its end LSN - 1).
# A step of 0 or less breaks the order somewhere.
_RUN = st.lists(st.tuples(st.integers(-3, 40), st.integers(0, 30)), min_size=1, max_size=12)


def _orderer(before: list[tuple[int, int]], tick_first: int | None) -> CsnOrderer[int]:
    o: CsnOrderer[int] = CsnOrderer("dn1")
    if tick_first is not None:
        o.tick(Csn(tick_first))
    for k, (csn, tick) in enumerate(before):
        o.commit(k, Csn(csn), tick=Csn(csn + tick))
    return o


def _state(o: CsnOrderer[int]) -> tuple[object, ...]:
    return (o.watermark, o.released_count, o._last_released, o._tick)


@settings(max_examples=300, deadline=None)
@given(before=_RUN, run=_RUN, tick_first=st.none() | st.integers(0, 200))
def test_a_run_of_commits_is_taken_as_its_commits_one_by_one(
    before: list[tuple[int, int]], run: list[tuple[int, int]], tick_first: int | None
) -> None:
    prior, csn = [], 100 + (tick_first or 0)
    for step, tick in before:
        csn += abs(step) + 1
        prior.append((csn, tick))
        csn += tick
    csns, ticks = [], []
    for step, tick in run:
        csn += step
        csns.append(Csn(csn))
        ticks.append(Csn(csn + tick))
        csn += tick
    together = _orderer(prior, tick_first)
    start = _state(together)
    taken = together.commit_run(csns, ticks)

    one_by_one = _orderer(prior, tick_first)
    released: list[int] = []
    failed = False
    try:
        for k, (c, t) in enumerate(zip(csns, ticks, strict=True)):
            released += one_by_one.commit(1000 + k, c, tick=t)
    except CsnOrderViolation:
        failed = True
    if taken:
        assert not failed and released == [1000 + k for k in range(len(csns))]
        assert _state(together) == _state(one_by_one)
    else:
        assert failed  # (nothing is committing here: only a broken order is refused)
        assert _state(together) == start  # refused, it changed nothing
    together._check()


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.integers(-2, 5), min_size=1, max_size=10), last=st.integers(-1, 20))
def test_a_run_is_taken_by_the_coordinator_only_if_each_would_pass(steps: list[int], last: int) -> None:
    csns, c = [], 10
    for step in steps:
        c += step
        csns.append(Csn(c))
    together, one = AloneOrder("dn1"), AloneOrder("dn1")
    together.last_csn = one.last_csn = Csn(last)
    passed = True
    try:
        for k, csn in enumerate(csns):
            one.check(csn, None, Xid(700 + k), Lsn(0x100 + k))
    except CsnOrderViolation:
        passed = False
    assert together.take_run(csns) == passed
    assert together.last_csn == (csns[-1] if passed else last)  # (refused, it took nothing)


def test_lines_appended_together_are_the_bytes_of_lines_appended_one_by_one(tmp_path: Path) -> None:
    lines = [f'{{"csn": {c}, "text": "é{c}"}}'.encode() for c in range(1, 400)]
    csns = list(range(1, 400))
    clock = lambda: 1_700_000_000.0  # noqa: E731  (one time for every record: the bytes compare)
    with Changelog(str(tmp_path / "one"), segment_bytes=4096, clock=clock, monotonic=lambda: 0.0) as log:
        for csn, line in zip(csns, lines, strict=True):
            log.append(csn, line)
        log.sync()
    with Changelog(str(tmp_path / "run"), segment_bytes=4096, clock=clock, monotonic=lambda: 0.0) as log:
        for at in range(0, len(csns), 37):
            log.append_many(csns[at : at + 37], lines[at : at + 37])
        log.sync()
    one = {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir() if p.name != "LOCK"}
    run = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.name != "LOCK"}
    assert len(one) > 4 and one == run  # (segments and their indexes, cut at the same records)


def test_a_bad_line_in_a_run_stops_it_where_append_would(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.append(5, b"five")
        with pytest.raises(ValueError, match="changelog append of csn 6 after csn 7: not increasing"):
            log.append_many([7, 6, 8], [b"seven", b"six", b"eight"])
        log.sync()
        assert [csn for csn, _ in log.read(0)] == [5, 7]  # (the ones before the bad one are appended)


def _run_of(first_commit: int, n: int, bad: int | None = None) -> WholeTxns:
    """`n` whole one-change transactions from commit LSN `first_commit` on; `bad`: one whose Begin lies."""
    txns, lines = [], []
    for k in range(n):
        commit = first_commit + 0x100 * k
        final = commit + 8 if k == bad else commit
        whole = WholeTxn(
            Lsn(commit - 0x40),
            Lsn(final),
            0,
            Xid(700 + k),
            None,
            [Lsn(commit - 0x20)],
            Lsn(commit),
            0,
            Lsn(commit),
            Lsn(commit + 0x10),
            5,
        )
        txns.append(whole)
        lines.append(f"line {k}")
    return WholeTxns(txns, lines)


def _released(out: list[FinishedTxn]) -> list[int]:
    return [csn for t in out for csn in (t.written.csns if t.written is not None else [t.csn])]


def test_a_run_past_a_restart_is_released_at_once_and_one_across_it_drops_the_resent() -> None:
    after = NodeSender("dn1", "single", resume_csn=Csn(0x900))
    out = after.feed(Lsn(0), _run_of(0x1000, 4))
    assert len(out) == 1 and _released(out) == [0x1000, 0x1100, 0x1200, 0x1300]  # (one release: the run)
    across = NodeSender("dn1", "single", resume_csn=Csn(0x1100))
    out = across.feed(Lsn(0), _run_of(0x1000, 4))
    assert _released(out) == [0x1200, 0x1300] and across.statistics().dropped_resumed == 2
    assert out[-1].confirmable == 0x1310


def test_an_error_inside_a_run_comes_after_the_transactions_before_it() -> None:
    """As when each was fed apart: those before the bad one are released, its error comes with the next call."""
    sender = NodeSender("dn1", "single")
    out = sender.feed(Lsn(0), _run_of(0x1000, 4, bad=2))
    assert _released(out) == [0x1000, 0x1100]
    with pytest.raises(LsnOrderViolation, match="commits at 0/1200 but its Begin announced 0/1208"):
        sender.finish()
    first_bad = NodeSender("dn1", "single")
    with pytest.raises(LsnOrderViolation):
        first_bad.feed(Lsn(0), _run_of(0x1000, 2, bad=0))


def test_a_run_out_of_order_at_the_coordinator_writes_the_lines_before_the_bad_one(tmp_path: Path) -> None:
    sender = NodeSender("dn1", "single")
    (txn,) = sender.feed(Lsn(0), _run_of(0x1000, 3))
    order = AloneOrder("dn1")
    order.last_csn = Csn(0x1000)  # (as if the first had been written already: it breaks the order)
    sink = EndedLines()
    with pytest.raises(CsnOrderViolation, match="released after csn 4096"):
        write_alone(sink, txn, order)
    assert sink.ended == []
    order = AloneOrder("dn1")
    txn.written.csns[2] = Csn(0x1100)  # type: ignore[union-attr]  # (the third repeats the second's csn)
    with pytest.raises(CsnOrderViolation):
        write_alone(sink, txn, order)
    assert [line for _, line in sink.ended] == ["line 0", "line 1"]
