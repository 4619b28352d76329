"""A brute-force oracle for the coordinator's merge: generated clusters and a checking harness.

`scenarios()` draws K nodes and a set of global transactions with unique,
increasing CSNs; each touches 1..K nodes with per-node changes in several cids
(cids of different nodes interleave), split into random batches.  Each node
gets its own event list -- its batches in CSN order, valid watermarks (never
at or past a CSN the node will still send) anywhere between them, and either
an end or a final watermark past every CSN.

`Harness` feeds a `CsnMerge` one event at a time, obeying `wants_more` like
the I/O layer, and after every `pop_ready()` compares the result with what an
oracle that knows only what was delivered says must come out *exactly then*:
the longest run of next transactions that every node has passed (ended,
watermark >= csn, sent a later csn, or sent the last batch of that csn).  So
the merge can neither emit early (unsafe) nor hold back (liveness).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from csnd.coordinator import CsnMerge, GlobalTxn, NodeBatch
from csnd.core.ids import Csn, Lsn, Xid

CLOCK = 848_656_800_000_000  # 2026-11-22T10:00:00+00:00 in µs since 2000-01-01
# "dn10" sorts before "dn2" by name: node order must follow the merge's list, not names.
NAME_POOL = ("dn1", "dn2", "dn10", "nœud")


@dataclass
class Part:
    node: int
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    changes: list[tuple[int, int, str]]
    batches: list[NodeBatch] = field(default_factory=list)


@dataclass
class Txn:
    csn: int
    gid: str | None
    parts: dict[int, Part]  # node index -> its part


# ("batch", NodeBatch) | ("wm", int) | ("end", None)
Event = tuple[str, Any]


@dataclass
class Scenario:
    names: list[str]
    txns: list[Txn]
    events: list[list[Event]]

    def __repr__(self) -> str:
        lines = [f"Scenario(names={self.names})"]
        for t in self.txns:
            parts = {self.names[i]: [(c, b) for c, _, b in p.changes] for i, p in t.parts.items()}
            lines.append(f"  txn csn={t.csn} gid={t.gid} {parts}")
        for name, evs in zip(self.names, self.events, strict=True):
            shown = [
                f"b{e[1].csn}/{e[1].cid}{'.' if e[1].last_of_txn else '+'}"
                if e[0] == "batch"
                else f"{e[0]}{e[1]}"
                for e in evs
            ]
            lines.append(f"  {name}: {' '.join(shown)}")
        return "\n".join(lines)


def body(tag: str, lsn: int) -> str:
    """A change body as a decoder writes it: the change object after `"cid": N, `, no closing brace."""
    from csnd.core.ids import lsn_to_str

    return json.dumps(
        {"lsn": lsn_to_str(lsn), "op": "insert", "schema": "public", "table": "t€", "new": {"tag": tag}},
        ensure_ascii=False,
    )[1:-1]


@st.composite
def scenarios(draw: st.DrawFn, max_nodes: int = 4, max_txns: int = 8) -> Scenario:
    k = draw(st.integers(1, max_nodes))
    names = list(draw(st.permutations(NAME_POOL))[:k])
    single = k == 1 and draw(st.booleans())  # single-node mode: no gids
    lsn = [0x16B3600 + (i << 32) for i in range(k)]
    xid = [700 + 100 * i for i in range(k)]
    txns: list[Txn] = []
    csn = draw(st.integers(0, 3))
    for t in range(draw(st.integers(0, max_txns))):
        if t:
            csn += draw(st.integers(1, 3))
        nodes = sorted(draw(st.sets(st.integers(0, k - 1), min_size=1)))
        cids = []
        cid = draw(st.integers(0, 1))
        for _ in range(draw(st.integers(1, 4))):
            cids.append(cid)
            cid += draw(st.integers(0, 2))
        parts: dict[int, Part] = {}
        for i in nodes:
            changes: list[tuple[int, int, str]] = []
            for c in cids:
                for _ in range(draw(st.integers(0, 2))):
                    lsn[i] += 0x28
                    changes.append((c, lsn[i], body(f"{csn}.{names[i]}.{len(changes)}", lsn[i])))
            lsn[i] += 0x30
            xid[i] += 1
            parts[i] = Part(i, xid[i], lsn[i], lsn[i] + 0x30, CLOCK + draw(st.integers(0, 10**6)), changes)
        txn = Txn(csn, None if single else f"g-{t}", parts)
        for p in parts.values():
            p.batches = _split(draw, txn, p)
        txns.append(txn)
    max_csn = txns[-1].csn if txns else 0
    events = [_node_events(draw, i, txns, max_csn) for i in range(k)]
    return Scenario(names, txns, events)


def _split(draw: st.DrawFn, txn: Txn, p: Part) -> list[NodeBatch]:
    """Cut a node's part into batches of one cid each, at random points; the last one flagged."""
    chunks: list[tuple[int, list[tuple[int, int, str]]]] = []
    for change in p.changes:
        if chunks and chunks[-1][0] == change[0] and not draw(st.booleans()):
            chunks[-1][1].append(change)
        else:
            chunks.append((change[0], [change]))
    if not chunks:
        chunks.append((0, []))
    return [
        NodeBatch(
            Csn(txn.csn),
            txn.gid,
            Xid(p.xid),
            Lsn(p.commit_lsn),
            Lsn(p.end_lsn),
            p.commit_time,
            cid,
            chunk,
            j == len(chunks) - 1,
        )
        for j, (cid, chunk) in enumerate(chunks)
    ]


