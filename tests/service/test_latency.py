"""The latency histograms: commit times read off a line, bucket counts against a brute-force count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from csnd.coordinator.globaltxn import NodeCommit
from csnd.coordinator.jsonlines import json_head
from csnd.core.ids import Lsn, Xid
from csnd.service.latency import BUCKETS, LatencyHistogram

EPOCH_2000 = datetime(2000, 1, 1, tzinfo=UTC)


@given(st.integers(min_value=0, max_value=2**52), st.integers(min_value=1, max_value=2**40))
def test_the_commit_time_is_the_lines_own(micros: int, csn: int) -> None:
    line = json_head(csn, None, micros, {"dn1": NodeCommit(Xid(7), Lsn(100), micros)}) + "]}"
    want = (EPOCH_2000 + timedelta(microseconds=micros)).timestamp()
    got = LatencyHistogram().commit_time(line.encode())
    assert got is not None
    assert abs(got - want) < 1e-6


def test_a_line_without_a_commit_time_is_not_observed() -> None:
    h = LatencyHistogram()
    h.observe_lines([b'{"csn": 1, "changes": []}', None, b"not json"], now=10.0)
    buckets, total = h.snapshot()
    assert buckets[-1] == ("+Inf", 0) and total == 0.0


@given(st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False)))
def test_the_buckets_count_as_a_brute_force_count(values: list[float]) -> None:
    h = LatencyHistogram()
    h.observe_many(values)
    buckets, total = h.snapshot()
    bounds = [*BUCKETS, float("inf")]
    assert [c for _, c in buckets] == [sum(1 for v in values if v <= b) for b in bounds]
    assert abs(total - sum(values)) < 1e-6 * (1 + len(values))
