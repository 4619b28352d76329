"""Where the coordinator runtime writes the merged transactions, and how it learns what is durable.

    CoordinatorRuntime ── write(text)* end_transaction(csn, tail) ──► Sink ──► JSON lines / changelog
                       ◄───────────── make_durable() returns ─────────┘
                       ── confirm(safe LSN) ──► each live node's slot

A transaction reaches the sink as its docs/design.md section 7 line:
`start_transaction` with its csn, zero or more `write` calls with its leading parts (a big transaction's line is handed on
part by part, so it is never held whole), then `end_transaction` with the
rest and its csn.  A sink may write the parts through at once (JSON lines) or
gather them into one record per transaction (a changelog: `append(csn,
line)` in `end_transaction`, `sync()` in `make_durable`); the runtime does
not care which.  The runtime confirms a node's slot only after
`make_durable()` has returned: every transaction ended before that call is
durable then, whatever "durable" means for the sink (fsynced, handed to a
pipe, synced to the changelog).

A sink may also have `relations(csn, [(node, body), ...])`, called before a
transaction's first part with the relation versions first in force with it
(docs/design.md section 7, relation lines): the changelog keeps them, JSON
lines write them when asked to.  A sink without it is not told.
"""

from __future__ import annotations

from typing import Protocol


class OutputClosed(Exception):  # (a stop, not an error)
    """The sink's reader went away (`csnd replay ... | head -3`): the run stops quietly, confirming nothing more."""


class Sink(Protocol):
    transactions: int  # transactions ended so far (for progress lines)
    bytes_out: int  # bytes written so far (for progress lines)

    def start_transaction(self, csn: int) -> None:
        """A transaction's line begins (its parts and end follow): a sink may stream it from here."""

    def write(self, text: str) -> None:
        """Part of the current transaction's line (not its end)."""

    def end_transaction(self, csn: int, tail: str) -> None:
        """The rest of the current transaction's line: the transaction is complete (not yet durable)."""

    def make_durable(self) -> None:
        """After it returns, every transaction ended so far is durable; raises if it cannot be made so."""

    def commit(self) -> None:
        """Every source has ended: make everything durable and present the output as complete."""

    def discard(self) -> None:
        """Give up before anything was written: leave nothing behind."""

    def abandon(self) -> str | None:
        """Give up mid-run; returns where the incomplete output is (None if nowhere to name)."""


class GroupCommitSink(Sink, Protocol):
    """A sink that makes itself durable in the background (the service's changelog).

    The runtime asks and goes on writing; it confirms slots only as far as
    a finished request covers.
    """

    durable_ticket: int  # the newest request whose transactions are all durable

    @property
    def ended(self) -> int:
        """Transactions ended so far, whether written or skipped."""

    def request_durable(self) -> int:
        """A ticket for everything ended so far; `durable_ticket` reaches it once that is durable."""
