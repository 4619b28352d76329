"""Progress lines for long replays: what was written, how fast, how far each file was read.

`csnd replay` of a big recording runs for minutes with nothing on stdout
until lines appear in its output file; with `-v`, or when stderr is a
terminal, it says every few seconds where it is.  Never otherwise: scripts
read stderr for the one error line of DESIGN section 8.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

PROGRESS_INTERVAL_S: Final = 2.0


class ReplayProgress:
    def __init__(
        self,
        stream: TextIO,
        sources: Sequence[Any],
        clock: Callable[[], float] = time.monotonic,
        interval: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.stream = stream
        # Recorded files know how much of them is read; live sources and node agents do not.
        self._files = [(s.node, s.read_fraction) for s in sources if hasattr(s, "read_fraction")]
        self._clock = clock
        self.interval = interval
        self._start = clock()
        self._due = self._start + interval

    def tick(self, now: float, transactions: int, nbytes: int) -> None:
        """Called often from the output loop; writes a line once per interval."""
        if now < self._due:
            return
        self._due = now + self.interval
        elapsed = max(now - self._start, 1e-9)
        read = ", ".join(f"{node} {fraction() * 100:.0f}%" for node, fraction in self._files)
        self.stream.write(
            f"csnd replay: {transactions:,} transactions ({nbytes / 1e6:,.1f} MB) written, "
            f"{transactions / elapsed:,.0f} a second{'; read ' + read if read else ''}\n"
        )
        self.stream.flush()

    def done(self, transactions: int, nbytes: int) -> None:
        elapsed = self._clock() - self._start
        self.stream.write(
            f"csnd replay: done: {transactions:,} transactions ({nbytes / 1e6:,.1f} MB) in {elapsed:.1f} s\n"
        )
        self.stream.flush()
