"""How far one node's slot may be confirmed: the confirmable LSN (docs/design.md section 5, invariant 7).

Why it is not simply the end LSN of the last released transaction.  Commit
records reach the WAL out of CSN order, so the sender holds committed
transactions back (`sender.ordering`); and a `committing` marker holds back
every larger CSN until its transaction commits or aborts.  A restart from an
LSN `L` makes the server send again exactly what lies at or after `L`.  So `L`
may be confirmed only if

* every transaction whose commit record lies before `L` has been released
  (or skipped as empty): `L` is the end LSN of a commit -- or an idle
  keepalive's WAL end -- that precedes the oldest committed, unreleased
  transaction (`L` <= its commit LSN, so the server sends it again);
* no `committing` marker of a transaction that is not released yet lies
  before `L`: while one is open or its transaction waits, `L` stays at the
  position the stream had reached when the marker arrived, so after a
  restart the marker is sent again and still holds back larger CSNs.

The bookkeeping:

    floor       the furthest commit end / idle keepalive the stream has passed
    holds       end LSN of each committed, unreleased transaction -> the floor
                when it committed (sorted: the oldest hold is the smallest)
    caps        the floor when each open committing marker arrived, by gid
    confirmable min(floor, smallest hold, smallest cap), never decreasing

Pure: no I/O.  The node sender drives it; `_check` asserts its invariants.
"""

from __future__ import annotations

from sortedcontainers import SortedDict, SortedList

from csnd.core.ids import Lsn


class ConfirmableLsn:
    """The confirmable LSN of one node's stream (see the module docstring)."""

    __slots__ = ("_floor", "_holds", "_n_holds", "_caps", "_cap_of", "_confirmable")

    def __init__(self) -> None:
        self._floor = Lsn(0)
        self._holds: SortedDict = SortedDict()  # end LSN of a waiting txn -> floor at its commit
        self._n_holds = 0  # len(_holds): a plain int, as a sorted container's len() is a Python call
        self._caps: SortedList = SortedList()  # floors at the committing markers not yet resolved
        self._cap_of: dict[str, tuple[Lsn, Lsn]] = {}  # gid -> (floor, marker lsn)
        self._confirmable = Lsn(0)

    @property
    def value(self) -> Lsn:
        """The LSN the slot may be confirmed to once everything released so far is durable (0: none yet)."""
        return self._confirmable

    @property
    def floor(self) -> Lsn:
        return self._floor

    # --- events ----------------------------------------------------------------------

    def committing(self, gid: str, marker_lsn: Lsn) -> None:
        """A `committing` marker of `gid` arrived at `marker_lsn`: cap at the floor until `resolved(gid)`."""
        self._cap_of[gid] = (self._floor, marker_lsn)
        self._caps.add(self._floor)

    def resolved(self, gid: str) -> None:
        """`gid`'s transaction was released, aborted or dropped: its committing marker caps no more."""
        entry = self._cap_of.pop(gid, None)
        if entry is not None:
            self._caps.remove(entry[0])
            self._update()

    def passed(self, end_lsn: Lsn) -> None:
        """The stream passed a commit's end LSN or an idle keepalive's WAL end."""
        if end_lsn > self._floor:
            self._floor = end_lsn
        self._update()

    def hold(self, end_lsn: Lsn) -> None:
        """The transaction ending at `end_lsn` committed but waits: hold at the floor from before its commit.

        Call before `passed(end_lsn)`.
        """
        self._holds[end_lsn] = self._floor
        self._n_holds += 1

    def unhold(self, end_lsn: Lsn) -> None:
        """The waiting transaction ending at `end_lsn` was released; `update()` once after a run of these."""
        del self._holds[end_lsn]
        self._n_holds -= 1

    def update(self) -> None:
        self._update()

    def _update(self) -> None:
        c = self._floor
        if self._n_holds:
            c = min(c, self._holds.peekitem(0)[1])
        if self._cap_of:  # `_caps`' twin, a plain dict
            c = min(c, self._caps[0])
        if c > self._confirmable:
            self._confirmable = c

    # --- state -----------------------------------------------------------------------

    def is_capped_by(self, gid: str) -> bool:
        return gid in self._cap_of

    def marker_lsn(self, gid: str) -> Lsn | None:
        """Where the open committing marker of `gid` arrived, if one is open."""
        entry = self._cap_of.get(gid)
        return None if entry is None else entry[1]

    def _check(self, holding: list[Lsn] | None = None, capping: set[str] | None = None) -> None:
        """Assert every invariant; `holding` / `capping`: the end LSNs and gids the caller says wait."""
        self._caps._check()
        self._holds._check()
        assert self._n_holds == len(self._holds)
        assert sorted(f for f, _ in self._cap_of.values()) == list(self._caps)
        assert all(f <= self._floor for f in self._holds.values())
        assert all(f <= self._floor for f in self._caps)
        # Every hold and cap is a floor of its time, at or above what was confirmable then, so
        # the minimum never falls below the confirmable LSN, and after each event it is exactly it.
        assert self._confirmable == min([self._floor, *self._holds.values(), *self._caps])
        if holding is not None:
            assert sorted(holding) == list(self._holds)
        if capping is not None:
            assert set(self._cap_of) <= capping