def _node_events(draw: st.DrawFn, i: int, txns: list[Txn], max_csn: int) -> list[Event]:
    events: list[Event] = []
    wm = -1

    def maybe_watermark(below: int) -> None:
        # Valid: nothing this node still sends has a csn <= the watermark.  Sometimes lower than before
        # (the merge keeps the largest).
        nonlocal wm
        if below - 1 >= max(wm - 1, -1) and draw(st.integers(0, 3)) == 0:
            w = draw(st.integers(max(wm - 1, -1), below - 1))
            events.append(("wm", w))
            wm = max(wm, w)

    for t in txns:
        p = t.parts.get(i)
        if p is None:
            continue
        maybe_watermark(t.csn)
        for b in p.batches:
            events.append(("batch", b))
            if not b.last_of_txn:
                maybe_watermark(t.csn)
    maybe_watermark(max_csn + 4)
    if draw(st.booleans()):
        events.append(("end", None))
    else:
        events.append(("wm", draw(st.integers(max(max_csn, wm), max_csn + 3))))
    return events


class Harness:
    """Drives a CsnMerge through a scenario and checks every pop_ready() against the oracle."""

    def __init__(self, sc: Scenario, max_batches: int = 10**9, max_bytes: int = 10**12) -> None:
        self.sc = sc
        k = len(sc.names)
        self.merge = CsnMerge(list(sc.names), max_pending_batches=max_batches, max_pending_bytes=max_bytes)
        self.pos = [0] * k
        # What the oracle knows of each node from the events delivered so far.
        self.wm = [-1] * k
        self.ended = [False] * k
        self.max_csn = [-1] * k
        self.complete = [True] * k  # its last batch so far was the last of its transaction
        self.next_txn = 0
        self.emitted: list[GlobalTxn] = []

    def remaining(self, i: int) -> bool:
        return self.pos[i] < len(self.sc.events[i])

    def eligible(self) -> list[int]:
        """Nodes the I/O layer would read now: events left and the merge wants more."""
        return [
            i for i, name in enumerate(self.sc.names) if self.remaining(i) and self.merge.wants_more(name)
        ]

    def deliver(self, i: int) -> None:
        kind, value = self.sc.events[i][self.pos[i]]
        self.pos[i] += 1
        name = self.sc.names[i]
        if kind == "batch":
            self.merge.add_batch(name, value)
            self.max_csn[i] = max(self.max_csn[i], value.csn)
            self.complete[i] = value.last_of_txn
        elif kind == "wm":
            self.merge.add_watermark(name, value)
            self.wm[i] = max(self.wm[i], value)
        else:
            self.merge.node_ended(name)
            self.ended[i] = True
        self.merge._check()

    def passed(self, i: int, csn: int) -> bool:
        """From what node i delivered: it will send nothing with a CSN <= csn."""
        return (
            self.ended[i]
            or self.wm[i] >= csn
            or self.max_csn[i] > csn
            or (self.max_csn[i] == csn and self.complete[i])
        )

    def pop(self) -> list[GlobalTxn]:
        got = self.merge.pop_ready()
        self.merge._check()
        want: list[Txn] = []
        txns = self.sc.txns
        while self.next_txn < len(txns) and all(
            self.passed(i, txns[self.next_txn].csn) for i in range(len(self.sc.names))
        ):
            want.append(txns[self.next_txn])
            self.next_txn += 1
        assert [g.csn for g in got] == [t.csn for t in want], (
            f"emitted {[g.csn for g in got]}, oracle says {[t.csn for t in want]}"
        )
        for g, t in zip(got, want, strict=True):
            check_txn(self.sc, g, t)
        if self.emitted and got:
            assert got[0].csn > self.emitted[-1].csn
        self.emitted.extend(got)
        # Back-pressure never deadlocks: if anything is left to read, someone wants it.
        if any(self.remaining(i) for i in range(len(self.sc.names))):
            assert self.eligible(), "every node with events left is back-pressured and nothing can be emitted"
        return got

    def finish(self) -> None:
        """Deliver everything left (obeying back-pressure), then everything must have come out."""
        while any(self.remaining(i) for i in range(len(self.sc.names))):
            self.pop()
            self.deliver(self.eligible()[0])
        self.pop()
        assert [g.csn for g in self.emitted] == [t.csn for t in self.sc.txns]
        assert not self.merge.has_pending()


