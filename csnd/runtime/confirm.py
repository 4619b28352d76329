"""How far one node's slot may be confirmed: invariant 7, "never confirm what is not durable downstream".

A node's sender releases transactions in CSN order, and after each release
reports `confirmable`: an LSN such that every transaction of the node that
committed before it has been released.  (Commits are not in CSN order on a
GTM node, so this lags the newest commit.)  A slot confirmed to an LSN never
sends again what committed before it, so the LSN may be confirmed only when
every transaction released up to that report is durable in the output.

The runtime tells the tracker three things, in its one thread:

    on_release(confirmable)  the node released its next transaction
    on_written()             the sink ended the oldest released, unwritten one
                             (a node's transactions reach the sink in release order)
    on_durable()             the sink made everything it ended durable
    on_durable(n)            ... or the first n written (a sync in the background
                             that began before the newest writes)

and confirms `safe`, which only `on_durable` moves.  Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import deque

from csnd.core.ids import Lsn


class ConfirmTracker:
    """The confirmable LSN of one node, held back until what it covers is durable."""

    __slots__ = ("released", "written", "durable", "_marks", "safe")

    def __init__(self) -> None:
        self.released = 0  # transactions released so far
        self.written = 0  # of them, ended in the sink
        self.durable = 0  # of them, durable (as of the last on_durable)
        # (released count, confirmable lsn) not yet covered by `durable`; counts increase
        self._marks: deque[tuple[int, Lsn]] = deque()
        self.safe = Lsn(0)  # the LSN that may be confirmed: never decreases

    def on_release(self, confirmable: Lsn) -> None:
        self.released += 1
        self._marks.append((self.released, confirmable))

    def on_position(self, confirmable: Lsn) -> None:
        """The node's confirmable LSN moved without a release (an idle keepalive's WAL end).

        It covers the transactions released so far, so it becomes safe with
        them: at once if they are durable already (at the next `on_durable`).
        Without this a quiet node's slot would never advance past its last
        transaction and WAL would pile up on an idle server.
        """
        count = self.released
        marks = self._marks
        if marks and marks[-1][0] == count:
            if confirmable > marks[-1][1]:
                marks[-1] = (count, confirmable)
        else:
            marks.append((count, confirmable))

    def on_written(self) -> None:
        self.written += 1

    def on_durable(self, written: int | None = None) -> Lsn:
        """Everything written is durable now (or the first `written` of it); returns the new `safe`."""
        if written is not None and not self.durable <= written <= self.written:
            raise ValueError(f"durable count {written} outside {self.durable}..{self.written}")
        self.durable = self.written if written is None else written
        marks = self._marks
        durable = self.durable
        safe = self.safe
        while marks and marks[0][0] <= durable:
            lsn = marks.popleft()[1]
            if lsn > safe:
                safe = lsn
        self.safe = safe
        return safe

    def _check(self) -> None:
        assert 0 <= self.durable <= self.written <= self.released, (self.durable, self.written, self.released)
        counts = [count for count, _ in self._marks]
        assert counts == sorted(set(counts)), counts
        # (a position mark may stand at a count already durable: consumed at the next on_durable)
        assert all(self.durable < count <= self.released or count == self.released for count in counts), (
            counts,
            self.durable,
        )
