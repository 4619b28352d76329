"""The node pipeline's outbox: lists in, items out, bounded."""

from __future__ import annotations

import queue
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.nodeitems import EndItem, Outbox, WatermarkItem


@given(st.lists(st.lists(st.integers(0, 10**6), max_size=5), max_size=8))
def test_items_come_out_one_by_one_in_the_order_the_lists_went_in(lists: list[list[int]]) -> None:
    box = Outbox(depth=len(lists) + 1)
    for items in lists:
        box.put_many([WatermarkItem(csn) for csn in items])
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
    box = Outbox(depth=2)
    box.put_many([WatermarkItem(1)])
    box.put_many([WatermarkItem(2), WatermarkItem(3)])
    with pytest.raises(queue.Full):
        box.put_many([WatermarkItem(4)], timeout=0.01)
    assert box.get_nowait() == WatermarkItem(1)  # taking a list makes room for one
    box.put_many([WatermarkItem(4)], timeout=0.01)


def test_get_waits_for_the_producer() -> None:
    box = Outbox(depth=1)
    threading.Timer(0.05, box.put_many, args=([EndItem()],)).start()
    assert isinstance(box.get(), EndItem)
