"""Progress lines for long replays: what was written, how fast, and where each node is.

`csnd replay` of a big recording runs for minutes with nothing on stdout
until lines appear in its output file; with `-v`, or when stderr is a
terminal, it says every few seconds where it is.  Never otherwise: scripts
read stderr for the one error line of DESIGN section 8.

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
        pipelines: Sequence[Any],
        clock: Callable[[], float] = time.monotonic,
        interval: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self.stream = stream
        self._pipelines = pipelines
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
        nodes = "".join(f"; {_node_state(p)}" for p in self._pipelines)
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


def _node_state(pipeline: Any) -> str:
    """`dn1: read 42%, 512,000 changes decoded, decoder inboxes 4/4 3/4` (what this node's pipeline knows)."""
    parts = []
    read_fraction = getattr(getattr(pipeline, "source", None), "read_fraction", None)
    fraction = read_fraction() if read_fraction is not None else None
    if fraction is not None:  # a regular recorded file; pipes, live sources and node agents do not know
        parts.append(f"read {fraction * 100:.0f}%")
    pool = getattr(pipeline, "pool", None)
    if pool is not None:  # a local pipeline (a node agent decodes for itself)
        inboxes = " ".join(f"{depth}/{capacity}" for depth, capacity in pool.inbox_depths())
        parts.append(f"{pool.stats.changes:,} changes decoded, decoder inboxes {inboxes}")
    return f"{pipeline.node}: {', '.join(parts) or 'remote'}"
