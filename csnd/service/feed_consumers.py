"""The changefeed's consumers as its threads share them: the registry under one lock, and each stream's call.

ConsumerRegistry (csnd.service.registry) is pure bookkeeping; every thread
that touches it -- a stream's handler and its request thread, the
subscription administration, Status, the watchdog, retention -- goes
through this object, which holds the lock for the whole of each step, so
no step sees another half-done.  Each stream's gRPC call is kept beside its
consumer for the watchdog, which cancels the calls of consumers long silent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import grpc

from csnd.service.registry import ConsumerRegistry


@dataclass(frozen=True)
class NamedView:
    """A named subscription as it is now (ListSubscriptions, a reset's or delete's answer)."""

    acked: int
    tables: tuple[str, ...]
    peer: str  # the connected stream's peer ("": none)
    connected: bool


@dataclass(frozen=True)
class ConsumerView:
    """A consumer as Status shows it: a connected stream, or (peer "", not connected) an idle name."""

    peer: str
    name: str
    acked: int
    sent: int
    tables: tuple[str, ...]
    transactions_sent: int
    connected_since: float  # monotonic
    connected: bool


class FeedConsumers:
    """The registry under a lock, with each stream's call; every method is one step under the lock."""

    def __init__(self, registry: ConsumerRegistry) -> None:
        self.lock = threading.Lock()
        self.registry = registry
        self._calls: dict[int, grpc.ServicerContext] = {}  # consumer id -> its call (for the watchdog)

    # --- a stream's life ------------------------------------------------------------------

    def start_of(self, name: str, asked: Iterable[str]) -> tuple[int | None, tuple[str, ...]]:
        """A new stream's name's mark (None: anonymous or a new name) and the tables it reads."""
        with self.lock:
            mark = self.registry.named.get(name) if name else None
            return mark, self.registry.tables_for(name, asked)

    def connect(
        self, peer: str, name: str, tables: Iterable[str], after: int, call: grpc.ServicerContext
    ) -> int:
        """Registers a stream starting after `after` (a named one takes its name over); its consumer id."""
        with self.lock:
            consumer = self.registry.connect(peer, name, tables, after, time.monotonic())
            self._calls[consumer.id] = call
            return consumer.id

    def disconnect(self, cid: int) -> None:
        with self.lock:
            self.registry.disconnect(cid)
            self._calls.pop(cid, None)

    def heard(self, cid: int, ack: int | None) -> None:
        """A message from the client, acknowledging `ack` if not None; AckError for an ack past what was sent."""
        with self.lock:
            self.registry.heard(cid, time.monotonic())
            if ack is not None:
                self.registry.ack(cid, ack)

    def sent(self, cid: int, csn: int, transactions: int) -> None:
        with self.lock:
            self.registry.sent(cid, csn, transactions)

    def mark_of(self, cid: int) -> tuple[str, int]:
        """A consumer's name ("" if anonymous) and acknowledged csn."""
        with self.lock:
            c = self.registry.consumers.get(cid)
            return (c.name, c.acked) if c is not None else ("", 0)

    def last_heard(self, cid: int) -> float | None:
        """When the consumer was last heard from (monotonic); None once it is gone or superseded."""
        with self.lock:
            consumer = self.registry.consumers.get(cid)
            return consumer.last_heard if consumer is not None else None

    def silent_calls(self, now: float, grace: float) -> list[grpc.ServicerContext]:
        """The calls of consumers that sent nothing for longer than `grace`."""
        with self.lock:
            return [self._calls[c] for c in self.registry.silent(now, grace) if c in self._calls]

    # --- names, for the administration, retention and Status --------------------------------

    def names(self) -> list[str]:
        with self.lock:
            return sorted(self.registry.named)

    def named(self, name: str) -> NamedView | None:
        """A named subscription now (None: no such name)."""
        with self.lock:
            acked = self.registry.named.get(name)
            if acked is None:
                return None
            holder = self.registry.holder(name)
            return NamedView(
                acked,
                self.registry.filters.get(name, ()),
                holder.peer if holder is not None else "",
                holder is not None,
            )

    def marks(self) -> dict[str, int]:
        """Every named subscription's mark."""
        with self.lock:
            return dict(self.registry.named)

    def views(self) -> list[ConsumerView]:
        """Every connected consumer, then every idle name (by name)."""
        with self.lock:
            live = [
                ConsumerView(
                    c.peer, c.name, c.acked, c.sent, c.tables, c.transactions_sent, c.connected_since, True
                )
                for c in self.registry.consumers.values()
            ]
            idle = {
                n: (csn, self.registry.filters.get(n, ())) for n, csn in self.registry.idle_names().items()
            }
        return live + [
            ConsumerView("", name, acked, 0, tables, 0, 0.0, False)
            for name, (acked, tables) in sorted(idle.items())
        ]
