"""CsnOrderer starting mid-stream (`settling`) against a brute-force oracle.

The machine plays one node whose stream starts while some transactions are
committing already: their `committing` markers lie before the start, so the
orderer never sees them (hidden), only their commits -- or nothing at all
for their aborts (the node sender drops an abort of a gid it never saw).  The
orderer starts settling and is settled once every hidden transaction is
decided, as `csnd.reader.settle` makes sure before its start message.

Oracle, from first principles: a CSN may be released only when no
transaction still open -- hidden or not -- can end with a smaller one, and
releases strictly increase; the watermark stays below every CSN still to
come.  Nothing is released and no watermark is known while settling; at the
end every committed transaction was released, in CSN order.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from csnd.core.errors import ConfigError, TruncatedStream
from csnd.core.ids import Csn, Lsn, Xid
from csnd.reader.pgoutput import Begin, Commit, LogicalMessage
from csnd.sender import FinishedTxn, NodeSender
from csnd.sender.ordering import CsnOrderer


class _T:
    __slots__ = ("gid", "committing", "csn", "state", "hidden")

    def __init__(self, gid: str, committing: int, hidden: bool) -> None:
        self.gid = gid
        self.committing = committing
        self.csn: int | None = None
        self.state = "committing"  # -> committed | aborted
        self.hidden = hidden  # its committing marker lies before the stream's start


class SettlingMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.o: CsnOrderer[str] = CsnOrderer("dn1", settling=True)
        self.g = 100
        self.txns: dict[str, _T] = {}
        self.n = 0
        self.released: list[int] = []
        self.settled = False
        self.max_wm: int | None = None

    @initialize(load=st.sampled_from([4, 1000]), hidden=st.integers(0, 4), with_csn=st.integers(0, 4))
    def setup(self, load: int, hidden: int, with_csn: int) -> None:
        self.o._set_load(load)
        for i in range(hidden):
            t = self.txns[f"h-{i}"] = _T(f"h-{i}", self.g, hidden=True)
            if i < with_csn:
                self.g += 1
                t.csn = self.g

    def _open(self) -> list[_T]:
        return [t for t in self.txns.values() if t.state == "committing"]

    def _pick(self, pick: int, cands: list[_T]) -> _T:
        return cands[pick % len(cands)]

    @rule()
    def log_committing(self) -> None:
        self.n += 1
        t = self.txns[f"g-{self.n}"] = _T(f"g-{self.n}", self.g, hidden=False)
        self.o.committing(t.gid, Csn(t.committing))
        self._after([])

    @precondition(lambda self: any(t.csn is None for t in self._open()))
    @rule(pick=st.integers(0, 10**6))
    def take_csn(self, pick: int) -> None:
        t = self._pick(pick, [t for t in self._open() if t.csn is None])
        self.g += 1
        t.csn = self.g

    @rule(k=st.integers(1, 5))
    def gtm_elsewhere(self, k: int) -> None:
        self.g += k

    @precondition(lambda self: any(t.csn is not None for t in self._open()))
    @rule(pick=st.integers(0, 10**6), tick_too=st.booleans())
    def commit(self, pick: int, tick_too: bool) -> None:
        t = self._pick(pick, [t for t in self._open() if t.csn is not None])
        assert t.csn is not None
        t.state = "committed"
        # (the sender's derived tick: the commit's own CSN)
        self._after(self.o.commit(t.gid, Csn(t.csn), tick=Csn(t.csn) if tick_too else None))

    @precondition(lambda self: bool(self._open()))
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick: int) -> None:
        t = self._pick(pick, self._open())
        t.state = "aborted"
        self._after([] if t.hidden else self.o.abort(t.gid))

    @rule()
    def tick(self) -> None:
        self.o.tick(Csn(self.g))
        self._after([])

    @precondition(lambda self: not self.settled and not any(t.hidden for t in self._open()))
    @rule()
    def settle(self) -> None:
        self.settled = True
        self._after(self.o.settle())

    # --- the oracle ---------------------------------------------------------------

    def _after(self, released_keys: list[str]) -> None:
        for key in released_keys:
            t = self.txns[key]
            assert t.state == "committed" and t.csn is not None
            c = t.csn
            for o in self._open():
                assert o.csn is None or o.csn > c, f"released {c} while {o.gid} may commit with {o.csn}"
            assert not self.released or c > self.released[-1], f"released {c} after {self.released[-1]}"
            assert self.max_wm is None or c > self.max_wm, f"released {c} at or below a watermark"
            self.released.append(c)

    @invariant()
    def check(self) -> None:
        o = self.o
        o._check()
        assert o.settling is not self.settled
        wm = o.watermark
        if not self.settled:
            assert self.released == [] and wm is None
            return
        floor = min((t.committing for t in self._open()), default=None)
        committed = sorted(t.csn for t in self.txns.values() if t.state == "committed" and t.csn is not None)
        assert self.released == [c for c in committed if floor is None or c <= floor]
        if wm is not None:
            assert self.max_wm is None or wm >= self.max_wm, "watermark went down"
            self.max_wm = wm
            to_come = [t.csn for t in self._open() if t.csn is not None]
            to_come += [c for c in committed if c not in set(self.released)]
            assert all(wm < c for c in to_come), (wm, to_come)

    def teardown(self) -> None:
        for t in sorted(self._open(), key=lambda t: t.gid):
            if t.csn is None:
                t.state = "aborted"
                self._after([] if t.hidden else self.o.abort(t.gid))
            else:
                t.state = "committed"
                self._after(self.o.commit(t.gid, Csn(t.csn)))
        if not self.settled:
            self.settle()
        self.check()
        committed = sorted(t.csn for t in self.txns.values() if t.state == "committed" and t.csn is not None)
        assert self.released == committed
        assert self.o.n_waiting == 0 and self.o.n_committing == 0


SettlingMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
TestSettling = SettlingMachine.TestCase


def test_a_commit_from_before_the_start_is_ordered_with_the_larger_one_that_came_first() -> None:
    """The issue's case: csn 102 commits first, then 101 whose committing marker was never seen."""
    o: CsnOrderer[str] = CsnOrderer("dn1", settling=True)
    assert o.commit("g2", Csn(102), tick=Csn(102)) == []
    assert o.commit("gT", Csn(101), tick=Csn(101)) == []
    assert o.watermark is None
    assert o.settle() == ["gT", "g2"]
    assert o.watermark == 102
    assert o.settle() == []  # (once only)


