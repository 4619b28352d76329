"""How many streaming calls the changefeed serves at once, in all and per peer host.

A streaming call (Subscribe, Fetch, a health Watch, reflection) holds one of
the server's handler threads for as long as it lasts, a unary call (Status,
ListSubscriptions, a health Check) for a moment.  With one pool for both,
the streams could take every thread and a probe's health Check, or an
operator's Status, would be refused.  So streams get a bound of their own:

    threads = max_streams + UNARY_THREADS
    a stream past max_streams (or past max_per_peer from one host)
        -> RESOURCE_EXHAUSTED at once, saying which bound (the client retries)

and the threads beyond the streams' share always answer unary calls.  The
per-host bound keeps one client (a runaway Spark job, a stranger with a
token) from taking every stream.  A host is the peer's address without its
port, so the connections of one machine count together.

`StreamSlots` is the bookkeeping (pure: a lock and counters);
`StreamLimitInterceptor` applies it to every streaming method, taking a
slot before the handler runs and giving it back when the handler ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import grpc

# Streams served at once.  Each holds a thread (about its stack's worth of
# memory, a little CPU while it waits); more: more consumers, more threads.
MAX_STREAMS: Final = 256
# Streams one host may hold.  Several consumers share a host (the executors
# of a Spark job, a subscriber per table), so it is generous; smaller: one
# host can take less of the service.
MAX_STREAMS_PER_PEER: Final = 64
# Threads beyond the streams' share, for unary calls (each takes a moment).
# A burst of more unary calls than this at the same instant gets
# RESOURCE_EXHAUSTED rather than waiting unseen in gRPC's queue.
UNARY_THREADS: Final = 16


@dataclass(frozen=True)
class StreamLimits:
    max_streams: int = MAX_STREAMS
    max_per_peer: int = MAX_STREAMS_PER_PEER

    @property
    def threads(self) -> int:
        """The server's handler threads (and gRPC's bound on calls in progress)."""
        return self.max_streams + UNARY_THREADS


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string: `ipv4:127.0.0.1:5000` -> `127.0.0.1`, `ipv6:[::1]:5000` -> `[::1]`."""
    kind, sep, rest = peer.partition(":")
    if not sep:
        return peer
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0]
    return rest  # (unix:PATH and the like: the whole address)


class StreamSlots:
    """Streams in progress, in all and per host; `take` refuses one past either bound."""

    __slots__ = ("limits", "_lock", "_per_host", "in_use", "peak", "refused")

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._per_host: dict[str, int] = {}
        self.in_use = 0
        self.peak = 0
        self.refused = 0

    def take(self, host: str) -> str | None:
        """Takes a slot for a stream of `host`; None if taken, else why not (a refusal's message)."""
        lim = self.limits
        with self._lock:
            held = self._per_host.get(host, 0)
            if self.in_use >= lim.max_streams:
                self.refused += 1
                return (
                    f"the service is serving {self.in_use} streams, the most it serves at once "
                    f"(--max-streams {lim.max_streams}); retry later, or raise it"
                )
            if held >= lim.max_per_peer:
                self.refused += 1
                return (
                    f"{host} holds {held} streams, the most one host may (--max-streams-per-peer "
                    f"{lim.max_per_peer}); end one first, or raise it"
                )
            self._per_host[host] = held + 1
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)
            return None

    def give_back(self, host: str) -> None:
        with self._lock:
            left = self._per_host[host] - 1
            if left:
                self._per_host[host] = left
            else:
                del self._per_host[host]
            self.in_use -= 1

    def held_by(self, host: str) -> int:
        with self._lock:
            return self._per_host.get(host, 0)

    def _check(self) -> None:
        with self._lock:
            assert self.in_use == sum(self._per_host.values()) <= self.limits.max_streams
            assert all(0 < n <= self.limits.max_per_peer for n in self._per_host.values())
            assert self.peak >= self.in_use


class StreamLimitInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Holds every streaming call to `slots`: a slot while its handler runs, RESOURCE_EXHAUSTED without one."""

    def __init__(self, slots: StreamSlots) -> None:
        self.slots = slots

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return handler
        if handler.response_streaming:
            field = "stream_stream" if handler.request_streaming else "unary_stream"
            return handler._replace(**{field: self._held_stream(getattr(handler, field))})
        field = "stream_unary"
        return handler._replace(stream_unary=self._held_call(handler.stream_unary))

    def _held_stream(self, behaviour: Callable[..., Iterator[Any]]) -> Callable[..., Any]:
        slots = self.slots

        def held(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            host = peer_host(context.peer())
            why = slots.take(host)
            if why is not None:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            try:
                yield from behaviour(request, context)
            finally:  # (the handler ended, or its generator was closed: the thread is free)
                slots.give_back(host)

        return held

    def _held_call(self, behaviour: Callable[..., Any]) -> Callable[..., Any]:
        slots = self.slots

        def held(request: Any, context: grpc.ServicerContext) -> Any:
            host = peer_host(context.peer())
            why = slots.take(host)
            if why is not None:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, why)
            try:
                return behaviour(request, context)
            finally:
                slots.give_back(host)

        return held


__all__ = [
    "MAX_STREAMS",
    "MAX_STREAMS_PER_PEER",
    "StreamLimitInterceptor",
    "StreamLimits",
    "StreamSlots",
    "peer_host",
]
