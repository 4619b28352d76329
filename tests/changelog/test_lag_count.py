"""Counting durable records after a CSN (a consumer's lag) without reading them, against a brute-force count."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.changelog.recent import RecentCsns
from csnd.core.errors import CsnOutOfRange
from tests.changelog.helpers import FakeClock

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 50), st.integers(0, 120)),  # csn gap, payload size
        st.tuples(st.just("sync"), st.just(0), st.just(0)),
        st.tuples(st.just("reopen"), st.just(0), st.just(0)),
        st.tuples(st.just("retain"), st.integers(300, 3000), st.just(0)),  # retention_bytes
    ),
    max_size=60,
)


_RETAINED_ONE = [("append", 1, 0)] * 4 + [
    ("append", 1, 72),
    ("append", 1, 120),
    ("append", 1, 0),
    ("retain", 300, 0),
]


# (retention keeps only csn 7: a consumer at 1 gets a lower bound; the newest
# CSNs kept for counting must not still hold the dropped csn 6)
@given(_steps, st.integers(1, 6), st.integers(1, 12), st.lists(st.integers(0, 2000), min_size=1, max_size=8))
@example(steps=_RETAINED_ONE, keep=1, cap=2, probes=[1])
@example(steps=_RETAINED_ONE, keep=2, cap=2, probes=[1])
@example(steps=_RETAINED_ONE, keep=2, cap=2, probes=[0])
def test_count_after_is_the_count_of_durable_records_after_the_csn(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, int, int]],
    keep: int,
    cap: int,
    probes: list[int],
) -> None:
    d = str(tmp_path_factory.mktemp("log"))
    opts = {"segment_bytes": 400, "index_interval": 64, "clock": FakeClock(), "recent_csns": keep}
    log = Changelog(d, **opts)  # type: ignore[arg-type]
    csn = 0
    try:
        for what, a, b in steps:
            if what == "append":
                csn += a
                log.append(csn, b"x" * b)
            elif what == "sync":
                log.sync()
            elif what == "reopen":
                log.close()
                log = Changelog(d, **opts)  # type: ignore[arg-type]
            else:
                log.sync()
                log.retention_bytes = a
                log.apply_retention()
            log._check()
            durable = [c for c, _ in log.read(0)]  # (the oracle: read them all)
            for p in [*probes, *durable[:3], *durable[-3:]]:
                n = sum(1 for c in durable if c > p)
                got = log.count_after(p, cap)
                if _behind_retention(log, p):  # (records after p were dropped: what is left is a lower bound)
                    assert got == (min(n, cap), True), (p, durable)
                else:
                    assert got == ((cap, True) if n >= cap else (n, False)), (p, durable)
    finally:
        log.close()


def _behind_retention(log: Changelog, csn: int) -> bool:
    """Whether retention dropped records after `csn` (as a reader starting there is told)."""
    try:
        next(iter(log.read(csn)), None)
    except CsnOutOfRange:
        return True
    return False


@given(
    st.integers(1, 5),
    st.lists(st.integers(1, 9), max_size=40),
    st.integers(0, 400),
    st.lists(st.integers(0, 400), max_size=3),
)
def test_recent_csns_keeps_every_csn_above_its_floor(
    keep: int, gaps: list[int], probe: int, retained_after: list[int]
) -> None:
    r = RecentCsns(keep)
    csns: list[int] = []
    for i, g in enumerate(gaps):
        csns.append((csns[-1] if csns else 0) + g)
        r.extend(csns[-1:])
        if i < len(retained_after):  # retention drops what is up to a CSN below the newest
            gone = min(retained_after[i], csns[-1] - 1)
            r.drop_through(gone)
            csns = [c for c in csns if c > gone]
        r._check()
    assert r.csns == [c for c in csns if c > r.floor]
    assert len(r.csns) >= min(keep, len(csns)) or r.floor >= csns[0] - 1
    got = r.count_after(probe)
    assert got == (None if probe < r.floor else sum(1 for c in csns if c > probe))
