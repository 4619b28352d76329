"""Progress lines for long replays: what was written, how fast, and where each node is.

`csnd replay` of a big recording runs for minutes with nothing on stdout
until lines appear in its output file; with `-v`, or when stderr is a
terminal, it says every few seconds where it is.  Never otherwise: scripts
read stderr for the one error line of docs/design.md section 8.

Per node it gives how much of a recorded file was read, how many changes
the decoders have done and how full their inboxes are:
full inboxes mean the decoders are the bottleneck, empty ones the reader or
the source -- the first question of whoever is on call.
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
        inputs: Sequence[Any],
        clock: Callable[[], float] = time.monotonic,
        interval: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.stream = stream
        self._inputs = inputs  # NodeInput: .stats()
        self._clock = clock
        self.interval = interval
        self._start = clock()
        self._due = self._start + interval
        self._quiet = False

    def tick(self, now: float, transactions: int, nbytes: int) -> None:
        """Called often from the output loop; writes a line once per interval."""
        if now < self._due:
            return
        self._due = now + self.interval
        elapsed = max(now - self._start, 1e-9)
        nodes = "".join(f"; {st.node}: {st.progress_text()}" for st in (p.stats() for p in self._inputs))
        self._say(
            f"csnd replay: {transactions:,} transactions ({nbytes / 1e6:,.1f} MB) written, "
            f"{transactions / elapsed:,.0f} a second{nodes}\n"
        )

    def done(self, transactions: int, nbytes: int) -> None:
        elapsed = self._clock() - self._start
        self._say(
            f"csnd replay: done: {transactions:,} transactions ({nbytes / 1e6:,.1f} MB) in {elapsed:.1f} s\n"
        )

    def _say(self, line: str) -> None:
        """Progress is a courtesy: a stderr that went away must not fail the replay; it just stops."""
        if self._quiet:
            return
        try:
            self.stream.write(line)
            self.stream.flush()
        except (OSError, ValueError):  # (ValueError: the stream was closed)
            self._quiet = True
