"""The cut batches on their way from the reader's thread to the collector, and whose turn it is to take one.

    reader thread ── put ──► Skeletons (bounded, stream order) ── wait, get ──► collector thread
         └── live, nothing waiting and the collector idle: takes the batch itself, under `turn`

A batch is taken -- its items handed to the consumer and handled -- under
`turn`, by whichever thread takes it.  The collector waits for a batch
without holding the turn and takes it only then, so the reader can see that
nothing waits before its batch and nobody is taking one: every earlier batch
is handled, and handling this one in the reader's thread keeps stream order
(`DecoderPool`'s `collect_here`).  Pure bookkeeping: no I/O.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Skeletons(Generic[T]):
    """A bounded FIFO of `capacity` items with a wait that does not take, and the taking turn."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.turn = threading.Lock()  # held while a batch is taken and its items handled
        self._items: deque[T] = deque()
        self._changed = threading.Condition(threading.Lock())

    def qsize(self) -> int:
        return len(self._items)

    def put(self, item: T, timeout: float) -> None:
        """Raises `queue.Full` after `timeout` seconds without room."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._items) >= self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Full
                self._changed.wait(left)
            self._items.append(item)
            self._changed.notify_all()

    def wait(self, timeout: float) -> bool:
        """Whether an item is waiting, within `timeout` seconds (nothing is taken)."""
        with self._changed:
            return self._changed.wait_for(lambda: bool(self._items), timeout)

    def get_nowait(self) -> T:
        """The oldest item; raises `queue.Empty` if none waits."""
        with self._changed:
            if not self._items:
                raise queue.Empty
            item = self._items.popleft()
            self._changed.notify_all()
            return item