def check_txn(sc: Scenario, g: GlobalTxn, t: Txn) -> None:
    names = sc.names
    assert (g.csn, g.gid) == (t.csn, t.gid)
    order = sorted(t.parts)
    assert list(g.nodes.items()) == [
        (names[i], (t.parts[i].xid, t.parts[i].commit_lsn, t.parts[i].commit_time)) for i in order
    ]
    assert g.end_lsns == {names[i]: t.parts[i].end_lsn for i in order}
    assert g.commit_time == max(p.commit_time for p in t.parts.values())
    changes = g.changes
    assert len(changes) == g.n_changes == sum(len(p.changes) for p in t.parts.values())
    for i in order:  # each node's changes keep their stream order
        assert [(c, lsn, b) for n, c, lsn, b in changes if n == names[i]] == t.parts[i].changes
    cids = [c for _, c, _, _ in changes]
    assert cids == sorted(cids), "cid decreased inside a transaction"
    line = g.to_json_line()
    assert "\n" not in line
    assert line == json.dumps(json_object(g), ensure_ascii=False)


def json_object(g: GlobalTxn) -> dict[str, Any]:
    """The docs/design.md section 7 object of a GlobalTxn, built independently of the writer."""
    from csnd.core.ids import lsn_to_str, pg_time_to_iso

    return {
        "csn": g.csn,
        "gid": g.gid,
        "commit_time": pg_time_to_iso(g.commit_time),
        "nodes": {n: {"xid": c.xid, "commit_lsn": lsn_to_str(c.commit_lsn)} for n, c in g.nodes.items()},
        "changes": [{"node": n, "cid": c, **_checked_body(b, lsn)} for n, c, lsn, b in g.changes],
    }


def _checked_body(b: str, lsn: int) -> dict[str, Any]:
    """A body as an object; it must open with the change's own LSN."""
    from csnd.core.ids import lsn_to_str

    obj: dict[str, Any] = json.loads("{" + b + "}")
    assert next(iter(obj)) == "lsn" and obj["lsn"] == lsn_to_str(lsn), b
    return obj
