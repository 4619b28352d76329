"""CsnOrderer against a brute-force oracle, on causally valid GTM histories.

The machine plays one node of a GTM cluster.  A transaction logs `committing`
with the GTM's current CSN, later takes a fresh CSN (`g += 1`), and then
commits or aborts; commits are logged in any order.  Ticks carry the GTM's
current value (valid at any time: a transaction not committing yet takes a
CSN greater than it).  Other nodes take CSNs too (`g` jumps).

Oracle, from first principles: a committed transaction may be released once no
open transaction can still end with a smaller CSN; an open transaction with
committing CSN `k` can end with any CSN `> k` as far as the node can tell.  So
at every step the released set must be exactly the committed CSNs `<=` every
open committing CSN, released in increasing order.  The seed's own form --
dependency counts fixed at commit time (`dependtxncnt` / `refertxns`), head of
the commit list released while it has none -- runs beside it as a second
model and must release the same sequence.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from csnd.core.errors import ProtocolError
from csnd.core.ids import Csn, Lsn, Xid
from csnd.sender.ordering import CsnOrderer


class _T:
    __slots__ = ("gid", "committing", "csn", "state")

    def __init__(self, gid: str, committing: int) -> None:
        self.gid = gid
        self.committing = committing
        self.csn: int | None = None
        self.state = "committing"  # -> committed | aborted


class _SeedForm:
    """GaussDB's two-list mechanism as docs/design.md section 3 restates it, literally.

    Plain lists: slow and obvious.
    """

    def __init__(self) -> None:
        self.committing_list: list[tuple[int, str]] = []  # toplevel_by_committing_csn
        self.commit_list: list[tuple[int, str]] = []  # toplevel_by_csn
        self.depend: dict[str, int] = {}  # dependtxncnt
        self.refer: dict[str, list[str]] = {}  # refertxns: who waits for this one

    def committing(self, gid: str, csn: int) -> None:
        self.committing_list.append((csn, gid))
        self.committing_list.sort()
        self.refer[gid] = []

    def _leave(self, gid: str) -> None:
        self.committing_list = [e for e in self.committing_list if e[1] != gid]
        for waiter in self.refer.pop(gid, []):
            self.depend[waiter] -= 1

    def commit(self, gid: str, csn: int) -> list[int]:
        self._leave(gid)
        self.depend[gid] = 0
        for c, other in self.committing_list:
            if c < csn:
                self.refer[other].append(gid)
                self.depend[gid] += 1
        self.commit_list.append((csn, gid))
        self.commit_list.sort()
        return self._send()

    def abort(self, gid: str) -> list[int]:
        self._leave(gid)
        return self._send()

    def _send(self) -> list[int]:
        out = []
        while self.commit_list and self.depend[self.commit_list[0][1]] == 0:
            out.append(self.commit_list.pop(0)[0])
        return out


class OrdererMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.o: CsnOrderer[str] = CsnOrderer("dn1")
        self.g = 100
        self.txns: dict[str, _T] = {}
        self.n = 0
        self.released: list[int] = []
        self.tick_max: int | None = None
        self.expected_wm: int | None = None
        self.max_wm_seen: int | None = None
        self.seed = _SeedForm()
        self.seed_released: list[int] = []

    @initialize(load=st.sampled_from([4, 8, 1000]), start=st.integers(0, 1000))
    def setup(self, load: int, start: int) -> None:
        self.o._set_load(load)
        self.g = start

    # --- the node's history -------------------------------------------------------

    def _open(self) -> list[_T]:
        return [t for t in self.txns.values() if t.state == "committing"]

    @rule()
    def log_committing(self) -> None:
        self.n += 1
        t = _T(f"g-{self.n}", self.g)
        self.txns[t.gid] = t
        self.o.committing(t.gid, Csn(t.committing))
        self.seed.committing(t.gid, t.committing)
        self._after([])

    @precondition(lambda self: any(t.csn is None for t in self._open()))
    @rule(pick=st.integers(0, 10**6))
    def take_csn(self, pick: int) -> None:
        cands = [t for t in self._open() if t.csn is None]
        t = cands[pick % len(cands)]
        self.g += 1
        t.csn = self.g

    @rule(k=st.integers(1, 5))
    def gtm_elsewhere(self, k: int) -> None:
        self.g += k

    @precondition(lambda self: any(t.csn is not None for t in self._open()))
    @rule(pick=st.integers(0, 10**6))
    def commit(self, pick: int) -> None:
        cands = [t for t in self._open() if t.csn is not None]
        t = cands[pick % len(cands)]
        assert t.csn is not None
        t.state = "committed"
        self.seed_released += self.seed.commit(t.gid, t.csn)
        self._after(self.o.commit(t.gid, Csn(t.csn)))

    @precondition(lambda self: any(t.csn is not None for t in self._open()))
    @rule(pick=st.integers(0, 10**6), ahead=st.integers(0, 3), back=st.integers(0, 3))
    def commit_with_its_tick(self, pick: int, ahead: int, back: int) -> None:
        """`commit(tick=)`, the sender's path: the commit and then a tick (maybe a stale one), in one call."""
        cands = [t for t in self._open() if t.csn is not None]
        t = cands[pick % len(cands)]
        assert t.csn is not None
        t.state = "committed"
        self.g += ahead  # the gtm moved on meanwhile (else the tick could add nothing to the release)
        tick = self.g - back
        self.seed_released += self.seed.commit(t.gid, t.csn)
        released = self.o.commit(t.gid, Csn(t.csn), tick=Csn(tick))
        self.tick_max = tick if self.tick_max is None else max(self.tick_max, tick)
        self._after(released)

    @precondition(lambda self: bool(self._open()))
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick: int) -> None:
        cands = self._open()
        t = cands[pick % len(cands)]
        t.state = "aborted"
        self.seed_released += self.seed.abort(t.gid)
        self._after(self.o.abort(t.gid))

    @rule()
    def tick(self) -> None:
        self.o.tick(Csn(self.g))
        self.tick_max = self.g if self.tick_max is None else max(self.tick_max, self.g)
        self._after([])

    @rule(back=st.integers(1, 50))
    def stale_tick(self, back: int) -> None:
        """A lower bound below the known one adds nothing (derived ticks may lag)."""
        t = self.g - back
        self.o.tick(Csn(t))
        self.tick_max = t if self.tick_max is None else max(self.tick_max, t)
        self._after([])

    # --- the oracle ---------------------------------------------------------------

    def _after(self, released_keys: list[str]) -> None:
        csns = []
        for key in released_keys:
            t = self.txns[key]
            assert t.state == "committed" and t.csn is not None
            csns.append(t.csn)
        for c in csns:
            # nothing smaller can still commit: open txns end above their committing CSN
            # and above g (if they have not taken a CSN yet)
            for o in self._open():
                assert o.csn is None or o.csn > c, f"released {c} while {o.gid} may commit with {o.csn}"
            if self.max_wm_seen is not None:
                assert c > self.max_wm_seen, f"released {c} at or below an earlier watermark"
            if self.released:
                assert c > self.released[-1], f"released {c} after {self.released[-1]}"
            self.released.append(c)
        # model watermark: max over time of min(tick, open committing, waiting - 1) and last released
        cands = [self.released[-1]] if self.released else []
        if self.tick_max is not None:
            bound = self.tick_max
            for o in self._open():
                bound = min(bound, o.committing)
            for t in self.txns.values():
                if t.state == "committed" and t.csn is not None and t.csn not in set(self.released):
                    bound = min(bound, t.csn - 1)
            cands.append(bound)
        if cands and (self.expected_wm is None or max(cands) > self.expected_wm):
            self.expected_wm = max(cands)

    @invariant()
    def check(self) -> None:
        o = self.o
        o._check()
        floor = min((t.committing for t in self._open()), default=None)
        committed = sorted(t.csn for t in self.txns.values() if t.state == "committed" and t.csn is not None)
        releasable = [c for c in committed if floor is None or c <= floor]
        assert self.released == releasable, (self.released, releasable)
        assert self.seed_released == self.released, "the seed's dependency form disagrees"
        assert o.n_waiting == len(committed) - len(releasable)
        assert o.n_committing == len(self._open())
        wm = o.watermark
        assert wm == self.expected_wm, (wm, self.expected_wm)
        if wm is not None:
            assert self.max_wm_seen is None or wm >= self.max_wm_seen, "watermark went down"
            self.max_wm_seen = wm
            assert wm <= self.g, "watermark beyond any CSN the GTM handed out"
            for t in self._open():
                assert t.csn is None or wm < t.csn
            for c in committed[len(releasable) :]:
                assert wm < c

    def teardown(self) -> None:
        # End of stream: every open transaction commits (if it took a CSN) or aborts.
        for t in sorted(self._open(), key=lambda t: t.gid):
            if t.csn is None:
                t.state = "aborted"
                self.seed_released += self.seed.abort(t.gid)
                self._after(self.o.abort(t.gid))
            else:
                t.state = "committed"
                self.seed_released += self.seed.commit(t.gid, t.csn)
                self._after(self.o.commit(t.gid, Csn(t.csn)))
            self.check()
        committed = sorted(t.csn for t in self.txns.values() if t.state == "committed" and t.csn is not None)
        assert self.released == committed
        assert self.o.n_waiting == 0 and self.o.n_committing == 0


OrdererMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
TestOrderer = OrdererMachine.TestCase


# --- hand-picked cases -------------------------------------------------------------


def test_seed_example_out_of_order_commit() -> None:
    """T1 takes 10, T2 takes 11, T2's commit record comes first: T2 waits for T1."""
    o: CsnOrderer[str] = CsnOrderer("dn1")
    o.committing("t1", Csn(9))
    o.committing("t2", Csn(9))
    assert o.commit("t2", Csn(11)) == []
    assert o.commit("t1", Csn(10)) == ["t1", "t2"]
    assert o.last_released == 11
    o._check()


def test_release_head_equal_to_committing_floor() -> None:
    """A head equal to the smallest committing CSN goes: that txn ends strictly above it."""
    o: CsnOrderer[str] = CsnOrderer("dn1")
    o.committing("a", Csn(5))
    o.committing("b", Csn(7))
    assert o.commit("b", Csn(8)) == []  # a may still end with 6 or 7
    assert o.abort("a") == ["b"]
    o.committing("c", Csn(8))
    o.committing("d", Csn(9))
    assert o.commit("d", Csn(10)) == []
    assert o.commit("c", Csn(9)) == ["c", "d"]
    o._check()


def test_watermark_unknown_until_a_tick() -> None:
    o: CsnOrderer[str] = CsnOrderer("dn1")
    assert o.watermark is None
    o.committing("a", Csn(5))
    assert o.watermark is None
    o.tick(Csn(7))
    assert o.watermark == 5  # min(tick 7, committing 5): a ends with a csn > 5
    assert o.commit("a", Csn(8)) == ["a"]
    assert o.watermark == 8  # the last released csn: nothing at or below it can come any more
    o.tick(Csn(3))
    assert o.watermark == 8  # never decreases
    o.tick(Csn(20))
    assert o.watermark == 20  # a tick promises later csns greater than it
    o._check()


