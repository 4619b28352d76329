"""The changelog's tail: the newest durable records served from memory, as the segments hold them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.changelog import segment as sg
from csnd.changelog.tail import DurableTail
from tests.changelog.helpers import payload


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_tail_answers_only_for_what_it_holds_whole(data: Any) -> None:
    """Against a list of every durable record: an answer is exactly the records asked for, or None."""
    budget = data.draw(st.integers(0, 400))
    tail = DurableTail(budget)
    durable: list[tuple[int, bytes | None]] = []
    dropped_through = 0
    csn = 0
    for _ in range(data.draw(st.integers(1, 12))):
        step = data.draw(st.sampled_from(["sync", "sync", "sync", "retention"]))
        if step == "retention" and durable:
            dropped_through = data.draw(st.sampled_from([c for c, _ in durable]))
            tail.drop_through(dropped_through)
        else:
            batch: list[tuple[int, bytes | None]] = []
            for _ in range(data.draw(st.integers(0, 6))):
                csn += data.draw(st.integers(1, 3))
                big = data.draw(st.integers(0, 9)) == 0  # (appended in pieces: its payload not at hand)
                batch.append((csn, None if big else payload(csn)[: data.draw(st.integers(0, 90))]))
            tail.extend([c for c, _ in batch], [line for _, line in batch])
            durable += batch
        assert tail.nbytes == sum(map(len, tail.lines)) <= budget
        for after in range(dropped_through, csn + 2):
            until = data.draw(st.one_of(st.none(), st.integers(after, csn + 2)))
            whole_up_to = data.draw(st.one_of(st.none(), st.integers(0, 100)))
            got = tail.after(after, until, whole_up_to)
            want = [(c, line) for c, line in durable if c > after and (until is None or c <= until)]
            if got is not None:
                assert list(zip(*got, strict=True)) == want
                assert all(
                    line is not None and (whole_up_to is None or len(line) <= whole_up_to) for _, line in want
                )
            elif after >= tail.floor:
                assert whole_up_to is not None and any(len(line or b"") > whole_up_to for _, line in want)


def test_records_of_a_small_tail_are_read_back_from_the_segments_once_trimmed() -> None:
    tail = DurableTail(100)
    tail.extend([1, 2, 3], [b"a" * 40, b"b" * 40, b"c" * 40])  # (120 bytes: trimmed to half the budget)
    assert tail.floor == 2 and tail.csns == [3] and tail.nbytes == 40
    assert tail.after(1, None) is None
    assert tail.after(2, None) == ([3], [b"c" * 40])


def _drive(log: Changelog, script: list[tuple[str, int]]) -> list[Any]:
    """Run `script` on `log`; after each step, every read a reader might make, as lists."""
    reads: list[Any] = []
    csn = 0
    for what, n in script:
        if what == "append":
            csns = [csn + k + 1 for k in range(n)]
            log.append_many(csns, [payload(c) for c in csns])
            csn = csns[-1] if csns else csn
        elif what == "large":
            csn += 1
            log.start_record(csn)
            log.write_record(payload(csn))
            log.write_record(b"-" * n)
            log.end_record()
        elif what == "hold":
            log.hold_readers(max(0, csn - n))
        elif what == "release":
            log.release_readers()
        else:
            log.sync()
        for after in range(max(0, csn - 8), csn + 1):
            for until in (None, after + 2):
                reads.append(list(log.read(after, until)))
                reads.append(
                    [
                        (c, r if isinstance(r, bytes) else b"pieces")
                        for c, r in log.read_pieced(after, until, 64)
                    ]
                )
    return reads


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 5)),
        st.tuples(st.just("large"), st.integers(0, 200)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("hold"), st.integers(0, 3)),
        st.tuples(st.just("release"), st.just(0)),
    ),
    max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(script=_STEPS, budget=st.integers(0, 3000))
def test_reads_from_the_tail_are_reads_from_the_segments(
    tmp_path_factory: Any, script: list[tuple[str, int]], budget: int
) -> None:
    """Appends, records written in pieces, syncs and held readers: every read the same, with a tail or without."""
    with_tail = Changelog(str(tmp_path_factory.mktemp("tail")), tail_bytes=budget, segment_bytes=2048)
    without = Changelog(str(tmp_path_factory.mktemp("segments")), tail_bytes=0, segment_bytes=2048)
    try:
        assert _drive(with_tail, script) == _drive(without, script)
    finally:
        with_tail.close()
        without.close()


def test_a_reader_that_keeps_up_reads_no_segment_and_one_behind_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real = sg.read_records

    def spy(path: str, *a: Any) -> Any:
        opened.append(os.path.basename(path))
        return real(path, *a)

    monkeypatch.setattr(sg, "read_records", spy)
    with Changelog(str(tmp_path / "log"), tail_bytes=4096) as log:
        for csn in range(1, 201):
            log.append(csn, payload(csn))
            if csn % 10 == 0:
                log.sync()
        recent = list(log.read(190))
        assert [c for c, _ in recent] == list(range(191, 201)) and not opened
        old = list(log.read(0))
        assert [c for c, line in old] == list(range(1, 201)) and opened
        assert all(line == payload(c) for c, line in old + recent)
