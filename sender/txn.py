"""A finished transaction of one node (sender -> coordinator contract)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class FinishedTxn:
    """A committed transaction of one node, released by the sender in CSN order.

    `changes` yields `(cid, lsn, body)` in stream order, `body` being the
    `DecodedChange.body` JSON fragment; for a spilled large transaction it reads
    back from disk lazily, so iterate it once.  `commit_time` is microseconds
    since 2000-01-01 UTC, as on the wire.
    """

    node: str
    csn: int
    gid: str | None
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    changes: Iterable[tuple[int, int, str]]
    n_changes: int
