"""The latency histograms when the clocks disagree: a commit time after "now" is never a negative latency.

A commit timestamp comes from the source's clock, "now" from this
machine's; when this machine's wall clock is set back (or runs behind the
source's), a transaction seems to have committed in the future.  Added as
it is, the histogram's sum goes negative and, as Prometheus sums are
counters, every rate() over it breaks: such a span counts as 0.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from csnd.coordinator.globaltxn import NodeCommit
from csnd.coordinator.jsonlines import json_head
from csnd.core.ids import Lsn, Xid
from csnd.service.latency import BUCKETS, LatencyHistogram

EPOCH_2000 = datetime(2000, 1, 1, tzinfo=UTC)


def _line(at: datetime) -> bytes:
    micros = (at - EPOCH_2000) // timedelta(microseconds=1)
    return (json_head(1, None, micros, {"dn1": NodeCommit(Xid(7), Lsn(100), micros)}) + "]}").encode()


def test_a_commit_after_now_counts_as_no_latency() -> None:
    committed = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    h = LatencyHistogram()
    # this machine's clock a day behind the source's (set back by an operator)
    h.observe_lines([_line(committed)], now=(committed - timedelta(days=1)).timestamp())
    buckets, total = h.snapshot()
    assert total == 0.0
    assert buckets[0] == (str(BUCKETS[0]), 1)


@given(st.lists(st.floats(min_value=-1e6, max_value=100.0, allow_nan=False)))
def test_the_sum_never_goes_down(values: list[float]) -> None:
    h = LatencyHistogram()
    sums = []
    for v in values:
        h.observe_many([v])
        sums.append(h.snapshot()[1])
    assert sums == sorted(sums) and all(s >= 0 for s in sums)
    bounds = [*BUCKETS, float("inf")]
    assert [c for _, c in h.snapshot()[0]] == [sum(1 for v in values if max(v, 0.0) <= b) for b in bounds]
