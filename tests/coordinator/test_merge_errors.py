"""Every protocol error of the merge: raised at the event that reveals it, naming what it concerns."""

from __future__ import annotations

import pickle

import pytest

from csnd.coordinator import CsnMerge
from csnd.core.errors import ProtocolError
from csnd.core.ids import Csn
from tests.coordinator.helpers import batch


def _raises(fn: object, *args: object) -> ProtocolError:
    assert callable(fn)
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    err = info.value
    assert str(err) == str(pickle.loads(pickle.dumps(err)))  # errors cross process boundaries
    assert str(err) == str(err).lower() or "g-" in str(err)
    return err


def test_same_gid_different_csn_while_both_buffered() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(10, "g-17"))
    err = _raises(m.add_batch, "dn2", batch(11, "g-17", xid=733))
    text = str(err)
    for word in ("dn1", "dn2", "g-17", "csn 10", "csn 11"):
        assert word in text, text
    assert err.node == "dn2" and err.xid == 733


def test_same_gid_different_csn_after_the_first_was_emitted() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(10, "g-17"))
    m.add_watermark("dn2", Csn(10))
    assert [t.csn for t in m.pop_ready()] == [10]
    err = _raises(m.add_batch, "dn2", batch(12, "g-17"))
    for word in ("dn1", "dn2", "g-17", "csn 10", "csn 12"):
        assert word in str(err), str(err)


def test_csn_at_or_below_the_nodes_watermark() -> None:
    for csn in (15, 20):
        m = CsnMerge(["dn1", "dn2"])
        m.add_watermark("dn1", Csn(20))
        err = _raises(m.add_batch, "dn1", batch(csn, "g-3"))
        for word in ("dn1", "g-3", f"csn {csn}", "watermark 20"):
            assert word in str(err), str(err)


def test_csn_going_backwards_or_repeating_on_a_node() -> None:
    for csn in (15, 20):
        m = CsnMerge(["dn1"])
        m.add_batch("dn1", batch(20, "g-2"))
        m.add_watermark("dn1", Csn(5))
        m.pop_ready()
        err = _raises(m.add_batch, "dn1", batch(csn, "g-1"))
        for word in ("dn1", "g-1", "g-2", f"csn {csn}", "csn 20"):
            assert word in str(err), str(err)


def test_same_csn_different_gids() -> None:
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn1", batch(10, "g-1"))
    err = _raises(m.add_batch, "dn2", batch(10, "g-2"))
    for word in ("dn1", "dn2", "g-1", "g-2", "csn 10"):
        assert word in str(err), str(err)


def test_same_csn_different_gids_on_a_third_node() -> None:
    m = CsnMerge(["dn1", "dn2", "dn3"])
    m.add_batch("dn1", batch(10, "g-1", cid=0, tags=("a",), last=False))
    m.add_batch("dn2", batch(10, "g-1", cid=1, tags=("b",), last=False))
    m.add_watermark("dn3", Csn(9))
    assert m.pop_ready() == []
    # Watermark 9 leaves csn 10 open on dn3, so nothing of csn 10 may be taken yet: dn3 may still
    # join it at cid 0.  (Hence a clash can never hit a half-assembled transaction.)
    assert m.statistics().assembling_csn is None
    err = _raises(m.add_batch, "dn3", batch(10, "g-9"))
    for word in ("dn1", "dn3", "g-1", "g-9", "csn 10"):
        assert word in str(err), str(err)


def test_transactions_of_one_node_interleaving() -> None:
    m = CsnMerge(["dn1"])
    m.add_batch("dn1", batch(10, "g-1", last=False))
    err = _raises(m.add_batch, "dn1", batch(11, "g-2"))
    assert "g-1" in str(err) and "g-2" in str(err)


def test_cid_going_backwards_inside_a_transaction() -> None:
    m = CsnMerge(["dn1"])
    m.add_batch("dn1", batch(10, cid=2, tags=("a",), last=False))
    err = _raises(m.add_batch, "dn1", batch(10, cid=1, tags=("b",)))
    assert "cid 2 to cid 1" in str(err)


def test_batch_holding_several_cids() -> None:
    m = CsnMerge(["dn1"])
    b = batch(10, cid=1, tags=("a",))
    b.changes.append((2, 0x16B3700, '"tag": "b"'))
    err = _raises(m.add_batch, "dn1", b)
    assert "cid 2" in str(err)


def test_stream_ending_inside_a_transaction() -> None:
    m = CsnMerge(["dn1"])
    m.add_batch("dn1", batch(10, "g-1", last=False))
    err = _raises(m.node_ended, "dn1")
    assert "g-1" in str(err) and "ended" in str(err)


def test_batch_after_the_end() -> None:
    m = CsnMerge(["dn1"])
    m.node_ended("dn1")
    m.node_ended("dn1")  # idempotent
    err = _raises(m.add_batch, "dn1", batch(10, "g-1"))
    assert "ended" in str(err)


def test_watermark_passing_a_transaction_still_arriving() -> None:
    m = CsnMerge(["dn1"])
    m.add_batch("dn1", batch(10, "g-1", last=False))
    m.add_watermark("dn1", Csn(9))  # fine: below the open transaction
    err = _raises(m.add_watermark, "dn1", 10)
    assert "g-1" in str(err) and "watermark 10" in str(err)


def test_negative_cid() -> None:
    m = CsnMerge(["dn1"])
    _raises(m.add_batch, "dn1", batch(10, cid=-1))


def test_misuse_is_not_a_protocol_error() -> None:
    with pytest.raises(ValueError):
        CsnMerge([])
    with pytest.raises(ValueError, match="dn1"):
        CsnMerge(["dn1", "dn2", "dn1"])
    with pytest.raises(ValueError):
        CsnMerge(["dn1"], max_pending_batches=0)
    m = CsnMerge(["dn1"])
    with pytest.raises(KeyError, match="dn9"):
        m.add_watermark("dn9", Csn(1))
