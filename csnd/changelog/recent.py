"""The CSNs of the newest durable records, to count a consumer's lag without reading the log (pure).

Status, `/api/status` and `/metrics` give each consumer's lag as the number
of durable transactions after its acknowledged CSN, counted up to a cap.
CSNs have gaps, so the count cannot come from the CSNs alone; reading the
changelog after each consumer's mark cost a read of up to the cap's worth
of records per consumer per call (14.5 s for 50 consumers behind).  The
newest CSNs, kept in order, answer it with one bisection.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable


class RecentCsns:
    """The CSNs of the durable records after `floor`, in order; at least `keep` of them once there are so many.

    Every durable record with csn > floor is in `csns`: a count after a CSN
    at or above the floor is exact.  Below it the caller counts the rest.
    """

    __slots__ = ("csns", "floor", "keep")

    def __init__(self, keep: int, floor: int = 0, csns: Iterable[int] = ()) -> None:
        if keep <= 0:
            raise ValueError("keep must be positive")
        self.keep = keep
        self.floor = floor
        self.csns: list[int] = []
        self.extend(csns)

    def extend(self, csns: Iterable[int]) -> None:
        """Records made durable, in CSN order, all after every one already here."""
        self.csns.extend(csns)
        extra = len(self.csns) - self.keep
        if extra >= self.keep:  # (trimmed in steps of `keep`: a del per `keep` records, not per record)
            self.floor = self.csns[extra - 1]
            del self.csns[:extra]

    def drop_through(self, csn: int) -> None:
        """Retention dropped every record up to `csn`: they are no longer counted, and the floor rises to it."""
        if csn > self.floor:
            self.floor = csn
            del self.csns[: bisect_right(self.csns, csn)]

    def count_after(self, csn: int) -> int | None:
        """How many of the records are after `csn`; None when `csn` is below the floor (not all are here)."""
        if csn < self.floor:
            return None
        return len(self.csns) - bisect_right(self.csns, csn)

    def _check(self) -> None:
        assert all(a < b for a, b in zip(self.csns, self.csns[1:], strict=False))
        assert not self.csns or self.csns[0] > self.floor
        assert len(self.csns) < 2 * self.keep
