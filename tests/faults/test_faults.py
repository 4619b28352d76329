"""Fault injection on a live 3-server GTM cluster served by `csnd serve`: one fault per run, N seeds a class.

Each run (tests/faults/harness.py) puts steady distributed writers on the
cluster, serves it with `csnd serve` to two subscribers, strikes one fault at
a moment drawn from the seed, drains, and checks docs/design.md section 6 against the
test_decoding witness: nothing lost or doubled, strict CSN order, one
transaction per gid holding every node's changes, no aborted data, values
exact, slots never confirmed past the durable changelog and advancing again,
no stall.  A failing (fault, seed) is added to REGRESSIONS and stays there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd.testing.cluster import LocalCluster
from tests.faults.conftest import record, runs
from tests.faults.faults import CLIENT_PROXIED, FAULTS, PROXIED, SETUP, STOPS
from tests.faults.harness import running

pytestmark = pytest.mark.xdist_group("faults")

# (fault, seed) pairs that once failed: run every time, whatever CSND_FAULT_RUNS says.
REGRESSIONS: list[tuple[str, int]] = [
    ("pg-restart", 1),  # fast shutdown of dn1 hung: csnd could not confirm past an open `committing`
    ("service-kill", 1),  # the kill struck before subscriber fx had connected (a harness race)
    ("subscriber-kill", 1),  # a fast recovery was judged before the sampler had seen it (a harness race)
    ("writer-kill", 6),  # paused after 1 commit, before anything flowed: the harness waited for that flow
]


def _cases() -> Iterator[tuple[str, int]]:
    seen = set()
    for fault in FAULTS:
        for seed in range(1, runs() + 1):
            seen.add((fault, seed))
            yield fault, seed
    for case in REGRESSIONS:
        if case not in seen:
            yield case


# Seconds a run of a class may take past pytest's default: a Spark driver's JVM starts
# in 20 s on an idle 2-core machine but in minutes beside other JVMs and the suite.
SLOW: dict[str, int] = {"spark-kill": 1200}


@pytest.mark.parametrize(
    ("fault", "seed"),
    [pytest.param(f, s, marks=pytest.mark.timeout(SLOW[f])) if f in SLOW else (f, s) for f, s in _cases()],
    ids=lambda x: str(x),
)
def test_fault(cluster: LocalCluster, tmp_path: Path, fault: str, seed: int) -> None:
    with running(
        cluster, tmp_path, fault, seed, proxied=fault in PROXIED, client_proxied=fault in CLIENT_PROXIED
    ) as run:
        if fault in SETUP:
            SETUP[fault](run)
        run.start()
        try:
            FAULTS[fault](run)
            outcome = run.check_clear_stop() if fault in STOPS else run.drain_and_check()
        except AssertionError as e:
            run.outcome.problems.append(f"{type(e).__name__}: {e}")
            outcome = run.outcome
        record(outcome, tmp_path)
    assert outcome.ok, "\n".join([f"{fault} seed {seed}: {outcome.detail}", *outcome.problems])
