"""Where the merger writes the merged transactions, and how it learns what is durable.

    Merger ── write(text)* end_transaction(csn, tail) ──► Sink ──► JSON lines / changelog
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

Every sink also takes what the runtime may hand it besides parts, and
says what it does with it: `relations(csn, [(node, body), ...])`, called
before a transaction's first part with the relation versions first in force
with it (docs/design.md section 7, relation lines: the changelog keeps them,
JSON lines write them when asked to), and `append_lines(csns, lines)`, the
whole lines of consecutive transactions a lone node's decoders wrote
(`FinishedTxn.written`: the changelog appends them in one call, JSON lines
writes them one after another).

How a sink becomes durable is the one thing sinks differ in, and each says
which: `group_commit` is None for a sink made durable in the runtime's
thread by `make_durable` (JSON lines), or the sink's `GroupCommit` when it
syncs in a thread of its own (the service's changelog): the runtime then
asks for a sync by ticket and goes on writing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from csnd.core.ids import Csn

if TYPE_CHECKING:
    import threading


class OutputClosed(Exception):  # (a stop, not an error)
    """The sink's reader went away (`csnd replay ... | head -3`): the run stops quietly, confirming nothing more."""


class GroupCommit(Protocol):
    """A sink's durability in the background (the service's changelog: its sync thread).

    The runtime asks and goes on writing; it confirms slots only as far as
    a finished request covers.
    """

    durable_ticket: int  # the newest request whose transactions are all durable

    @property
    def ended(self) -> int:
        """Transactions ended so far, whether written or skipped."""

    def request_durable(self) -> int:
        """A ticket for everything ended so far; `durable_ticket` reaches it once that is durable."""

    def wake_on_durable(self, wake: threading.Event) -> None:
        """Set `wake` each time a sync finishes, so the runtime asks for the next group at once."""

    @property
    def failed(self) -> bool:
        """Whether the background sync failed (a look: `raise_failure` raises it)."""

    def raise_failure(self) -> None:
        """Raise the background sync's failure, if it failed (`wake` is set then too).

        The runtime looks every round: a sync that failed (a full disk) must
        end the pipeline at once, not when a later append meets the failed
        changelog -- with nothing more to append, never."""


class Sink(Protocol):
    """Where the runtime writes the merged transactions' lines (see the module docstring)."""

    transactions: int  # transactions ended so far (for progress lines)
    bytes_out: int  # bytes written so far (for progress lines)
    # None: durable only when `make_durable` returns (in the runtime's thread);
    # else the sink syncs in the background, asked by ticket (the changelog).
    group_commit: GroupCommit | None

    def start_transaction(self, csn: Csn) -> None:
        """A transaction's line begins (its parts and end follow): a sink may stream it from here."""

    def write(self, text: str) -> None:
        """Part of the current transaction's line (not its end)."""

    def end_transaction(self, csn: Csn, tail: str) -> None:
        """The rest of the current transaction's line: the transaction is complete (not yet durable)."""

    def append_lines(self, csns: Sequence[Csn], lines: Sequence[str]) -> None:
        """The whole lines of consecutive transactions, in CSN order: each as a transaction ended at once."""

    def relations(self, csn: Csn, entries: Sequence[tuple[str, str]]) -> None:
        """`(node, body)` of each relation version first in force at `csn`, before its transaction's line."""

    def make_durable(self) -> None:
        """After it returns, every transaction ended so far is durable; raises if it cannot be made so."""

    def commit(self) -> None:
        """Every source has ended: make everything durable and present the output as complete."""

    def discard(self) -> None:
        """Give up before anything was written: leave nothing behind."""

    def abandon(self) -> str | None:
        """Give up mid-run; returns where the incomplete output is (None if nowhere to name)."""
