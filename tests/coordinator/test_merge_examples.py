"""Hand-picked merge cases: idle and slow nodes, joins, batch rotation, back-pressure, statistics."""

from __future__ import annotations

from csnd.coordinator import CsnMerge, NodeCommit
from csnd.core.ids import Csn, Lsn, Xid
from tests.coordinator.helpers import CLOCK, batch, tags


def csns(m: CsnMerge) -> list[Csn]:
    out = [t.csn for t in m.pop_ready()]
    m._check()
    return out


def test_idle_node_stalls_until_it_sends_a_watermark() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(10))
    m.add_batch("dn1", batch(20))
    assert csns(m) == []  # dn2 might still send csn 5
    m.add_watermark("dn2", Csn(12))
    assert csns(m) == [10]
    m.add_watermark("dn2", Csn(25))
    assert csns(m) == [20]
    assert not m.has_pending()


def test_slow_node_is_never_overtaken() -> None:
    m = CsnMerge(["dn1", "dn2"])
    for c in (10, 20, 30):
        m.add_batch("dn1", batch(c))
    m.add_watermark("dn2", Csn(9))
    assert csns(m) == []
    m.add_batch("dn2", batch(15))  # the slow node's smaller csn still comes first
    assert csns(m) == [10, 15]
    m.node_ended("dn2")
    assert csns(m) == [20, 30]


def test_a_finished_transaction_passes_its_node_without_a_watermark() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(10))
    m.add_batch("dn2", batch(11))
    assert csns(m) == [10]  # dn1's csns only grow, and it finished 10; dn2 holds 11
    m.add_batch("dn1", batch(12))
    assert csns(m) == [11]


def test_ended_node_still_delivers_what_it_sent() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn2", batch(5))
    m.node_ended("dn2")
    assert m.statistics().nodes["dn2"].ended
    assert not m.wants_more("dn2")
    assert csns(m) == []
    m.node_ended("dn1")
    assert csns(m) == [5]


def test_distributed_transaction_is_one_transaction_in_cid_order() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn2", batch(7, "g", cid=1, tags=("ins-dn2",), xid=733, time=CLOCK + 9, last=False))
    m.add_batch("dn2", batch(7, "g", cid=3, tags=("upd-dn2",), xid=733, time=CLOCK + 9))
    assert csns(m) == []
    m.add_batch("dn1", batch(7, "g", cid=0, tags=("del-dn1",), xid=745, time=CLOCK + 5, last=False))
    assert csns(m) == []  # dn1 may still have cid 1 or 2 changes
    m.add_batch("dn1", batch(7, "g", cid=2, tags=("x-dn1", "y-dn1"), xid=745, time=CLOCK + 5))
    [t] = m.pop_ready()
    assert (t.csn, t.gid, t.commit_time) == (7, "g", CLOCK + 9)
    assert list(t.nodes) == ["dn1", "dn2"]  # merge order, not arrival order
    assert t.nodes["dn1"] == NodeCommit(Xid(745), Lsn(0x16B3700), CLOCK + 5)
    assert tags(t) == ["del-dn1", "ins-dn2", "x-dn1", "y-dn1", "upd-dn2"]


def test_participant_owing_a_batch_holds_the_transaction() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(7, "g", tags=("a",)))
    m.add_batch("dn2", batch(7, "g", tags=("b",), last=False))
    m.add_batch("dn1", batch(8))
    assert csns(m) == []
    m.add_batch("dn2", batch(7, "g", cid=4, tags=("c",)))
    assert csns(m) == [7]
    m.node_ended("dn2")
    assert csns(m) == [8]


