"""Retention's plan against a brute-force oracle: holders keep what they have not read, up to the hold limits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog.retention import Limits, Plan, SegmentInfo, hold_limits, plan


def _oracle(segs: list[SegmentInfo], limits: Limits, now: int, holds: dict[str, int]) -> Plan:
    """Each prefix judged from scratch: the longest one whose every segment may go."""

    def may_go(i: int) -> bool:
        seg = segs[i]
        total = sum(s.size for s in segs[i:])
        age = now - seg.last_time_us
        too_big = limits.bytes is not None and total > limits.bytes
        too_old = limits.age_us is not None and age > limits.age_us
        needed = any(csn < seg.last_csn for csn in holds.values())
        over_hold = (too_big and limits.hold_bytes is not None and total > limits.hold_bytes) or (
            too_old and limits.hold_age_us is not None and age > limits.hold_age_us
        )
        return i < len(segs) - 1 and seg.durable and (too_big or too_old) and (not needed or over_hold)

    drop = 0
    while drop < len(segs) and all(may_go(i) for i in range(drop + 1)):
        drop += 1
    passed = {h: c for h, c in holds.items() if any(c < s.last_csn for s in segs[:drop])}
    # what retention alone would drop after them, had no one held it
    held: dict[str, int] = {}
    for i in range(drop, len(segs) - 1):
        seg = segs[i]
        total = sum(s.size for s in segs[i:])
        too_big = limits.bytes is not None and total > limits.bytes
        too_old = limits.age_us is not None and now - seg.last_time_us > limits.age_us
        if not (seg.durable and (too_big or too_old)) or not all(segs[j].durable for j in range(drop, i)):
            break
        for h, c in holds.items():
            if c < seg.last_csn:
                held[h] = held.get(h, 0) + seg.size
    return Plan(drop, held, passed)


@st.composite
def _cases(draw: st.DrawFn) -> tuple[list[SegmentInfo], Limits, int, dict[str, int]]:
    n = draw(st.integers(0, 8))
    sizes = draw(st.lists(st.integers(1, 100), min_size=n, max_size=n))
    gaps = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    times = sorted(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)))
    durable = [True] * n
    if n and draw(st.booleans()):
        durable[draw(st.integers(0, n - 1))] = False
    last, segs = 0, []
    for size, gap, t, d in zip(sizes, gaps, times, durable, strict=True):
        last += gap
        segs.append(SegmentInfo(last, size, t, d))
    rb = draw(st.none() | st.integers(0, 400))
    ra = draw(st.none() | st.integers(0, 100))
    hb = None if rb is None else draw(st.none() | st.integers(rb, 800))
    ha = None if ra is None else draw(st.none() | st.integers(ra, 200))
    holds = draw(
        st.dictionaries(st.sampled_from(["a", "b", "parquet"]), st.integers(0, last + 1), max_size=3)
    )
    return segs, Limits(rb, ra, hb, ha), draw(st.integers(0, 200)), holds


@settings(max_examples=2000, deadline=None)
@given(_cases())
def test_the_plan_is_the_oracles(case: tuple[list[SegmentInfo], Limits, int, dict[str, int]]) -> None:
    segs, limits, now, holds = case
    got = plan(segs, limits, now, holds)
    assert got == _oracle(segs, limits, now, holds)
    # and what it means: nothing held is dropped within the hold limits, the newest always stays
    assert got.drop < max(len(segs), 1)
    unheld = plan(segs, limits, now, {})
    assert got.drop <= unheld.drop and not unheld.held and not unheld.passed


def test_hold_limits_default_to_twice_retention_and_may_not_be_below_it() -> None:
    assert hold_limits(100, 1.0, None, None) == Limits(100, 3_600_000_000, 200, 7_200_000_000)
    assert hold_limits(None, None, 5, 2.0) == Limits(None, None, 5, 7_200_000_000)
    with pytest.raises(ValueError, match=r"retention_hold_bytes \(99\) is below retention_bytes \(100\)"):
        hold_limits(100, None, 99, None)
    with pytest.raises(ValueError, match=r"retention_hold_hours \(0.5\) is below retention_hours \(1\)"):
        hold_limits(None, 1.0, None, 0.5)
