"""The GTM sequencer and the marker texts."""

from __future__ import annotations

import threading

import pytest

from csnd.core import markers
from csnd.gtm.sequencer import Gtm


def test_next_is_strictly_increasing_and_current_follows() -> None:
    g = Gtm()
    assert g.current() == 0
    assert [g.next() for _ in range(3)] == [1, 2, 3]
    assert g.current() == 3
    assert Gtm(start=41).next() == 42
    with pytest.raises(ValueError):
        Gtm(start=-1)


def test_concurrent_next_hands_out_each_csn_once() -> None:
    g = Gtm()
    got: list[list[int]] = [[] for _ in range(8)]

    def work(out: list[int]) -> None:
        for _ in range(2000):
            out.append(g.next())
            assert g.current() >= out[-1]

    threads = [threading.Thread(target=work, args=(o,)) for o in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = sorted(x for o in got for x in o)
    assert flat == list(range(1, 16001))
    assert all(o == sorted(o) for o in got), "each thread sees its CSNs increase"
    assert g.current() == 16000


def test_markers_round_trip() -> None:
    cases = [
        (markers.committing("g-1", 41), ("committing", "g-1", 41)),
        (markers.commit("g-1", 42), ("commit", "g-1", 42)),
        (markers.abort("g-2"), ("abort", "g-2", None)),
        (markers.cid(3), ("cid", None, 3)),
        (markers.tick(40), ("tick", None, 40)),
    ]
    for text, want in cases:
        assert tuple(markers.parse_marker(text)) == want
        assert tuple(markers.parse_marker(text.encode())) == want
    assert markers.TRANSACTIONAL == {
        "committing": False,
        "commit": True,
        "abort": False,
        "cid": True,
        "tick": False,
    }


@pytest.mark.parametrize("bad", ["", "commit g-1", "commit g-1 x", "tick", "cid 1 2", "hello 1", "abort"])
def test_malformed_markers(bad: str) -> None:
    with pytest.raises(ValueError, match="malformed csn marker"):
        markers.parse_marker(bad)
