"""A node's lag in Status is never negative, whichever of two lookers reads the clock first.

Status is taken by the HTTP server's threads (/api/status, /metrics, the
dashboard) and the gRPC Status call at once, each `NodeWatch.snapshot()`
reading the clock and then the node's figures.  The clock-jump fault class
saw `lag_seconds = -0.011` in /api/status: one look read its "now", another
look then saw the node caught up and moved the caught-up time past it, and
the first one's lag came out negative.  Here the second look runs inside
the first one's clock call, as another thread would between its two steps.
"""

from __future__ import annotations

from csnd.runtime.stats import NodeStats
from csnd.service.nodes import NodeWatch
from tests.service.test_nodewatch import _Input, _Tracker


def test_a_look_overtaken_by_another_shows_no_negative_lag() -> None:
    caught_up = NodeStats("dn1", "gtm", received_lsn=1_000)
    behind = NodeStats("dn1", "gtm", received_lsn=2_000)
    inp = _Input(caught_up)
    tracker = _Tracker(safe=1_000)
    overtaken = [False]
    watch: NodeWatch

    def clock() -> float:
        if overtaken[0]:
            return 10.5
        overtaken[0] = True
        # another look, later, while the node is caught up; then more data arrives
        other = watch.snapshot()
        assert other.lag_seconds == 0
        inp.now = behind
        return 10.0

    watch = NodeWatch("dn1", "gtm", "postgresql://h/db", clock=lambda: 0.0)
    watch.attach(inp, tracker, waiting_merge=lambda: 0)
    watch.clock = clock
    s = watch.snapshot()
    assert s.lag_seconds >= 0, s.lag_seconds