# --- the node sender's start message ------------------------------------------------


class _Stream:
    """A GTM node's stream, fed to a `NodeSender` that starts mid-way (`start_token`)."""

    def __init__(self, token: str = "t0") -> None:
        self.ns = NodeSender("dn1", "gtm", start_token=token)
        self.pos = 0x2000000
        self.xid = 700

    def _at(self, size: int = 40) -> Lsn:
        self.pos += size
        return Lsn(self.pos)

    def message(self, prefix: str, content: str, transactional: bool = False) -> list[FinishedTxn]:
        at = self._at()
        return self.ns.feed(at, LogicalMessage(None, transactional, at, prefix, content.encode("ascii")))

    def commit(self, gid: str, csn: int) -> list[FinishedTxn]:
        self.xid += 1
        xid = Xid(self.xid)
        first, marker, commit_lsn = self._at(), self._at(), self._at()
        out = self.ns.feed(first, Begin(commit_lsn, 0, xid))
        out += self.ns.feed(marker, LogicalMessage(xid, True, marker, "csn", f"commit {gid} {csn}".encode()))
        out += self.ns.feed(commit_lsn, Commit(0, commit_lsn, self._at(), 0))
        return out


def test_the_sender_holds_everything_until_its_own_start_message() -> None:
    s = _Stream("t0")
    assert s.commit("g2", 102) == []  # committing marker seen nowhere: it may be from before the start
    assert s.message("csn", "abort gA") == []  # an abort whose committing lay before the start: nothing
    assert s.commit("gT", 101) == []
    assert s.message("csnd.start", "another-start") == []  # (another service's, or an earlier start's)
    assert s.message("csnd.start", "t0", transactional=True) == []  # (not the form settle writes)
    assert s.ns.watermark is None and s.ns.confirmable_lsn == 0
    out = s.message("csnd.start", "t0")
    assert [(t.gid, t.csn) for t in out] == [("gT", 101), ("g2", 102)]
    assert s.ns.watermark == 102
    s.ns._check()
    s.ns.finish()


def test_a_stream_that_ends_before_its_start_is_settled_says_so() -> None:
    s = _Stream("t0")
    s.commit("g2", 102)
    with pytest.raises(
        TruncatedStream, match=r"before its start was settled .*global transaction g2, csn 102"
    ):
        s.ns.finish()
    empty = _Stream("t1")  # (nothing gathered: nothing to order, nothing lost)
    empty.message("csn", "tick 5")
    empty.ns.finish()


def test_a_start_token_is_for_gtm_mode() -> None:
    with pytest.raises(ConfigError, match="gtm-mode"):
        NodeSender("dn1", "single", start_token="t0")
