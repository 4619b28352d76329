"""The newest durable records, kept in memory for readers that keep up (pure).

A subscriber that keeps up reads records a moment after they were made
durable.  Read back from the segment, each cost a `pread`, a parse of its
head and a CRC over its bytes -- a tenth of the service's CPU on one-row
transactions -- for bytes this process wrote and still holds.  The tail
keeps the payloads (the very objects appended) of the newest durable
records, up to a byte budget, and `Changelog.read_pieced` serves a reader
from it whenever all it asks for is there.  A reader further behind reads
the segments, CRC-checked, as before.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import cast


class DurableTail:
    """The payloads of the durable records with csn > `floor`, in order, about `budget` bytes of them.

    Every durable record after the floor is here (`after` answers only
    from there on); a record whose payload is not at hand (appended in
    pieces) raises the floor past itself, so what is here is always the
    whole stretch after the floor.
    """

    __slots__ = ("budget", "floor", "csns", "lines", "nbytes")

    def __init__(self, budget: int, floor: int = 0) -> None:
        if budget < 0:
            raise ValueError("a changelog tail's budget cannot be negative")
        self.budget = budget
        self.floor = floor
        self.csns: list[int] = []
        self.lines: list[bytes] = []
        self.nbytes = 0

    def extend(self, csns: Sequence[int], lines: Sequence[bytes | None]) -> None:
        """Records made durable, in CSN order after every one here; None: one whose payload is not at hand."""
        if None in lines:  # (the last such one ends what can be kept before it)
            k = len(lines) - 1 - list(reversed(lines)).index(None)
            self.clear(csns[k])
            csns, lines = csns[k + 1 :], lines[k + 1 :]
        kept = cast("Sequence[bytes]", lines)
        self.csns += csns
        self.lines += kept
        self.nbytes += sum(map(len, kept))
        if self.nbytes > self.budget:
            self._trim()

    def _trim(self) -> None:
        """Drop the oldest down to half the budget: a del per half-budget of records, not per record."""
        goal, drop, freed = self.nbytes - self.budget // 2, 0, 0
        for line in self.lines:
            if freed >= goal:
                break
            freed += len(line)
            drop += 1
        self.floor = self.csns[drop - 1]
        del self.csns[:drop], self.lines[:drop]
        self.nbytes -= freed

    def after(
        self, after_csn: int, until_csn: int | None, whole_up_to: int | None = None
    ) -> tuple[list[int], list[bytes]] | None:
        """The records with after_csn < csn (<= until_csn), or None when not all of them are here.

        None too when one of them is longer than `whole_up_to`: such a record
        is read from its segment in pieces (`Changelog.read_pieced`).
        """
        if after_csn < self.floor:
            return None
        i = bisect_right(self.csns, after_csn)
        j = len(self.csns) if until_csn is None else bisect_right(self.csns, until_csn, lo=i)
        lines = self.lines[i:j]
        if whole_up_to is not None and lines and max(map(len, lines)) > whole_up_to:
            return None
        return self.csns[i:j], lines

    def drop_through(self, csn: int) -> None:
        """Retention dropped every record up to `csn`."""
        if csn > self.floor:
            i = bisect_right(self.csns, csn)
            self.nbytes -= sum(map(len, self.lines[:i]))
            del self.csns[:i], self.lines[:i]
            self.floor = csn

    def clear(self, floor: int = 0) -> None:
        """Nothing here; every durable record after `floor` is to come."""
        self.floor, self.csns, self.lines, self.nbytes = floor, [], [], 0
