"""Position checks on a node's changes: forward inside a transaction, none past its commit.

C-level passes over columns the caller already has: a Python call per
transaction was a tenth of the sender's time on one-row transactions.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter, eq, itemgetter, le
from typing import Final

from csnd.core.ids import Lsn, Xid
from csnd.decoder.change import WholeTxn


def lsns_sorted(lsns: list[Lsn]) -> bool:
    """Positions that never go backwards (C-level and linear on a sorted list; a run of one skips it)."""
    return len(lsns) < 2 or sorted(lsns) == lsns


# A `WholeTxn`'s fields, for C-level passes over a run of them.
final_lsn_of: Final[Callable[[WholeTxn], Lsn]] = attrgetter("final_lsn")
commit_lsn_of: Final[Callable[[WholeTxn], Lsn]] = attrgetter("commit_lsn")
end_lsn_of: Final[Callable[[WholeTxn], Lsn]] = attrgetter("end_lsn")
xid_of: Final[Callable[[WholeTxn], Xid]] = attrgetter("xid")
lsns_of: Final[Callable[[WholeTxn], list[Lsn]]] = attrgetter("lsns")  # (never None in a WholeTxn)
_last_of: Final[Callable[[list[Lsn]], Lsn]] = itemgetter(-1)


def all_in_place(txns: list[WholeTxn], commit_lsns: list[Lsn], lsns_each: list[list[Lsn]]) -> bool:
    """Whether whole transactions' positions are as their Begins and Commits say: each one's changes in order, none past its commit.

    `commit_lsns` and `lsns_each` are the transactions' own columns, which
    the caller has taken already.
    """
    return (
        all(map(eq, map(final_lsn_of, txns), commit_lsns))  # (as their Begins announced)
        and all(map(le, map(_last_of, lsns_each), commit_lsns))  # (no change past its commit)
        and all(map(lsns_sorted, [lsns for lsns in lsns_each if len(lsns) > 1]))
    )
