"""When to try again, and when to stop: exponential backoff with full jitter (sans-I/O).

Four loops in csnd retry something that went away: the live reader's
replication connection (`csnd.reader.live`), the changefeed client
(`csnd.consumers.client`), the coordinator's client of a node agent
(`csnd.runtime.remote`) and `csnd serve`'s restart of a failed pipeline
(`csnd.service.serve`).  Each used to double a fixed wait, so everything that
lost the same server at the same moment came back at the same moments too:
every consumer of a restarted service, every agent's coordinator after a
network cut, in lockstep, again and again.  Here each one keeps its own
settings and its own idea of when an outage ends, and takes its waits from
this one policy:

* The *ceiling* starts at `first` and doubles after every wait up to `cap`;
  each wait is drawn uniformly from [0, ceiling] ("full jitter": the AWS
  Architecture Blog's "Exponential Backoff And Jitter" measured it against
  equal and decorrelated jitter; it does the least work in total and spreads
  the callers most).  So every wait is within [0, cap], and the ceiling
  still grows: a connection that comes up and dies at once does not
  reconnect five times a second for ever.

* `give_up`: once an outage has lasted `give_up` seconds, `failed()` says
  stop (None) instead of a wait, and no wait reaches past that moment: the
  last attempt is made at it, not up to a cap later.  None: never by time
  (`csnd serve` counts failures in a window instead).

* An outage ends when the caller says its connection *flowed* -- `flowing()`:
  data arrived, or whatever the caller counts as working -- or, with
  `stable`, when a connection (`connected()`) stayed up that long before it
  failed: an idle stream flows too.  Merely connecting is not enough.  Then
  the ceiling is back to `first` and the give-up clock stops.  The outage
  starts at the first failure, or earlier where the caller says so
  (`lost()`: a client whose first attempt already counts against its
  connect timeout).

The clock and the random source are injected (`random` returns a number in
[0, 1], like `random.random`), so the policy is a pure function of the
events, the times and the draws; a test passes `lambda: 1.0` to get the
ceiling itself.
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """One retry loop's schedule; see the module docstring.

    `failed()` returns how long to wait before the next attempt, or None when
    the outage has lasted `give_up` seconds.  `ceiling` is the bound of the
    next wait (a caller may use it as the next attempt's own timeout);
    `give_up` may be changed between attempts (a client whose first connect
    has a shorter limit than a later reconnect).
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        first: float,
        cap: float,
        give_up: float | None,
        stable: float | None = None,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if (
            not 0 < first <= cap
            or (give_up is not None and give_up < 0)
            or (stable is not None and stable < 0)
        ):
            raise ValueError(
                "backoff needs 0 < first <= cap, give_up >= 0 (or None) and stable >= 0 (or None)"
            )
        self.clock = clock
        self.first, self.cap, self.give_up, self.stable = first, cap, give_up, stable
        self.random = random
        self.down_since: float | None = None  # start of the current outage
        self.ceiling = first  # the bound of the next wait
        self._connected_at: float | None = None
        self._flowed = False

    def lost(self) -> None:
        """The connection is down (or not made yet): the outage starts now, unless it has already."""
        self._flowed = False
        if self.down_since is None:
            self.down_since = self.clock()

    def connected(self) -> None:
        """A new connection is up (not yet an end of the outage: see `flowing` and `stable`)."""
        self._connected_at = self.clock()
        self._flowed = False

    def flowing(self) -> None:
        """The connection works (data arrived): the outage, if any, is over.  Cheap to call per message."""
        if not self._flowed:
            self._flowed = True
            self._reset()

    def failed(self) -> float | None:
        """An attempt failed or a connection dropped: seconds to wait, or None to give up."""
        now = self.clock()
        if (
            self.stable is not None
            and self._connected_at is not None
            and now - self._connected_at >= self.stable
        ):
            self._reset()  # it stayed up: an idle stream flows too
        self._connected_at = None
        self._flowed = False
        if self.down_since is None:
            self.down_since = now
        if self.give_up is not None and now - self.down_since >= self.give_up:
            return None
        draw = self.random()
        if not 0.0 <= draw <= 1.0:
            raise ValueError(f"backoff: the random source gave {draw!r}, not a number in [0, 1]")
        wait = draw * self.ceiling
        self.ceiling = min(self.ceiling * 2, self.cap)
        left = self.left(now)
        return wait if left is None else max(0.0, min(wait, left))

    def left(self, now: float | None = None) -> float | None:
        """Seconds until the current outage reaches `give_up` (None: no limit, or no outage)."""
        if self.give_up is None or self.down_since is None:
            return None
        return self.down_since + self.give_up - (self.clock() if now is None else now)

    def _reset(self) -> None:
        self.down_since = None
        self.ceiling = self.first

    def _check(self) -> None:
        assert self.first <= self.ceiling <= self.cap
        assert self.give_up is None or self.give_up >= 0
        if self.down_since is None:
            assert self.ceiling == self.first
