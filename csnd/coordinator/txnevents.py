"""What the merge emits: a global transaction as a stream of events (`CsnMerge.pop_events`).

    TxnStart   the transaction's header: csn, gid, every participating node's commit
    TxnPart    the next changes: one node's batch, `(cid, lsn, body)` each
    TxnEnd     the transaction is complete

A transaction of any size passes through as these events in bounded memory;
`CsnMerge.pop_ready` joins them into whole `GlobalTxn`s (`TxnJoiner`) for
callers that want those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from csnd.coordinator.globaltxn import GlobalTxn, NodeCommit, Part
from csnd.core.ids import Csn, Lsn


class TxnStart:
    """A global transaction begins: everything its JSON line says before the changes.

    `relations`: `(node, body)` of each relation version first in force with
    it (`decoder.schema`), in node order: not part of its line, but written
    before it where relation lines are wanted, and kept by the changelog.
    """

    __slots__ = ("csn", "gid", "nodes", "end_lsns", "commit_time", "relations")

    def __init__(
        self,
        csn: Csn,
        gid: str | None,
        nodes: dict[str, NodeCommit],
        end_lsns: dict[str, Lsn],
        commit_time: int,
        relations: Sequence[tuple[str, str]] = (),
    ) -> None:
        """`commit_time`: the latest of the nodes' commit times (`CsnMerge._check` holds it to that)."""
        self.csn = csn
        self.gid = gid
        self.nodes = nodes
        self.end_lsns = end_lsns
        self.commit_time = commit_time
        self.relations = relations


class TxnPart(NamedTuple):
    """The next changes of the current transaction: one node's batch, `(cid, lsn, body)` each."""

    node: str
    changes: list[tuple[int, int, str]]


class TxnEnd(NamedTuple):
    """The current transaction is complete; `nodes` took part in it."""

    csn: Csn
    nodes: list[str]


TxnEvent = TxnStart | TxnPart | TxnEnd


class TxnJoiner:
    """Joins the events into whole `GlobalTxn`s: holds a transaction's parts until its end."""

    __slots__ = ("_start", "_parts")

    def __init__(self) -> None:
        self._start: TxnStart | None = None  # the transaction in progress (None: between two)
        self._parts: list[Part] = []

    def join(self, events: Iterable[TxnEvent]) -> list[GlobalTxn]:
        """The transactions `events` complete, in order; a transaction they begin and do not end is kept."""
        out: list[GlobalTxn] = []
        for ev in events:
            if isinstance(ev, TxnStart):
                self._start, self._parts = ev, []
            elif isinstance(ev, TxnPart):
                assert self._start is not None
                self._parts.append((ev.node, ev.changes))
            else:
                start = self._start
                assert start is not None
                self._start = None
                out.append(
                    GlobalTxn(start.csn, start.gid, start.nodes, start.end_lsns, self._parts, start.relations)
                )
        return out
