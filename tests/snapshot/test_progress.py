"""Snapshot progress tells only what it knows: an unknown total is shown unknown, never as "done".

Checked against an oracle that keeps the events as given, after every step
of random event sequences (a table planned with an exact chunk count, as the
initial snapshot's, or an estimated one, as an incremental snapshot's).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.snapshot.progress import SnapshotProgress, TableProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Oracle:
    estimated: int  # what the statistics said (0: nothing)
    chunks: int  # planned: exact, or a guess
    exact: bool
    started: bool = False
    done: int = 0
    rows: int = 0
    complete: bool = False
    started_at: float = 0.0
    finished_at: float | None = None

    def check(self, v: TableProgress, now: float) -> None:
        assert v.rows == self.rows and v.chunks_done == self.done, (v, self)
        # the rate: rows over the time from the first chunk's start to now, or to the table's end
        if self.started and self.rows:
            end = now if self.finished_at is None else self.finished_at
            assert v.rows_per_second == self.rows / max(end - self.started_at, 1e-6), (v, self)
        else:
            assert v.rows_per_second == 0.0, (v, self)
        if self.complete:
            assert (v.state, v.rows_estimated, v.eta_seconds) == ("done", self.rows, 0.0), (v, self)
            assert v.chunks == v.chunks_done, v
            return
        assert v.state == ("copying" if self.started else "waiting"), (v, self)
        # a total is shown only while it is still ahead of what was read; else it is unknown (0)
        assert v.rows_estimated == (self.estimated if self.estimated > self.rows else 0), (v, self)
        assert v.chunks == 0 or v.chunks > v.chunks_done, (v, self)  # (never "5 of 1")
        if self.exact:
            assert v.chunks == self.chunks, (v, self)
        if v.rows_estimated == 0 or not self.started or self.rows == 0:
            assert v.eta_seconds == -1.0, (v, self)
        else:
            assert v.eta_seconds > 0, (v, self)


events = st.lists(
    st.one_of(
        st.tuples(st.just("start")),
        st.tuples(st.just("chunk"), st.integers(0, 20_000)),
        st.tuples(st.just("tick"), st.floats(0.001, 10)),
        st.tuples(st.just("end")),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 100_000), st.integers(1, 8), st.booleans(), events)
def test_progress_against_the_oracle(
    estimated: int, chunks: int, exact: bool, steps: list[tuple[Any, ...]]
) -> None:
    clock = Clock()
    p = SnapshotProgress(clock)
    planned = chunks if exact else (-(-estimated // 10_000) if estimated else 0)
    p.add_table("dn1", "public", "t", estimated, planned, chunks_known=exact)
    o = Oracle(estimated, planned, exact)
    (view,) = p.tables()
    o.check(view, clock.now)
    for step in steps:
        if o.complete:
            break
        if step[0] == "start":
            p.chunk_started("dn1", "public", "t")
            o.started_at = o.started_at if o.started else clock.now
            o.started = True
        elif step[0] == "chunk":
            if exact and o.done == o.chunks:
                continue
            if not o.started:
                p.chunk_started("dn1", "public", "t")
                o.started, o.started_at = True, clock.now
            p.chunk_done("dn1", "public", "t", step[1])
            o.done += 1
            o.rows += step[1]
            o.complete = exact and o.done == o.chunks
            if o.complete:
                o.finished_at = clock.now
        elif step[0] == "tick":
            clock.now += step[1]
        elif step[0] == "end" and not exact:
            p.table_done("dn1", "public", "t", o.done)
            o.complete = True
            o.finished_at = clock.now
        (view,) = p.tables()
        o.check(view, clock.now)


def test_a_table_without_statistics_is_not_done_while_it_copies() -> None:
    """The report: `done 60000/60000 rows` and `chunks_done 5, chunks 1` while still copying."""
    p = SnapshotProgress(Clock())
    p.add_table("dn1", "public", "big", 0, 1, chunks_known=False)  # (an incremental snapshot, no reltuples)
    p.chunk_started("dn1", "public", "big")
    for _ in range(5):
        p.chunk_done("dn1", "public", "big", 12_000)
    (v,) = p.tables()
    assert (v.state, v.rows, v.rows_estimated, v.chunks_done, v.chunks, v.eta_seconds) == (
        "copying",
        60_000,
        0,
        5,
        0,
        -1.0,
    )
    p.table_done("dn1", "public", "big", 5)
    (v,) = p.tables()
    assert (v.state, v.rows_estimated, v.chunks_done, v.chunks) == ("done", 60_000, 5, 5)


def test_the_summary_line_says_unknown_when_a_total_is() -> None:
    clock = Clock()
    p = SnapshotProgress(clock)
    p.add_table("dn1", "public", "a", 1_000, 2)
    p.add_table("dn1", "public", "b", 0, 1)  # (no statistics, no key: one chunk of unknown size)
    p.chunk_started("dn1", "public", "a")
    clock.now += 2
    p.chunk_done("dn1", "public", "a", 500)
    assert p.summary() == "0 of 2 tables done, 1 of 3 chunks, 500 rows of an unknown total (250 rows/s)"
    p.chunk_done("dn1", "public", "a", 500)
    p.chunk_started("dn1", "public", "b")
    p.chunk_done("dn1", "public", "b", 300)
    assert p.summary() == "2 of 2 tables done, 3 of 3 chunks, 1,300 of 1,300 rows (650 rows/s)"
    q = SnapshotProgress(clock)
    q.add_table("dn1", "public", "a", 1_000, 2)
    q.chunk_started("dn1", "public", "a")
    clock.now += 1
    q.chunk_done("dn1", "public", "a", 250)
    assert q.summary() == "0 of 1 tables done, 1 of 2 chunks, 250 of 1,000 rows (250 rows/s), eta 3 s"


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 1_000_000),
    st.lists(
        st.tuples(st.integers(1, 60), st.integers(0, 20_000), st.floats(0.001, 10)), min_size=1, max_size=12
    ),
)
def test_a_table_cut_by_pages_is_totalled_by_the_pages_done(
    estimated: int, chunks: list[tuple[int, int, float]]
) -> None:
    """Page ranges: the statistics' estimate until a chunk with rows is in, then its rows over its share
    of the pages (rounded up), shown while ahead of the rows; the ETA is what is left at the rate so far."""
    clock = Clock()
    p = SnapshotProgress(clock)
    pages = sum(c[0] for c in chunks)
    p.add_table("dn1", "public", "t", estimated, len(chunks), pages=pages)
    (v,) = p.tables()
    assert (v.rows_estimated, v.eta_seconds) == (estimated, -1.0)
    started = clock.now
    p.chunk_started("dn1", "public", "t")
    rows = pages_done = 0
    for i, (chunk_pages, chunk_rows, seconds) in enumerate(chunks):
        clock.now += seconds
        p.chunk_done("dn1", "public", "t", chunk_rows, pages=chunk_pages)
        rows, pages_done = rows + chunk_rows, pages_done + chunk_pages
        (v,) = p.tables()
        if i == len(chunks) - 1:
            assert (v.state, v.rows, v.rows_estimated, v.eta_seconds) == ("done", rows, rows, 0.0)
            break
        total = Fraction(rows * pages, pages_done).__ceil__() if rows else estimated
        shown = total if total > rows else 0
        assert (v.state, v.rows, v.rows_estimated) == ("copying", rows, shown), (v, total)
        if shown and rows:
            assert v.eta_seconds == pytest.approx((shown - rows) / (rows / (clock.now - started)))
        else:
            assert v.eta_seconds == -1.0


@given(
    st.integers(0, 1_000_000),
    st.integers(1, 300),
    st.lists(st.tuples(st.integers(1, 60), st.floats(0.01, 10)), min_size=2, max_size=12),
)
def test_stale_statistics_mislead_a_page_range_eta_only_until_the_first_chunk(
    estimated: int, per_page: int, chunks: list[tuple[int, float]]
) -> None:
    """Rows spread evenly over the pages: after the first chunk the total is the true one, whatever the
    statistics said, and the ETA the time the pages left take at the pages' pace so far."""
    clock = Clock()
    p = SnapshotProgress(clock)
    pages = sum(c[0] for c in chunks)
    p.add_table("dn1", "public", "t", estimated, len(chunks), pages=pages)
    p.chunk_started("dn1", "public", "t")
    elapsed, pages_done = 0.0, 0
    for chunk_pages, seconds in chunks[:-1]:
        clock.now += seconds
        elapsed += seconds
        pages_done += chunk_pages
        p.chunk_done("dn1", "public", "t", chunk_pages * per_page, pages=chunk_pages)
        (v,) = p.tables()
        assert v.rows_estimated == pages * per_page
        assert v.eta_seconds == pytest.approx(elapsed * (pages - pages_done) / pages_done)
