"""pop_events(): transactions stream through the merge instead of being held whole."""

from __future__ import annotations

from csnd.coordinator import (
    CsnMerge,
    GlobalTxn,
    TxnEnd,
    TxnPart,
    TxnStart,
    json_changes,
    json_head,
    json_line,
)
from csnd.coordinator.jsonlines import JSON_TAIL
from csnd.core.ids import Csn
from tests.coordinator.helpers import CLOCK, batch


def test_a_huge_transaction_streams_with_nothing_held() -> None:
    merge = CsnMerge(["dn1", "dn2"])
    merge.add_watermark("dn2", Csn(10))  # dn2 is idle past the big transaction
    seen_start = False
    parts = 0
    for i in range(500):
        merge.add_batch("dn1", batch(5, tags=(f"t{i}",), last=i == 499))
        events = merge.pop_events()
        # each batch goes straight out: the merge keeps nothing it has taken
        assert merge.pending_batches("dn1") == 0 and merge.pending_bytes("dn1") == 0
        for ev in events:
            if isinstance(ev, TxnStart):
                assert not seen_start and i == 0, "the header comes with the first batch"
                seen_start = True
            elif isinstance(ev, TxnPart):
                parts += 1
            else:
                assert isinstance(ev, TxnEnd) and i == 499 and ev.nodes == ["dn1"]
    assert parts == 500


def test_distributed_header_names_every_participant_at_the_first_batch() -> None:
    """Both nodes' first batches are here, so the header is complete before any change."""
    merge = CsnMerge(["dn1", "dn2"])
    merge.add_batch("dn2", batch(7, "g7", cid=0, tags=("b0",), xid=900, time=CLOCK + 5, last=False))
    merge.add_batch("dn1", batch(7, "g7", cid=0, tags=("a0",), xid=800, last=False))
    events = merge.pop_events()
    start = events[0]
    assert isinstance(start, TxnStart)
    assert list(start.nodes) == ["dn1", "dn2"]
    assert start.nodes["dn2"].xid == 900 and start.commit_time == CLOCK + 5
    assert not any(isinstance(e, TxnEnd) for e in events)  # both still owe their last batch
    merge.add_batch("dn1", batch(7, "g7", cid=1, tags=("a1",), xid=800))
    merge.add_batch("dn2", batch(7, "g7", cid=2, tags=("b2",), xid=900, time=CLOCK + 5))
    merge.node_ended("dn1")
    merge.node_ended("dn2")
    events += merge.pop_events()
    assert isinstance(events[-1], TxnEnd) and events[-1].nodes == ["dn1", "dn2"]


def test_streamed_json_is_byte_identical_to_the_whole_line() -> None:
    """The writer's pieces (head, parts, tail) join to exactly json_line() of the same transaction."""
    a, b = CsnMerge(["dn1", "dn2"]), CsnMerge(["dn1", "dn2"])
    feed = [
        ("dn1", batch(3, "g3", cid=0, tags=("x", "ü"), xid=1, last=False)),
        ("dn2", batch(3, "g3", cid=0, tags=("y",), xid=2, last=False)),
        ("dn2", batch(3, "g3", cid=1, tags=(), xid=2)),
        ("dn1", batch(3, "g3", cid=2, tags=("z",), xid=1)),
        ("dn1", batch(4, "g4", tags=(), xid=3)),
    ]
    for node, bt in feed:
        a.add_batch(node, bt)
        b.add_batch(node, bt)
    for m in (a, b):
        m.node_ended("dn1")
        m.node_ended("dn2")
    whole: list[GlobalTxn] = a.pop_ready()
    text, first = [], True
    for ev in b.pop_events():
        if isinstance(ev, TxnStart):
            text.append(json_head(ev.csn, ev.gid, ev.commit_time, ev.nodes))
            first = True
        elif isinstance(ev, TxnPart):
            text.append(json_changes(ev.node, ev.changes, first))
            first = False
        else:
            text.append(JSON_TAIL + "\n")
    assert "".join(text) == "".join(json_line(t) + "\n" for t in whole)
    assert len(whole) == 2
