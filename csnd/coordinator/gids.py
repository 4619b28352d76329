"""Naming transactions in the coordinator's errors, and remembering recent gids in bounded memory."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from csnd.core.ids import lsn_to_str

V = TypeVar("V")


class RecentGids(Generic[V]):
    """The last `limit` gids seen and what was kept of each, the oldest forgotten first (limit 0: none kept).

    What lets a gid that comes back after its transaction was emitted be
    told from a new one, in bounded memory.
    """

    __slots__ = ("limit", "_values", "_order")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._values: dict[str, V] = {}
        self._order: deque[str] = deque()  # oldest first

    def get(self, gid: str) -> V | None:
        return self._values.get(gid)

    def add(self, gid: str, value: V) -> None:
        if not self.limit:
            return
        self._values[gid] = value
        self._order.append(gid)
        if len(self._order) > self.limit:
            self._values.pop(self._order.popleft(), None)

    def _check(self) -> None:
        assert len(self._values) == len(self._order) <= self.limit
        assert set(self._values) == set(self._order)


def txn_name(gid: str | None, xid: int, csn: int, commit_lsn: int | None = None) -> str:
    """`transaction GID (xid X, csn C, commit L)`, as the merge's errors name a transaction."""
    name = f"transaction {gid}" if gid is not None else "transaction"
    at = f", commit {lsn_to_str(commit_lsn)}" if commit_lsn is not None else ""
    return f"{name} (xid {xid}, csn {csn}{at})"
