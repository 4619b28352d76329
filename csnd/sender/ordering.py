"""CSN order on one node: the committing / commit lists (docs/design.md section 3).

Why this is needed.  A transaction takes its commit CSN from the GTM *before*
it writes its commit record, and nothing orders the commit records of
concurrent transactions by CSN: T1 may take CSN 10, T2 CSN 11, and T2's
commit record still reach the WAL first.  The sender sees commits in WAL
order, so it must hold T2 back until it knows nothing smaller can still come.

What it knows.  Every GTM transaction logs `committing <gid> <c>` (c = the
GTM's current CSN at that moment) on each node before it takes its commit
CSN, so its commit CSN will be `> c`.  Hence:

    committing list   gid -> committing CSN, for transactions between their
                      `committing` and their commit / abort
    commit list       committed, not yet released, sorted by commit CSN

and the release rule (the seed's dependency counting in its equivalent form):
release the head of the commit list while its CSN is `<=` the smallest open
committing CSN (or no transaction is committing).  A committing transaction
with committing CSN `k` ends with a CSN `> k`, so a head `<= k` cannot be
overtaken; a transaction that is not committing yet will take its CSN from the
GTM later, i.e. larger than every CSN already handed out.  The seed counts
dependencies per transaction (`dependtxncnt` / `refertxns`); both forms
release exactly the same sequence -- the property tests check this one
against a brute-force oracle.

Watermark.  What the node tells the coordinator: the largest `w` such that no
transaction with CSN `<= w` can still come from this node.  Each bound says
what it promises: `tick c` that every later commit has a CSN `> c`; an open
committing CSN `k` that its commit has a CSN `> k`; a waiting commit `c`
only that nothing below `c` is still to come (it is itself still to come).
So

    w = max(min(latest tick, smallest open committing CSN, smallest waiting CSN - 1),
            last released CSN)

never decreasing.  No "- 1" on a tick: a GTM that ticks its current CSN
without spending a new one (a real GTM does not advance while idle) must
let the last transaction before a quiet spell go at the next tick.  (The
single-node sender's ticks are LSNs at which the next commit may start, so
it passes `lsn - 1`.)  The second term is free: released CSNs strictly
increase (a commit at or below the last released CSN is a protocol error),
so nothing at or below it can come any more.  `None` while nothing is
known: no tick and nothing released -- without a tick nothing bounds the CSN
of a transaction that has not logged anything yet.

Settling.  A stream that starts in the middle of a node's history (a live
slot) may meet a commit whose `committing` marker lies before its start: that
transaction was committing all along, unseen, and a larger CSN released
before its commit would come out of order.  A sender that starts so is built
`settling`: it takes every event as usual but releases nothing and promises
no watermark until `settle()`, which its caller calls once every transaction
that could have logged `committing` before the start is known to be decided
(`csnd.reader.settle`).  From then on the usual rule holds, and what was
gathered meanwhile goes out in CSN order.

Pure logic: no I/O, no clock.  Keys are opaque (the node sender uses gids in
GTM mode, xids in single-node mode).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from sortedcontainers import SortedDict, SortedList

from csnd.core.errors import CsnOrderViolation, MarkerError
from csnd.core.ids import Csn, Lsn, Xid

K = TypeVar("K", bound=Hashable)


def _name(key: object) -> str:
    """How an error names a transaction: gids are global transactions, ints local xids."""
    return f"global transaction {key}" if isinstance(key, str) else f"transaction {key}"


class CsnOrderer(Generic[K]):
    """The committing and commit lists of one node; releases keys in commit-CSN order."""

    __slots__ = (
        "node",
        "_committing",
        "_committing_by_csn",
        "_waiting",
        "_waiting_csn",
        "_tick",
        "_watermark",
        "_last_released",
        "_seq",
        "_settling",
        "released_count",
    )

    def __init__(self, node: str, *, settling: bool = False) -> None:
        self.node = node
        # Hold every release and the watermark until `settle()` (see the module docstring).
        self._settling = settling
        # key -> committing CSN, and the same entries sorted as (csn, seq) pairs.
        # The seq breaks ties between equal committing CSNs without comparing keys.
        self._committing: dict[K, tuple[Csn, int]] = {}
        self._committing_by_csn: SortedList = SortedList()
        # commit list: commit CSN -> key (a CSN is handed out once, so CSNs are unique)
        self._waiting: SortedDict = SortedDict()
        self._waiting_csn: dict[K, Csn] = {}
        self._tick: Csn | None = None
        self._watermark: Csn | None = None
        self._last_released: Csn | None = None
        self._seq = 0
        self.released_count = 0

    # --- events -------------------------------------------------------------------

    def committing(self, key: K, csn: Csn, *, lsn: Lsn | None = None) -> None:
        """`key` entered its commit; its commit CSN will be greater than `csn`."""
        if key in self._committing or key in self._waiting_csn:
            state = "committing" if key in self._committing else "committed and waiting"
            raise MarkerError(
                f"duplicate committing marker for {_name(key)} (csn {csn}): it is already {state}; "
                "gids must be unique among in-flight transactions",
                node=self.node,
                lsn=lsn,
            )
        self._seq += 1
        entry = (csn, self._seq)
        self._committing[key] = entry
        self._committing_by_csn.add(entry)
        self._update_watermark()

    def commit(
        self, key: K, csn: Csn, *, lsn: Lsn | None = None, xid: Xid | None = None, tick: Csn | None = None
    ) -> list[K]:
        """`key` committed with commit CSN `csn`; returns the keys now released, in CSN order.

        A commit whose `committing` was never seen is accepted (a stream that
        starts after it was logged); it is then bounded only by what was
        already released and by the watermark.  `tick`: a `tick()` that
        follows the commit, taken with it (one watermark update, not two).
        """
        entry = self._committing.get(key)
        if entry is not None and csn <= entry[0]:
            raise CsnOrderViolation(
                f"{_name(key)} committed with csn {csn}, not greater than its committing csn "
                f"{entry[0]}; the writer must take the commit csn from the gtm after logging committing",
                node=self.node,
                lsn=lsn,
                xid=xid,
            )
        if key in self._waiting_csn:
            raise CsnOrderViolation(
                f"duplicate commit of {_name(key)} (csn {csn}): it already committed with csn "
                f"{self._waiting_csn[key]}",
                node=self.node,
                lsn=lsn,
                xid=xid,
            )
        last = self._last_released
        if last is not None and csn <= last:
            raise CsnOrderViolation(
                f"{_name(key)} committed with csn {csn} after csn {last} was already released; "
                "a csn went backwards (was its committing marker missing?)",
                node=self.node,
                lsn=lsn,
                xid=xid,
            )
        wm = self._watermark
        if wm is not None and csn <= wm:
            raise CsnOrderViolation(
                f"{_name(key)} committed with csn {csn}, at or below watermark {wm} already promised "
                "(a tick or committing marker said every later csn is greater); a csn went backwards",
                node=self.node,
                lsn=lsn,
                xid=xid,
            )
        other = self._waiting.get(csn)
        if other is not None:
            raise CsnOrderViolation(
                f"{_name(key)} committed with csn {csn}, which {_name(other)} already has; "
                "a csn is handed out once",
                node=self.node,
                lsn=lsn,
                xid=xid,
            )
        by_csn = self._committing_by_csn
        if entry is not None:
            del self._committing[key]
            by_csn.remove(entry)
        # (Emptiness is asked of the plain dicts beside the sorted containers, the
        # same size, `_check` asserts: a sorted container's len() is a Python call.)
        if not self._waiting_csn and not self._settling and (not self._committing or csn <= by_csn[0][0]):
            # Released at once, the common case (in single-node mode, always):
            # what `_release` would do after a round trip through the commit list.
            self._last_released = csn
            self.released_count += 1
            if tick is not None:
                self._raise_tick(tick)
            self._update_watermark()
            return [key]
        self._waiting[csn] = key
        self._waiting_csn[key] = csn
        if tick is not None:
            self._raise_tick(tick)  # (releasing does not look at the tick; the watermark is updated after)
        return self._release()

    def commit_run(self, csns: list[Csn], ticks: list[Csn]) -> bool:
        """Commits that each release at once, taken together (single-node mode's every commit).

        `ticks[i]` is `commit`'s `tick` for `csns[i]`.  True if they were
        taken; False, with nothing changed, if one of them would not release
        at once or would break the order -- then `commit` them one by one,
        which releases or raises as it should.
        """
        if self._waiting_csn or self._committing or self._settling:
            return False
        last, wm, tick = self._last_released, self._watermark, self._tick
        floor = last if wm is None or (last is not None and last > wm) else wm
        for csn, t in zip(csns, ticks, strict=True):
            if floor is not None and csn <= floor:
                return False
            if tick is None or t > tick:
                tick = t
            floor = csn if tick < csn else tick  # (the watermark after this commit)
        self._last_released = csns[-1]
        self.released_count += len(csns)
        if tick is not None:
            self._raise_tick(tick)
        self._update_watermark()
        return True

    def abort(self, key: K, *, lsn: Lsn | None = None) -> list[K]:
        """`key`, which logged committing, will not commit; returns the keys now released."""
        entry = self._committing.pop(key, None)
        if entry is None:
            raise MarkerError(
                f"abort marker for {_name(key)}, which is not committing "
                f"({'it already committed' if key in self._waiting_csn else 'no committing marker was seen'})",
                node=self.node,
                lsn=lsn,
            )
        self._committing_by_csn.remove(entry)
        return self._release()

    def settle(self) -> list[K]:
        """Every transaction committing before the stream's start is decided: release as usual from now on.

        Returns the keys now released, in CSN order.  Without effect on an
        orderer that is not settling.
        """
        if not self._settling:
            return []
        self._settling = False
        return self._release()

    def tick(self, csn: Csn) -> None:
        """Every transaction that commits later and is not committing now gets a CSN `> csn`.

        Ticks are lower bounds, so a smaller one than already known adds
        nothing (the node sender derives extra ticks from markers, which may
        lag an explicit tick) and is not an error.
        """
        if self._raise_tick(csn):
            self._update_watermark()

    def _raise_tick(self, csn: Csn) -> bool:
        """Take a tick; whether it raised the known one."""
        if self._tick is None or csn > self._tick:
            self._tick = csn
            return True
        return False

    # --- state --------------------------------------------------------------------

    @property
    def watermark(self) -> Csn | None:
        """Largest CSN `w` such that nothing with CSN `<= w` can still be released; None: unknown.

        Never decreases (see the module docstring for how it is computed).
        """
        return self._watermark

    @property
    def settling(self) -> bool:
        """Whether releases are still held until `settle()`."""
        return self._settling

    @property
    def last_released(self) -> Csn | None:
        return self._last_released

    @property
    def n_committing(self) -> int:
        return len(self._committing)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    def is_committing(self, key: K) -> bool:
        return key in self._committing

    def committing_csn(self, key: K) -> Csn | None:
        entry = self._committing.get(key)
        return None if entry is None else entry[0]

    def open_committing(self) -> list[tuple[K, Csn]]:
        """The open committing transactions as (key, committing csn), smallest CSN first."""
        return sorted(((k, e[0]) for k, e in self._committing.items()), key=lambda kv: kv[1])

    def waiting(self) -> list[tuple[K, Csn]]:
        """Committed transactions not yet released, as (key, commit csn), in CSN order."""
        return [(k, c) for c, k in self._waiting.items()]

    # --- internals ----------------------------------------------------------------

    def _release(self) -> list[K]:
        if self._settling:
            return []
        waiting = self._waiting
        released: list[K] = []
        if waiting:
            by_csn = self._committing_by_csn
            floor = by_csn[0][0] if by_csn else None
            waiting_csn = self._waiting_csn
            while waiting:
                csn = waiting.keys()[0]
                if floor is not None and csn > floor:
                    break
                key = waiting.pop(csn)
                del waiting_csn[key]
                released.append(key)
                self._last_released = csn
            self.released_count += len(released)
        self._update_watermark()
        return released

    def _bound(self) -> Csn | None:
        """min(latest tick, smallest open committing CSN, smallest waiting CSN - 1), or None before a tick."""
        bound = self._tick
        if bound is None:
            return None
        if self._committing:  # (the dict twins again, as in `commit`)
            bound = min(bound, self._committing_by_csn[0][0])
        if self._waiting_csn:
            bound = min(bound, self._waiting.keys()[0] - 1)
        return bound

    def _update_watermark(self) -> None:
        if self._settling:
            return  # (a tick says nothing of a transaction committing, unseen, since before the start)
        bound = self._bound()
        w = self._last_released
        if bound is not None and (w is None or bound > w):
            w = bound
        if w is not None and (self._watermark is None or w > self._watermark):
            self._watermark = w

    def _set_load(self, load: int) -> None:
        """Shrink the sorted containers' load factor so tests exercise their split/merge paths."""
        self._committing_by_csn._reset(load)
        self._waiting._list._reset(load)

    def _check(self) -> None:
        """Assert every invariant (as sortedcontainers' `_check` does); for tests."""
        self._committing_by_csn._check()
        self._waiting._check()
        assert len(self._committing) == len(self._committing_by_csn)
        assert sorted(self._committing.values()) == list(self._committing_by_csn)
        assert len(self._waiting) == len(self._waiting_csn)
        for csn, key in self._waiting.items():
            assert self._waiting_csn[key] == csn
            assert key not in self._committing, "a key is committing and committed at once"
        if self._settling:
            assert self._last_released is None and self._watermark is None
            return
        if self._waiting:
            head = self._waiting.keys()[0]
            # nothing releasable is left behind
            assert self._committing_by_csn and head > self._committing_by_csn[0][0]
            if self._last_released is not None:
                assert head > self._last_released
        bound = self._bound()
        wm = self._watermark
        if self._tick is None and self._last_released is None:
            assert wm is None
        else:
            assert wm is not None
            assert bound is None or wm >= bound
            assert self._last_released is None or wm >= self._last_released
            if self._waiting:
                assert wm < self._waiting.keys()[0]
