"""How long committed transactions take to reach the changelog's disk and the subscribers' streams.

Two histograms of this process, in the Prometheus convention (seconds,
cumulative buckets, a sum and a count), exposed by `csnd.service.metrics`:

* commit to durable: a record's source commit timestamp to the moment the
  changelog's group commit that covered it finished (the sync thread, after
  `finish_sync`);
* commit to sent: to the moment the changefeed handed the batch holding it
  to a subscriber's stream (once per subscriber; a subscriber reading old
  history adds its catch-up, as it should: that is how long it waited).

The commit timestamp is the line's own `commit_time` (docs/design.md
section 7), so both are on the source's clock against this machine's: on
one machine the same clock; across machines their offset is in the figure.
"Now" is this process's steady wall clock (the wall clock read at start,
moved on by the monotonic one), so a clock set forward or back while the
service runs does not turn every latency into a day; one set back before
it started (or a source clock ahead of this one) makes a commit seem to
lie in the future: that span counts as 0, never as a negative latency,
which would make the sum go down and every rate() over it wrong.
An observation costs a substring search and, once per second of commit
times, one datetime parse (each second's epoch is cached), so the hot path
pays well under a microsecond a transaction.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Iterable
from datetime import datetime
from typing import Final

# Upper bounds (seconds) of the buckets: from a fraction of a millisecond, where a
# live transaction should be, to the tens of seconds a falling-behind one waits.
BUCKETS: Final = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_KEY: Final = b'"commit_time": "'
_HEAD: Final = 160  # the key is in a line's head ({"csn": N, "gid": ..., "commit_time": ...)
_SECOND: Final = 19  # "YYYY-MM-DDTHH:MM:SS"
_SCALE: Final = (1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6)  # a fraction of n digits: over _SCALE[n]
# This process's anchor: its wall clock, once, and the monotonic clock then.
_WALL0: Final = time.time()
_MONO0: Final = time.monotonic()


def steady_now() -> float:
    """Epoch seconds that move only as the monotonic clock does (the wall clock as it was at start)."""
    return _WALL0 + (time.monotonic() - _MONO0)


class LatencyHistogram:
    """Counts of latencies per bucket (not cumulative: `snapshot` accumulates), their sum; thread-safe."""

    __slots__ = ("_counts", "_lock", "_sum", "_epochs")

    def __init__(self) -> None:
        self._counts = [0] * (len(BUCKETS) + 1)  # the last: over the largest bound (+Inf)
        self._sum = 0.0
        self._lock = threading.Lock()
        self._epochs: dict[bytes, float] = {}  # "YYYY-MM-DDTHH:MM:SS" -> its epoch seconds

    def observe_lines(self, lines: Iterable[bytes | str | None], now: float | None = None) -> None:
        """One observation per line with a `commit_time`: `now` (`steady_now()`) minus it."""
        at = steady_now() if now is None else now
        got = [at - t for t in map(self.commit_time, lines) if t is not None]
        if got:
            self.observe_many(got)

    def observe_many(self, seconds: Iterable[float]) -> None:
        with self._lock:
            counts = self._counts
            for s in seconds:
                s = max(s, 0.0)  # (a commit "in the future": the clocks disagree, see the docstring)
                counts[bisect_left(BUCKETS, s)] += 1
                self._sum += s

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """([(upper bound as Prometheus writes it, cumulative count)], sum), the last bound "+Inf"."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        out: list[tuple[str, int]] = []
        running = 0
        for bound, c in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
            running += c
            out.append((bound, running))
        return out, total

    def commit_time(self, line: bytes | str | None) -> float | None:
        """A line's `commit_time` as epoch seconds; None when it has none (or is not a line)."""
        if line is None:
            return None
        raw = line.encode() if isinstance(line, str) else line
        at = raw.find(_KEY, 0, _HEAD)
        if at < 0:
            return None
        start = at + len(_KEY)
        second = raw[start : start + _SECOND]
        epoch = self._epochs.get(second)
        if epoch is None:
            try:
                epoch = datetime.fromisoformat(second.decode() + "+00:00").timestamp()
            except ValueError:
                return None
            if len(self._epochs) > 4096:
                self._epochs.clear()
            self._epochs[second] = epoch
        frac = raw[start + _SECOND : start + _SECOND + 7]
        if frac[:1] == b".":
            return epoch + int(frac[1:]) / _SCALE[len(frac) - 1]
        return epoch


# This process's figures (one service a process; tests that start several share them).
COMMIT_TO_DURABLE: Final = LatencyHistogram()
COMMIT_TO_SENT: Final = LatencyHistogram()
