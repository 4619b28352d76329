"""NodeSender on generated walsender output, against a model of the node.

The machine plays one node: transactions write changes (in savepoints too),
log markers and commit or roll back; the emulated walsender turns that into
what pgoutput v2 with `streaming 'on'` sends, in its order -- non-transactional
messages at once, plain transactions whole at their commit, large ones in
stream blocks interleaved with everything else, Stream Abort for rolled-back
savepoints whose changes were already streamed.  Each item is fed to the
sender at once, and after every step:

* released transactions carry exactly the model's changes (cid, lsn, body),
  csn, gid, xid, commit LSN, end LSN and commit time;
* CSNs are released strictly increasing, and exactly the committed
  transactions no open one can undercut are out (the brute-force oracle);
* the watermark never decreases and stays below every CSN released later;
* the confirmable LSN never decreases, never passes the commit of an
  unreleased transaction or the committing marker of an unreleased one;
  each transaction of a group released by one event carries its own, never
  past the commit of one released after it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from csnd.core.ids import Lsn, Xid
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.reader.pgoutput import (
    Begin,
    Column,
    Commit,
    Keepalive,
    LogicalMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from csnd.sender import FinishedTxn, NodeSender

RECORD = 24  # bytes per WAL record in the model
COMMIT_RECORD = 88
REL = Relation(None, 16384, "public", "t", "d", (Column(1, "id", 23, -1),))


class _Txn:
    """One local transaction of the model."""

    def __init__(self, xid: int, gid: str) -> None:
        self.xid = xid
        self.gid = gid
        self.cid = 0
        self.subs: list[int] = []  # open savepoints, innermost last
        self.sent_subs: set[int] = set()  # (sub)xids with changes already streamed
        self.pending: list[
            tuple[Any, ...]
        ] = []  # not yet sent: ("c", lsn, sub, body, cid) | ("m", lsn, sub, text)
        self.changes: list[tuple[int, int, int, str]] = []  # (cid, lsn, sub, body), live ones
        self.streamed = False
        self.state = "active"  # -> committing -> csn -> committed | aborted
        self.committing_csn: int | None = None
        self.committing_pos = 0  # record start of the committing marker
        self.csn: int | None = None
        self.commit_lsn = 0
        self.released = False
        self.has_marker = False


class NodeMachine(RuleBasedStateMachine):
    MODE = "gtm"

    def __init__(self) -> None:
        super().__init__()
        self.gtm = self.MODE == "gtm"
        self.ns = NodeSender("dn1", self.MODE)
        self.runs = False
        self.pos = 0x1000000
        self.g = 1000
        self.next_xid = 700
        self.txns: dict[int, _Txn] = {}
        self.by_gid: dict[str, _Txn] = {}
        self.released: list[int] = []
        self.max_wm: int | None = None
        self.max_conf = 0
        self.time = 0

    @initialize(spill=st.sampled_from([10**9, 200]), load=st.sampled_from([4, 1000]), runs=st.booleans())
    def setup(self, spill: int, load: int, runs: bool) -> None:
        self.ns = NodeSender("dn1", self.MODE, spill_bytes=spill)
        self.ns.orderer._set_load(load)
        self.runs = runs  # changes as DecodedRuns (the decoder pool's form) or one by one

    def _feed_items(self, items: list[tuple[Any, ...]], streamed: bool) -> None:
        """A transaction's pending changes and markers, consecutive changes of one sub as one run if `runs`."""
        i = 0
        while i < len(items):
            item = items[i]
            if item[0] == "m":
                _, lsn, sub, text = item
                xid = sub if streamed else None
                self._feed(lsn, LogicalMessage(xid, True, lsn, "csn", text.encode("ascii")))
                i += 1
                continue
            sub = item[2] if streamed else None
            j = i + 1
            if self.runs:
                while j < len(items) and items[j][0] == "c" and (items[j][2] if streamed else None) == sub:
                    j += 1
                lsns = [it[1] for it in items[i:j]]
                self._feed(lsns[0], DecodedRun(sub, lsns, [it[3] for it in items[i:j]]))
            else:
                self._feed(item[1], DecodedRun(sub, [item[1]], [item[3]], "insert"))
            i = j

    # --- helpers ------------------------------------------------------------------------

    def _record(self, size: int = RECORD) -> int:
        start = self.pos
        self.pos += size
        return start

    def _xid(self) -> int:
        self.next_xid += 1
        return self.next_xid

    def _feed(self, lsn: int, item: DecodedItem) -> None:
        group = self.ns.feed(Lsn(lsn), item)
        for txn in group:
            self._released(txn)
        # One event may release several: each carries the confirmable LSN as it stood once it was out,
        # never past the commit of one released after it (that one may not be durable yet).
        for i, txn in enumerate(group):
            assert all(txn.confirmable <= later.commit_lsn for later in group[i + 1 :]), (i, txn.confirmable)
            assert i == 0 or txn.confirmable >= group[i - 1].confirmable
        if group:
            assert group[-1].confirmable == self.ns.confirmable_lsn
        self.ns._check()

    def _released(self, ft: FinishedTxn) -> None:
        key = ft.gid if self.gtm else ft.xid
        assert key is not None
        t = self.by_gid[ft.gid] if self.gtm and ft.gid is not None else self.txns[ft.xid]
        assert t.state == "committed" and not t.released, f"{key} released twice or uncommitted"
        t.released = True
        assert ft.node == "dn1"
        assert ft.csn == t.csn and ft.xid == t.xid and ft.commit_lsn == t.commit_lsn
        assert ft.end_lsn == t.commit_lsn + COMMIT_RECORD and ft.commit_time == t.xid * 10
        assert ft.gid == (t.gid if self.gtm else None)
        want = [(cid, lsn, body) for cid, lsn, _, body in t.changes]
        assert ft.n_changes == len(want)
        assert list(ft.changes) == want
        if self.released:
            assert ft.csn > self.released[-1], f"csn {ft.csn} released after {self.released[-1]}"
        if self.max_wm is not None:
            assert ft.csn > self.max_wm, f"csn {ft.csn} released at or below watermark {self.max_wm}"
        for o in self.txns.values():  # nothing that may still commit is smaller
            if o.state in ("committing", "csn"):
                assert o.csn is None or o.csn > ft.csn
        self.released.append(ft.csn)

    def _active(self) -> list[_Txn]:
        return [t for t in self.txns.values() if t.state in ("active", "committing", "csn")]

    def _pick(self, cands: list[_Txn], pick: int) -> _Txn:
        return cands[pick % len(cands)]

    def _message(self, text: str, transactional: bool, sub: int | None) -> tuple[int, LogicalMessage]:
        start = self._record(RECORD + len(text))
        end = start + RECORD + len(text)
        return end, LogicalMessage(
            None if sub is None else Xid(sub), transactional, Lsn(end), "csn", text.encode("ascii")
        )

    def _send_block(self, t: _Txn) -> None:
        """One stream block with everything the txn has buffered (the walsender's ReorderBufferStreamTXN)."""
        first = not t.streamed
        t.streamed = True
        lsn0 = t.pending[0][1] if t.pending else self.pos
        self._feed(lsn0, StreamStart(Xid(t.xid), first))
        self._feed(0, Relation(Xid(t.xid), REL.relid, "public", "t", "d", REL.columns))
        t.sent_subs.update(item[2] for item in t.pending if item[0] == "c")
        self._feed_items(t.pending, streamed=True)
        t.pending = []
        self._feed(0, StreamStop())

    # --- transactions -----------------------------------------------------------------

    @precondition(lambda self: len(self._active()) < 6)
    @rule(n=st.integers(0, 3))
    def begin(self, n: int) -> None:
        xid = self._xid()
        t = _Txn(xid, f"g-{xid}")
        self.txns[xid] = t
        self.by_gid[t.gid] = t
        self._changes(t, n)

    @precondition(lambda self: any(t.state == "active" for t in self.txns.values()))
    @rule(pick=st.integers(0, 10**6), n=st.integers(1, 4))
    def change(self, pick: int, n: int) -> None:
        self._changes(self._pick([t for t in self.txns.values() if t.state == "active"], pick), n)

    def _changes(self, t: _Txn, n: int) -> None:
        sub = t.subs[-1] if t.subs else t.xid
        for _ in range(n):
            lsn = self._record()
            body = f'"op": "insert", "new": {{"id": {lsn}}}, "pad": "{"p" * (lsn % 40)}"'
            t.pending.append(("c", lsn, sub, body))
            t.changes.append((t.cid, lsn, sub, body))

    @precondition(lambda self: any(t.state == "active" for t in self.txns.values()))
    @rule(pick=st.integers(0, 10**6))
    def savepoint(self, pick: int) -> None:
        t = self._pick([t for t in self.txns.values() if t.state == "active"], pick)
        t.subs.append(self._xid())

    @precondition(lambda self: any(t.subs for t in self._active()))
    @rule(pick=st.integers(0, 10**6), rollback=st.booleans())
    def end_savepoint(self, pick: int, rollback: bool, t: _Txn | None = None) -> None:
        t = t or self._pick([t for t in self._active() if t.subs], pick)
        sub = t.subs.pop()
        if not rollback:
            return  # RELEASE: its changes stay, with its subxid
        t.changes = [c for c in t.changes if c[2] != sub]
        t.pending = [p for p in t.pending if p[2] != sub]
        if sub in t.sent_subs:
            self._feed(self.pos, StreamAbort(Xid(t.xid), Xid(sub)))

    @precondition(lambda self: any(t.state == "active" for t in self.txns.values()))
    @rule(pick=st.integers(0, 10**6), n=st.integers(1, 4), stream=st.booleans(), rollback=st.booleans())
    def savepoint_work(self, pick: int, n: int, stream: bool, rollback: bool) -> None:
        """SAVEPOINT, a few changes, maybe streamed, then ROLLBACK TO or RELEASE (a common shape)."""
        t = self._pick([t for t in self.txns.values() if t.state == "active"], pick)
        t.subs.append(self._xid())
        self._changes(t, n)
        if stream:
            self._send_block(t)
        self.end_savepoint(t.xid, rollback, t)

    @precondition(
        lambda self: self.gtm and any(t.state == "active" and not t.subs for t in self.txns.values())
    )
    @rule(pick=st.integers(0, 10**6), step=st.integers(0, 3))
    def cid_marker(self, pick: int, step: int) -> None:
        t = self._pick([t for t in self.txns.values() if t.state == "active" and not t.subs], pick)
        t.cid += step
        lsn = self._record()
        t.pending.append(("m", lsn, t.xid, f"cid {t.cid}"))

    @precondition(lambda self: any(t.pending for t in self._active()))
    @rule(pick=st.integers(0, 10**6))
    def stream(self, pick: int) -> None:
        self._send_block(self._pick([t for t in self._active() if t.pending], pick))

    # --- the commit protocol -----------------------------------------------------------

    @precondition(lambda self: self.gtm and any(t.state == "active" for t in self.txns.values()))
    @rule(pick=st.integers(0, 10**6))
    def log_committing(self, pick: int, t: _Txn | None = None) -> None:
        t = t or self._pick([t for t in self.txns.values() if t.state == "active"], pick)
        t.state = "committing"
        t.committing_csn = self.g
        t.committing_pos = self.pos
        lsn, msg = self._message(f"committing {t.gid} {self.g}", False, None)
        self._feed(lsn, msg)

    @precondition(lambda self: any(t.state == "committing" for t in self.txns.values()))
    @rule(pick=st.integers(0, 10**6))
    def take_csn(self, pick: int, t: _Txn | None = None) -> None:
        t = t or self._pick([t for t in self.txns.values() if t.state == "committing"], pick)
        self.g += 1
        t.csn = self.g
        t.state = "csn"
        t.has_marker = True
        lsn = self._record()
        t.pending.append(("m", lsn, t.xid, f"commit {t.gid} {t.csn}"))

    @precondition(
        lambda self: self.gtm and any(t.state == "active" and not t.subs for t in self.txns.values())
    )
    @rule(pick=st.integers(0, 10**6))
    def commit_protocol(self, pick: int) -> None:
        """committing, CSN, commit in one step (the separate rules interleave them)."""
        t = self._pick([t for t in self.txns.values() if t.state == "active" and not t.subs], pick)
        self.log_committing(0, t)
        self.take_csn(0, t)
        self._commit(t)

    @precondition(lambda self: any(self._committable(t) for t in self.txns.values()))
    @rule(pick=st.integers(0, 10**6), keepalive=st.booleans())
    def commit(self, pick: int, keepalive: bool) -> None:
        t = self._pick([t for t in self.txns.values() if self._committable(t)], pick)
        self._commit(t, keepalive)

    def _committable(self, t: _Txn) -> bool:
        if self.gtm:
            # with its marker; or a writer-less txn whose changes all rolled back
            return t.state == "csn" or (t.state == "active" and not t.changes and not t.subs)
        return t.state == "active" and not t.subs

    def _commit(self, t: _Txn, keepalive: bool = False) -> None:
        """`keepalive`: the walsender sends one while it outputs the txn, with the WAL end past its commit."""
        t.commit_lsn = self._record(COMMIT_RECORD)
        end = t.commit_lsn + COMMIT_RECORD
        t.state = "committed"
        if not self.gtm:
            t.csn = t.commit_lsn
        if t.streamed:
            if t.pending:
                self._send_block(t)
            if keepalive:
                self._feed(end, Keepalive(Lsn(end), 0, False))
            self._feed(end, StreamCommit(Xid(t.xid), 0, Lsn(t.commit_lsn), Lsn(end), t.xid * 10))
        else:
            first = t.pending[0][1] if t.pending else t.commit_lsn
            self._feed(first, Begin(Lsn(t.commit_lsn), t.xid * 10, Xid(t.xid)))
            self._feed_items(t.pending, streamed=False)
            t.pending = []
            if keepalive:
                self._feed(end, Keepalive(Lsn(end), 0, False))
            self._feed(end, Commit(0, Lsn(t.commit_lsn), Lsn(end), t.xid * 10))
        if not t.has_marker and not t.changes:
            t.released = True  # skipped: nothing to deliver

    @precondition(lambda self: bool(self._active()))
    @rule(pick=st.integers(0, 10**6))
    def abort(self, pick: int) -> None:
        t = self._pick(self._active(), pick)
        self._abort(t)

    def _abort(self, t: _Txn) -> None:
        self._record()  # the abort record
        was = t.state
        t.state = "aborted"
        if t.streamed:
            self._feed(self.pos, StreamAbort(Xid(t.xid), Xid(t.xid)))
        if was in ("committing", "csn"):
            lsn, msg = self._message(f"abort {t.gid}", False, None)
            self._feed(lsn, msg)

    @rule(kind=st.sampled_from(["keepalive", "tick", "app", "gtm"]))
    def background(self, kind: str) -> None:
        """What else reaches a node's stream: keepalives, ticks, other messages, other nodes' CSNs."""
        if kind == "keepalive":
            self._feed(self.pos, Keepalive(Lsn(self.pos), 0, False))
        elif kind == "tick" and self.gtm:
            lsn, msg = self._message(f"tick {self.g}", False, None)
            self._feed(lsn, msg)
        elif kind == "app":  # another prefix: neither a change nor a marker
            lsn = self._record()
            self._feed(lsn, LogicalMessage(None, False, Lsn(lsn), "app", b"hello"))
        else:
            self.g += 1

    # --- the oracle -----------------------------------------------------------------------

    @invariant()
    def check(self) -> None:
        ns = self.ns
        # exactly the committed txns no open one can undercut are released
        open_csns = [
            c
            for t in self.txns.values()
            if t.state in ("committing", "csn") and (c := t.committing_csn) is not None
        ]
        floor = min(open_csns, default=None)
        for t in self.txns.values():
            if t.state != "committed" or (not t.has_marker and not t.changes):
                continue
            assert t.csn is not None
            releasable = not self.gtm or floor is None or t.csn <= floor
            assert t.released == releasable, (t.gid, t.csn, floor, t.released)
        wm = ns.watermark
        if wm is not None:
            assert self.max_wm is None or wm >= self.max_wm, "watermark went down"
            self.max_wm = wm
            if self.gtm:
                assert wm <= self.g
            for t in self.txns.values():
                if t.state in ("csn", "committed") and not t.released and t.csn is not None:
                    assert wm < t.csn
        conf = ns.confirmable_lsn
        assert conf >= self.max_conf, "confirmable lsn went down"
        self.max_conf = conf
        for t in self.txns.values():
            if t.state == "committed" and not t.released:
                assert conf <= t.commit_lsn, f"confirmable {conf:X} passes unreleased commit {t.commit_lsn:X}"
            unreleased = t.state in ("committing", "csn") or (t.state == "committed" and not t.released)
            if unreleased and t.committing_csn is not None:
                assert conf <= t.committing_pos, "confirmable passes an unreleased committing marker"

    def teardown(self) -> None:
        for t in sorted(self._active(), key=lambda t: t.xid):
            if t.state == "committing" or (t.state == "active" and self.gtm and (t.changes or t.subs)):
                self._abort(t)
            else:
                t.subs = []
                self._commit(t)
            self.check()
        self.ns.finish()
        for t in self.txns.values():
            if t.state == "committed":
                assert t.released, f"{t.gid} never released"
        assert self.released == sorted(self.released)
        # once everything is out and the node idles, the slot may be confirmed up to the end
        self._feed(self.pos, Keepalive(Lsn(self.pos), 0, False))
        assert self.ns.confirmable_lsn == self.pos


class SingleNodeMachine(NodeMachine):
    MODE = "single"

    @invariant()
    def single_watermark(self) -> None:
        wm = self.ns.watermark
        if wm is not None:
            assert wm < self.pos, "a future commit LSN is >= the WAL end"


SETTINGS = settings(max_examples=200, stateful_step_count=80, deadline=None)
NodeMachine.TestCase.settings = SETTINGS
SingleNodeMachine.TestCase.settings = SETTINGS
TestGtmNode = NodeMachine.TestCase
TestSingleNode = SingleNodeMachine.TestCase
