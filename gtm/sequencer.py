"""The GTM: a global, monotonic commit sequence number (CSN) sequencer.

In a GaussDB-style cluster one global transaction manager hands out the CSNs
that order every commit of every node (DESIGN section 2, GTM mode).  The
protocol needs only two operations:

- `current()`: the latest CSN handed out.  A writer logs it as the
  *committing* CSN of a transaction entering its commit, and as the value of a
  `tick` watermark; both rely on every later `next()` being strictly larger.
- `next()`: a new CSN, strictly larger than every CSN handed out before.  It is
  a transaction's *commit* CSN.

The sequencer is pure (no clock, no I/O) so the synthetic generator can replay
it deterministically, and it is guarded by a lock so the live writer helper
(`gtm.writer`) can share one instance between threads.
"""

from __future__ import annotations

import threading

from csnd.core.ids import Csn


class Gtm:
    """A thread-safe monotonic CSN sequencer.

    `start` is the value `current()` returns before the first `next()`; the
    first commit CSN is `start + 1`.  CSN 0 is never handed out, so 0 can mean
    "nothing yet" in watermarks.
    """

    __slots__ = ("_csn", "_lock")

    def __init__(self, start: int = 0) -> None:
        if start < 0:
            raise ValueError(f"gtm start CSN must be >= 0, got {start}")
        self._csn = start
        self._lock = threading.Lock()

    def current(self) -> Csn:
        """The latest CSN handed out (the start value if none yet)."""
        with self._lock:
            return Csn(self._csn)

    def next(self) -> Csn:
        """Hand out a new CSN, strictly larger than every earlier one."""
        with self._lock:
            self._csn += 1
            return Csn(self._csn)

    def __repr__(self) -> str:
        return f"Gtm(current={self._csn})"
