"""A node input whose items a test queues: what the merger reads, with no thread behind it.

The runtime drains `out`; the test puts there what a pipeline would have
released (at construction, or later between the runtime's steps).  With
`confirms`, the input has a slot: `confirmed` records each `confirm` in
order, `final` the `confirm_final` at the end of a run, and `on_confirm`, if
given, is called with each confirmed LSN to note what else held then (the
output's lines, the changelog's durable CSN).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from csnd.core.ids import Csn, Lsn
from csnd.runtime.items import NodeItem, Outbox
from csnd.runtime.stats import NodeStats

if TYPE_CHECKING:
    from csnd.runtime.inputs import NodeInput
    from csnd.runtime.sinks import GroupCommit, Sink


class QueuedInput:
    """One node as the runtime sees it: `node` in CSN `mode`, its items queued in `out`."""

    releases_whole = True

    def __init__(
        self,
        node: str,
        mode: str,
        queued: Sequence[NodeItem] = (),
        *,
        confirms: bool = True,
        on_confirm: Callable[[Lsn], None] | None = None,
    ) -> None:
        self.node = node
        self.mode = mode
        self.confirms = confirms
        self.out = Outbox(16)  # (room enough that a test's put_many never waits)
        if queued:
            self.out.put_many(list(queued))
        self.on_confirm = on_confirm
        self.confirmed: list[Lsn] = []
        self.final: Lsn | None = None

    def start(self, wakeup: threading.Event, *, alone: bool) -> None:
        pass

    def stop(self) -> None:
        pass

    def stats(self) -> NodeStats:
        return NodeStats(self.node)

    def confirm(self, lsn: Lsn) -> None:
        self.confirmed.append(lsn)
        if self.on_confirm is not None:
            self.on_confirm(lsn)

    def confirm_final(self, lsn: Lsn) -> None:
        self.final = lsn


if TYPE_CHECKING:

    def _is_a_node_input(queued: QueuedInput) -> NodeInput:
        """Never called: mypy checks here that a `QueuedInput` is what the runtime reads."""
        return queued

    def _is_a_sink(lines: EndedLines) -> Sink:
        """Never called: mypy checks here that a test's sink is what the runtime writes to."""
        return lines


class QuietSink:
    """The parts of a `Sink` that a test's sink leaves alone: counters, durability that is always there,
    relation versions dropped and whole lines taken one by one."""

    group_commit: GroupCommit | None = None

    def __init__(self) -> None:
        self.transactions = 0
        self.bytes_out = 0

    def start_transaction(self, csn: Csn) -> None:
        pass

    def end_transaction(self, csn: Csn, tail: str) -> None:
        raise NotImplementedError

    def append_lines(self, csns: Sequence[Csn], lines: Sequence[str]) -> None:
        for csn, line in zip(csns, lines, strict=True):
            self.start_transaction(csn)
            self.end_transaction(csn, line)

    def relations(self, csn: Csn, entries: Sequence[tuple[str, str]]) -> None:
        pass

    def make_durable(self) -> None:
        pass

    def commit(self) -> None:
        pass

    def discard(self) -> None:
        pass

    def abandon(self) -> str | None:
        return None


class EndedLines(QuietSink):
    """A sink that keeps each transaction it ended, as (csn, its last part); everything ended is durable."""

    def __init__(self) -> None:
        super().__init__()
        self.ended: list[tuple[int, str]] = []

    def write(self, text: str) -> None:
        pass

    def end_transaction(self, csn: Csn, tail: str) -> None:
        self.ended.append((csn, tail))
        self.transactions += 1
