"""What a node pipeline hands the merge: the outbox (lists in, items out, bounded) and the batch cut."""

from __future__ import annotations

import queue
import threading
from itertools import accumulate, groupby
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.core.ids import Csn, Lsn, Xid
from csnd.runtime import items as nodeitems
from csnd.runtime.items import EndItem, Outbox, WatermarkItem
from csnd.sender.txn import FinishedTxn


@given(st.lists(st.lists(st.integers(0, 10**6), max_size=5), max_size=8))
def test_items_come_out_one_by_one_in_the_order_the_lists_went_in(lists: list[list[int]]) -> None:
    box = Outbox(capacity=len(lists) + 1)
    for items in lists:
        box.put_many([WatermarkItem(Csn(csn)) for csn in items])
    got = []
    while True:
        try:
            item = box.get_nowait()
        except queue.Empty:
            break
        assert isinstance(item, WatermarkItem)
        got.append(item.csn)
    assert got == [csn for items in lists for csn in items]


def test_the_outbox_is_bounded_by_lists() -> None:
    box = Outbox(capacity=2)
    box.put_many([WatermarkItem(Csn(1))])
    box.put_many([WatermarkItem(Csn(2)), WatermarkItem(Csn(3))])
    with pytest.raises(queue.Full):
        box.put_many([WatermarkItem(Csn(4))], timeout=0.01)
    assert (box.depth, box.peak, box.capacity) == (2, 2, 2)
    assert box.get_nowait() == WatermarkItem(Csn(1))  # taking a list makes room for one
    assert box.depth == 1
    box.put_many([WatermarkItem(Csn(4))], timeout=0.01)
    assert (box.depth, box.peak) == (2, 2)


def test_get_waits_for_the_producer() -> None:
    box = Outbox(capacity=1)
    threading.Timer(0.05, box.put_many, args=([EndItem()],)).start()
    assert isinstance(box.get(), EndItem)


@given(
    cid_steps=st.lists(st.integers(0, 2), max_size=60),
    as_list=st.booleans(),
    bound=st.integers(1, 8),
)
def test_cut_batches_one_cid_a_batch_bounded_in_order(
    cid_steps: list[int], as_list: bool, bound: int
) -> None:
    """Whether the transaction comes as a list (in memory) or an iterator (spilled), against the oracle."""
    cids = list(accumulate(cid_steps))  # never decreasing inside a transaction
    changes = [(cid, 0x100 + i, f"b{i}") for i, cid in enumerate(cids)]
    txn = FinishedTxn(
        "dn1",
        Csn(7),
        None,
        Xid(700),
        Lsn(0x900),
        Lsn(0x910),
        5,
        changes if as_list else iter(changes),
        len(changes),
    )
    with mock.patch.object(nodeitems, "MERGE_BATCH_CHANGES", bound):
        batches = list(nodeitems.cut_batches(txn))
    assert [c for b in batches for c in b.changes] == changes
    assert [b.last_of_txn for b in batches] == [False] * (len(batches) - 1) + [True]
    for b in batches:
        assert b.changes or len(batches) == 1  # only an empty transaction has an empty batch
        assert all(c == b.cid for c, _, _ in b.changes)
        assert len(b.changes) <= bound
    # the fewest batches: one per run of a cid, cut at the bound
    runs = [len(list(g)) for _, g in groupby(cids)]
    assert len(batches) == max(1, sum(-(-n // bound) for n in runs))
