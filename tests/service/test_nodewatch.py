"""A node as Status shows it is made from the node's one statistics object (`NodeStats`), nothing else."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from csnd.runtime.stats import NodeStats
from csnd.service.nodes import STUCK_AFTER_S, NodeWatch


class _Input:
    confirms = True

    def __init__(self, stats: NodeStats) -> None:
        self.now = stats

    def stats(self) -> NodeStats:
        return self.now


@dataclass
class _Tracker:
    safe: int


def test_every_figure_comes_from_the_statistics_object() -> None:
    clock = [50.0]
    watch = NodeWatch("dn1", "gtm", "postgresql://h:5432/db", clock=lambda: clock[0])
    stats = NodeStats(
        "dn1",
        "gtm",
        received_lsn=9_000,
        confirmed_lsn=1_000,  # what the source heard; the tracker's safe position wins
        decoded_changes=77,
        inboxes=((3, 4), (1, 4)),
        released=12,
        watermark_csn=400,
        waiting_committing=2,
        waiting_commit=5,
        spill_bytes=4096,
    )
    inp = _Input(stats)
    watch.attach(inp, _Tracker(safe=8_000), waiting_merge=lambda: 3)
    clock[0] = 52.5
    s = watch.snapshot()
    assert (s.name, s.mode, s.state, s.source) == ("dn1", "gtm", "streaming", "postgresql://h:5432/db")
    assert (s.received_lsn, s.confirmed_lsn, s.lag_bytes) == (9_000, 8_000, 1_000)
    assert (s.transactions, s.changes, s.decoded_changes, s.queue_depths) == (12, 77, 77, (3, 1))
    assert (s.watermark_csn, s.waiting_committing, s.waiting_commit, s.waiting_merge) == (400, 2, 5, 3)
    assert s.spill_bytes == 4096 and s.lag_seconds == 2.5  # behind since it was attached
    assert watch.stats() == dataclasses.replace(stats, waiting_merge=3)  # the merge's figure joins the object
    assert not s.stuck
    # the watermark stays while batches wait on the merge: stuck once it has not moved for long enough
    clock[0] += STUCK_AFTER_S + 1
    assert watch.snapshot().stuck
    inp.now = NodeStats("dn1", "gtm", received_lsn=9_000, watermark_csn=401, reconnecting=True)
    s = watch.snapshot()
    assert s.state == "reconnecting" and not s.stuck and s.watermark_csn == 401


def test_a_watch_without_a_run_and_an_agent_input() -> None:
    watch = NodeWatch("dn2", "single", "grpc://10.0.0.2:7000")
    s = watch.snapshot()
    assert (s.state, s.transactions, s.received_lsn, s.queue_depths) == ("streaming", 0, 0, ())
    agent = _Input(
        NodeStats("dn2", "single", confirmed_lsn=640, released=9, watermark_csn=88, agent="10.0.0.2:7000")
    )
    watch.attach(agent, None, waiting_merge=lambda: 0)
    s = watch.snapshot()
    assert (s.transactions, s.confirmed_lsn, s.watermark_csn, s.lag_bytes) == (9, 640, 88, 0)


def test_the_lag_under_a_steady_flow_stays_the_age_of_what_is_unconfirmed() -> None:
    """Data arrives and is confirmed a little later, never all of it: the lag must not grow with time."""
    clock = [100.0]
    watch = NodeWatch("dn1", "gtm", "postgresql://h/db", clock=lambda: clock[0])
    inp = _Input(NodeStats("dn1", "gtm", received_lsn=1_000))
    tracker = _Tracker(safe=1_000)
    watch.attach(inp, tracker, waiting_merge=lambda: 0)
    assert watch.snapshot().lag_seconds == 0
    for step in range(1, 61):  # a minute: every second 1,000 bytes more; confirmed one second behind
        clock[0] = 100.0 + step
        inp.now = NodeStats("dn1", "gtm", received_lsn=1_000 + 1_000 * step)
        tracker.safe = 1_000 * step
        lag = watch.snapshot().lag_seconds
        assert lag <= 2.0, (step, lag)
    # the confirmations stop: the lag grows from when the oldest unconfirmed data had arrived
    clock[0] += 30
    assert watch.snapshot().lag_seconds == 30.0  # (what is unconfirmed had arrived by the last look)
    tracker.safe = 61_000
    assert watch.snapshot().lag_seconds == 0
