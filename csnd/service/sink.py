"""The coordinator runtime's sink in the service: every merged transaction into the changelog.

    CoordinatorRuntime ── write / end_transaction(csn, tail) ──► ChangelogSink ── append ──► Changelog
                       ── make_durable() ─────────────────────►               ── sync() ──► durable_csn
                                                                                             │
                          consumers (changefeed) read only what is durable ◄─────────────────┘

A transaction is gathered into one record (its DESIGN section 7 line) and
appended; `make_durable` is one `sync()` for everything appended since the
last, so one fsync covers a whole round of the merge (group commit) and the
fsync rate does not cap the transaction rate.

After a restart the sources re-send what follows their confirmed positions,
and the senders drop what the changelog already holds (`resume_csn`).  The
sink is the last guard: a transaction at or below the changelog's newest CSN
at start is counted and skipped, never appended twice; one below what this
run appended is a bug upstream and fails loudly (the changelog refuses it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from csnd.coordinator.changelog import Changelog

# How often retention runs (from the writer thread, between syncs).
RETENTION_INTERVAL_S: Final = 30.0


class ChangelogSink:
    """A `csnd.runtime.sinks.Sink` over a `Changelog`; used by the runtime's one thread."""

    def __init__(self, log: Changelog, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.held_csn = log.newest_csn  # what the changelog held when this run started
        self.transactions = 0  # appended by this run
        self.bytes_out = 0
        self.skipped = 0  # re-sent after a restart and already held
        self._parts: list[str] = []
        self._clock = clock
        self._next_retention = clock() + RETENTION_INTERVAL_S

    def write(self, text: str) -> None:
        self._parts.append(text)

    def end_transaction(self, csn: int, tail: str) -> None:
        parts = self._parts
        parts.append(tail)
        self._parts = []
        if csn <= self.held_csn:
            self.skipped += 1
            return
        line = "".join(parts).encode("utf-8")
        self.log.append(csn, line)
        self.transactions += 1
        self.bytes_out += len(line)

    def make_durable(self) -> None:
        self.log.sync()
        if self._clock() >= self._next_retention:
            self._next_retention = self._clock() + RETENTION_INTERVAL_S
            self.log.apply_retention()

    def commit(self) -> None:
        self.log.sync()

    def discard(self) -> None:
        self._parts = []

    def abandon(self) -> str | None:
        # What is appended but not synced is simply not durable: the sources
        # re-send it after a restart.  Nothing here is "partial" to name.
        self._parts = []
        return None
