"""Micro-batch ends and partition cuts, against brute force; the source's options."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.consumers.spark.options import KNOWN, parse_options
from csnd.consumers.spark.ranges import end_after, offset, offset_csn, split_range
from csnd.core.errors import ConfigError


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 10**6),
    st.integers(0, 10**4),
    st.integers(1, 9),
    st.sets(st.integers(1, 10**6 + 10**4), max_size=40),
    st.integers(0, 10**6),
)
def test_split_covers_the_range_exactly(
    start: int, width: int, parts: int, txns: set[int], floor: int
) -> None:
    end = start + width
    for seen in ([], sorted(txns)):
        ranges = split_range(start, end, parts, seen, floor)
        if end <= start:
            assert ranges == []
            continue
        assert 1 <= len(ranges) <= parts
        assert ranges[0][0] == start and ranges[-1][1] == end
        for (lo, hi), (lo2, _) in itertools.pairwise(ranges):
            assert lo < hi == lo2  # contiguous, none empty by CSN
        # Every transaction of the range lands in exactly one partition.
        for csn in txns:
            owners = [r for r in ranges if r[0] < csn <= r[1]]
            assert len(owners) == (1 if start < csn <= end else 0)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 100),
    st.lists(st.integers(1, 50), max_size=30),
    st.none() | st.integers(1, 10),
    st.integers(0, 2000),
)
def test_end_is_the_nth_transaction(start: int, gaps: list[int], limit: int | None, extra: int) -> None:
    csns = []
    c = start
    for g in gaps:
        c += g
        csns.append(c)
    newest = (csns[-1] if csns else start) + extra
    counted = csns if limit is None else csns[:limit]
    end = end_after(start, counted, limit, newest)
    taken = [x for x in csns if start < x <= end]
    if limit is not None and len(csns) >= limit:
        assert taken == csns[:limit]  # whole transactions: exactly the first N, never part of one
    else:
        assert end == newest and taken == csns
    assert end >= start


def test_partitions_cut_at_seen_transactions_are_balanced() -> None:
    seen = list(range(10, 1010, 10))  # 100 transactions
    ranges = split_range(0, 1000, 4, seen)
    counts = [sum(lo < c <= hi for c in seen) for lo, hi in ranges]
    assert counts == [25, 25, 25, 25]


def test_offsets() -> None:
    assert offset_csn(offset(42)) == 42
    for bad in ({"csn": -1}, {"csn": "4"}, {"offset": 4}, 4, {"csn": True}):
        with pytest.raises(ValueError, match="not a csnd offset"):
            offset_csn(bad)


def test_options_parse() -> None:
    o = parse_options(
        {
            "TARGET": "grpc://h:7",
            "startingcsn": "5",
            "tables": ' public.a , s."b.c"',
            "maxTransactionsPerTrigger": "3",
        },
        stream=True,
    )
    assert (o.target, o.starting_csn, o.tables, o.max_transactions) == ("h:7", 5, ("public.a", 's."b.c"'), 3)
    b = parse_options(
        {"target": "h:7", "endingCsn": "9", "numPartitions": "4", "connectTimeout": "0.5"}, stream=False
    )
    assert (b.ending_csn, b.partitions, b.connect_timeout) == (9, 4, 0.5)


@pytest.mark.parametrize(
    ("options", "stream", "says"),
    [
        (
            {"target": "h:7", "maxTransactionPerTrigger": "3"},
            True,
            "unknown option 'maxTransactionPerTrigger'",
        ),
        ({}, True, "option target"),
        ({"target": "nohost"}, True, "not HOST:PORT"),
        ({"target": "h:7", "startingCsn": "x"}, True, "startingCsn='x' is not a whole number"),
        ({"target": "h:7", "startingCsn": "-1"}, False, "must be at least 0"),
        ({"target": "h:7", "maxTransactionsPerTrigger": "0"}, True, "must be at least 1"),
        ({"target": "h:7", "endingCsn": "5"}, True, "endingCsn is for batch reads"),
        ({"target": "h:7", "maxTransactionsPerTrigger": "5"}, False, "is for streams"),
        ({"target": "h:7", "startingCsn": "9", "endingCsn": "5"}, False, "before startingCsn"),
        ({"target": "h:7", "tables": "nodot"}, True, "not SCHEMA.TABLE"),
        ({"target": "h:7", "connectTimeout": "soon"}, True, "connectTimeout"),
        ({"target": "h:7", "path": "/x"}, False, "takes no path"),
    ],
)
def test_bad_options_are_one_clear_error(options: dict[str, str], stream: bool, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_options(options, stream=stream)
    text = str(e.value)
    assert says in text and text.startswith("csnd source: ") and "\n" not in text
    if "unknown option" in says:
        assert all(k in text for k in KNOWN)
