"""The acknowledgement store: named subscriptions' marks and filters, written durably.

A named stream's acknowledgements are a high-water mark in the registry
(csnd.service.feed_consumers); this writes the ones that changed to the
SubscriptionStore at most every `interval_s` while streams run (each write
is an fsync), whenever a stream ends (a consumer that acks and closes finds
its mark stored), and at once for a new name (a reconnect before its first
acknowledgement resumes where it started).  A reset or delete holds the
store's lock from the registry's change to the store's, so a periodic
store of the old mark cannot land after it.  The marks also hold back the
changelog's retention (up to its hold limits).
"""

from __future__ import annotations

import threading
import time

from csnd.service.feed_consumers import FeedConsumers
from csnd.service.feed_ports import MarkStore
from csnd.service.registry import Stored


class MarkKeeper:
    """Writes the registry's named marks to `store` (None: the service keeps no names; nothing is written)."""

    def __init__(self, consumers: FeedConsumers, store: MarkStore | None, interval_s: float) -> None:
        self.consumers = consumers
        self.store = store
        self.interval_s = interval_s
        self._store_lock = threading.Lock()
        self._last_store = time.monotonic()

    def store_marks(self) -> None:
        """Writes the named marks and filters that changed (one fsync each) to the SubscriptionStore."""
        if self.store is None:
            return
        c = self.consumers
        with self._store_lock:
            self._last_store = time.monotonic()
            with c.lock:
                todo = c.registry.unstored()
            for name, (csn, tables) in sorted(todo.items()):
                self.store.set(name, csn, tables)
                with c.lock:
                    c.registry.stored(name, csn, tables)

    def store_if_due(self, now: float) -> None:
        """`store_marks` when `interval_s` passed since the last store (streams call it as they run)."""
        if now - self._last_store >= self.interval_s:
            self.store_marks()

    def reset(self, store: MarkStore, name: str, csn: int) -> tuple[int, tuple[str, ...]]:
        """Moves `name`'s mark to `csn`, durably; (the mark it had, its filter).

        SubscriptionNotFound, SubscriptionBusy (a stream holds it) from the registry.
        """
        c = self.consumers
        with self._store_lock:
            with c.lock:
                before = c.registry.reset(name, csn)
                tables = c.registry.filters.get(name, ())
            store.set(name, csn, tables)
            with c.lock:
                c.registry.stored(name, csn, tables)
        return before, tables

    def delete(self, store: MarkStore, name: str) -> Stored:
        """Forgets `name`, durably; the mark and filter it had (errors as `reset`)."""
        c = self.consumers
        with self._store_lock:
            with c.lock:
                held = c.registry.delete(name)
            store.delete(name)
        return held

    def retention_holds(self) -> dict[str, int]:
        """Every named subscription's mark: retention keeps the records after it (Changelog.apply_retention)."""
        return {f"subscription {n!r}": csn for n, csn in self.consumers.marks().items()}
