"""When a consumer acknowledges what it has written out: by time or by count, never ahead of the output.

An acknowledgement per transaction is a message per transaction: a wake-up of
the client's request thread, a gRPC write, and a wake-up of the service's
request thread.  Live at 100 one-row transactions a second that was most of
`csnd subscribe`'s 440-500 us of CPU a transaction (docs/performance.md,
"Live latency").  So the newest csn written out is acknowledged once
`interval_s` passed since the last acknowledgement, or `every` lines were
written out since it, whichever comes first; a quiet stream's last line is
acknowledged when its interval ends, without waiting for another line.

The bound this keeps: an acknowledgement names only a csn already written
out (`flushed` is called after the flush), and it trails the output by at
most `interval_s` or `every` lines.  Pure: the caller passes the clock.
"""

from __future__ import annotations

from typing import Final

__all__ = ["ACK_EVERY", "ACK_INTERVAL_S", "AckPacer"]

# Acknowledge at most this often while lines keep coming (the service stores a
# named mark every second anyway: FeedSettings.store_interval_s).
ACK_INTERVAL_S: Final = 0.1
# ... and at least every this many lines written out.
ACK_EVERY: Final = 1000


class AckPacer:
    """The newest csn written out but not acknowledged, and when to acknowledge it."""

    __slots__ = ("interval_s", "every", "pending", "_lines", "_last")

    def __init__(self, now: float, interval_s: float = ACK_INTERVAL_S, every: int = ACK_EVERY) -> None:
        self.interval_s = interval_s
        self.every = every
        self.pending: int | None = None  # written out, not acknowledged yet
        self._lines = 0  # lines written out since the last acknowledgement
        self._last = now  # when the last acknowledgement was taken

    def flushed(self, csn: int, lines: int) -> None:
        """`lines` more lines, through `csn`, are written out (flushed): they may be acknowledged."""
        self.pending = csn
        self._lines += lines

    def due_in(self, now: float) -> float | None:
        """Seconds until the pending acknowledgement is due (0: now); None when nothing is pending."""
        if self.pending is None:
            return None
        if self._lines >= self.every:
            return 0.0
        waited = now - self._last
        # (so, and not `last + interval - now`: a positive difference is never rounded to 0)
        return 0.0 if waited >= self.interval_s else self.interval_s - waited

    def take(self, now: float) -> int | None:
        """The csn to acknowledge now, if one is due."""
        if self.due_in(now) != 0.0:
            return None
        return self.take_all(now)

    def take_all(self, now: float) -> int | None:
        """The pending csn whether due or not (the end of the output)."""
        csn = self.pending
        if csn is not None:
            self.pending = None
            self._lines = 0
            self._last = now
        return csn