def test_a_tick_of_the_current_csn_passes_the_last_csn_handed_out() -> None:
    """A GTM that does not advance while idle ticks its current CSN again and again.

    Another node committed csn 12, the last before a quiet spell.  This
    node, idle, gets `tick 12`: its watermark must reach 12, or the merge
    would hold that transaction until the GTM hands out another CSN.
    """
    o: CsnOrderer[str] = CsnOrderer("dn2")
    o.tick(Csn(11))
    assert o.watermark == 11
    o.tick(Csn(12))
    assert o.watermark == 12
    o.committing("a", Csn(12))  # a commit after it still fits: its csn will be > 12
    assert o.commit("a", Csn(13)) == ["a"]
    o._check()


def test_commit_without_committing_is_accepted() -> None:
    """A stream that starts after a committing marker was logged still orders the commit."""
    o: CsnOrderer[str] = CsnOrderer("dn1")
    assert o.commit("a", Csn(5)) == ["a"]
    assert o.watermark == 5
    o._check()


@pytest.mark.parametrize(
    ("setup", "call", "words"),
    [
        (
            lambda o: o.committing("g-1", 10),
            lambda o: o.commit("g-1", 10),
            ["g-1", "csn 10", "committing csn 10"],
        ),
        (lambda o: o.committing("g-1", 10), lambda o: o.commit("g-1", 9), ["g-1", "csn 9"]),
        (lambda o: o.commit("g-1", 10), lambda o: o.commit("g-2", 10), ["g-2", "csn 10", "backwards"]),
        (
            lambda o: (o.commit("g-1", 10), o.committing("g-2", 4)),
            lambda o: o.commit("g-2", 7),
            ["g-2", "csn 7", "csn 10 was already released"],
        ),
        (lambda o: o.commit("g-1", 10), lambda o: o.commit("g-2", 7), ["g-2", "csn 7", "already released"]),
        (lambda o: o.committing("g-1", 3), lambda o: o.committing("g-1", 4), ["g-1", "duplicate"]),
        (
            lambda o: (o.committing("g-0", 1), o.committing("g-1", 3), o.commit("g-1", 5)),
            lambda o: o.committing("g-1", 6),
            ["g-1", "duplicate", "waiting"],
        ),
        (
            lambda o: (o.committing("g-0", 1), o.commit("g-1", 5)),
            lambda o: o.commit("g-1", 6),
            ["g-1", "duplicate commit", "csn 5"],
        ),
        (
            lambda o: (o.committing("g-0", 1), o.commit("g-1", 5)),
            lambda o: o.commit("g-2", 5),
            ["g-2", "csn 5", "g-1"],
        ),
        (lambda o: None, lambda o: o.abort("g-9"), ["g-9", "abort", "not committing"]),
        (lambda o: o.tick(50), lambda o: o.commit("g-1", 40), ["g-1", "csn 40", "watermark 50"]),
    ],
)
def test_protocol_errors(setup, call, words) -> None:  # type: ignore[no-untyped-def]
    o: CsnOrderer[str] = CsnOrderer("dn7")
    setup(o)
    with pytest.raises(ProtocolError) as ei:
        call(o)
    msg = str(ei.value)
    assert msg.startswith("node dn7: ")
    assert ei.value.node == "dn7"
    for w in words:
        assert w in msg, (w, msg)
    o._check()  # a refused event leaves the lists intact


def test_xid_keys_are_named_as_transactions() -> None:
    o: CsnOrderer[int] = CsnOrderer("dn1")
    o.commit(745, Csn(100))
    with pytest.raises(ProtocolError, match="transaction 746 committed with csn 90"):
        o.commit(746, Csn(90), lsn=Lsn(0x16B3748), xid=Xid(746))