def test_batch_rotation_lets_ready_batches_of_other_nodes_go_first() -> None:
    """dn1's next batch is late twice; dn2's ready batch then goes before dn1's.

    The batch_id bump of docs/design.md section 4.
    """
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn2", batch(5, "g", tags=("b0",), last=False))
    m.add_batch("dn1", batch(5, "g", tags=("a1",), last=False))
    assert csns(m) == []  # took a1 then b0; both nodes owe more
    m.add_batch("dn1", batch(5, "g", tags=("a2",), last=False))
    assert csns(m) == []  # took a2: dn1's batch_id is now 2, dn2's 1
    m.add_batch("dn1", batch(5, "g", tags=("a3",)))
    m.add_batch("dn2", batch(5, "g", tags=("b1",)))
    [t] = m.pop_ready()
    assert tags(t) == ["a1", "b0", "a2", "b1", "a3"]  # by node index alone it would be ... a3, b1


def test_no_rotation_when_everything_is_ready() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn2", batch(5, "g", tags=("b1",)))
    m.add_batch("dn1", batch(5, "g", tags=("a1",), last=False))
    m.add_batch("dn1", batch(5, "g", tags=("a2",)))
    [t] = m.pop_ready()
    assert tags(t) == ["a1", "a2", "b1"]


def test_late_batch_of_one_node_does_not_hold_back_the_others_same_cid() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(5, "g", tags=("a1",), last=False))
    m.add_batch("dn2", batch(5, "g", tags=("b1",)))
    assert m.pop_ready() == []
    assert m.statistics().nodes["dn2"].pending_batches == 0  # b1 was taken while dn1 is late
    m.add_batch("dn1", batch(5, "g", tags=("a2",)))
    [t] = m.pop_ready()
    assert tags(t) == ["a1", "b1", "a2"]


def test_single_node_mode() -> None:
    m = CsnMerge(["pg"])
    m.add_batch("pg", batch(0x16B3748, gid="", tags=("a",)))
    m.add_watermark("pg", Csn(0x16B3748))
    [t] = m.pop_ready()
    assert t.csn == 0x16B3748
    m2 = CsnMerge(["pg"])
    b = batch(100, tags=("a",))
    b.gid = None
    m2.add_batch("pg", b)
    m2.add_batch("pg", batch(200).__class__(Csn(200), None, Xid(1), Lsn(2), Lsn(3), CLOCK, 0, [], True))
    m2.node_ended("pg")
    got = m2.pop_ready()
    assert [(t.csn, t.gid) for t in got] == [(100, None), (200, None)]
    assert got[1].n_changes == 0 and '"changes": []' in got[1].to_json_line()


def test_back_pressure_and_statistics() -> None:
    m = CsnMerge(["dn1", "dn2"], max_pending_batches=2, max_pending_bytes=10**9)
    assert m.wants_more("dn1")
    m.add_batch("dn1", batch(10, tags=("x" * 50,)))
    assert m.wants_more("dn1")
    m.add_batch("dn1", batch(11))
    assert not m.wants_more("dn1") and m.wants_more("dn2")
    assert m.pending_batches("dn1") == 2 and m.pending_bytes("dn1") > 50
    m.add_watermark("dn2", Csn(10))
    assert csns(m) == [10]
    assert m.wants_more("dn1")
    s = m.statistics()
    assert s.nodes["dn1"].pending_batches == 1 and s.nodes["dn1"].peak_batches == 2
    assert s.nodes["dn1"].peak_bytes >= s.nodes["dn1"].pending_bytes
    assert s.nodes["dn2"].watermark == 10 and s.nodes["dn1"].watermark is None
    assert (s.emitted, s.last_csn, s.assembling_csn) == (1, 10, None)

    small = CsnMerge(["dn1"], max_pending_bytes=100)
    small.add_batch("dn1", batch(10, tags=("a",)))
    assert not small.wants_more("dn1")  # one batch already exceeds 100 bytes


def test_smaller_watermark_is_ignored() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(10))
    m.add_watermark("dn2", Csn(12))
    m.add_watermark("dn2", Csn(3))
    assert csns(m) == [10]
    assert m.statistics().nodes["dn2"].watermark == 12
