"""The interpreter's switch interval, set by what the merger sees: short while live, long while draining.

A thread that wants the GIL waits up to the switch interval before it makes
the holder let go.  Draining a backlog, every thread of the service wants
the GIL at once and each forced hand-over costs a wake-up and a cache
refill, so csnd.cli raises the interval to 20 ms (docs/performance.md,
"Thread switching").  Live, a transaction crosses half a dozen threads one
after another, each woken by the one before; when the woken thread finds
another running Python it waits that interval, at every hop: at 1,000
one-row transactions a second the p99 from commit to subscriber was
280 ms at 20 ms against 35-47 ms at 5 ms (bench/latency_bench.py, same
load for both readers).

So the merger says which regime it is in: `caught_up` when it is about to
wait for input (live), `backlog` when a round stopped with input still
waiting (draining).  Only a change of regime calls
`sys.setswitchinterval`, so a steady regime costs an attribute test a round.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Final

# Live: Python's own default.  Shorter (1 ms) gave no better latency on the
# bench and costs throughput when load rises before the merger sees a backlog.
LIVE_SWITCH_S: Final = 0.005


class SwitchPolicy:
    """Applies `live_s` while the merger keeps up and `drain_s` while it drains a backlog."""

    __slots__ = ("_apply", "live_s", "drain_s", "live")

    def __init__(
        self, live_s: float, drain_s: float, apply: Callable[[float], None] = sys.setswitchinterval
    ) -> None:
        self._apply = apply
        self.live_s, self.drain_s = live_s, drain_s
        self.live: bool | None = None  # the regime last applied; None: neither yet

    @classmethod
    def around_current(cls) -> SwitchPolicy:
        """Draining at the process's interval as it was set (csnd.cli's), live at the shorter of it and 5 ms."""
        drain_s = sys.getswitchinterval()
        return cls(min(LIVE_SWITCH_S, drain_s), drain_s)

    def caught_up(self) -> None:
        if self.live is not True:
            self.live = True
            self._apply(self.live_s)

    def backlog(self) -> None:
        if self.live is not False:
            self.live = False
            self._apply(self.drain_s)

    def restore(self) -> None:
        """The draining interval again (the process's own), as when the merger ends."""
        if self.live is not None:
            self.live = None
            self._apply(self.drain_s)
