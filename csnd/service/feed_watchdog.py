"""The changefeed's watchdog: cancels the calls of consumers silent for well past the timeout.

A stream's handler drops a silent client itself (with a message), but only
when it gets to look: a client that stopped reading altogether leaves the
handler blocked in gRPC's flow control, and only a cancel from outside
frees the thread and the name.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

import grpc


class SilentCalls(Protocol):
    """The calls of consumers that sent nothing for longer than `grace` (csnd.service.feed_consumers)."""

    def silent_calls(self, now: float, grace: float) -> list[grpc.ServicerContext]: ...


class Watchdog:
    """A daemon thread that looks every keepalive (or timeout, if shorter) until `stopping` is set."""

    def __init__(
        self,
        calls: SilentCalls,
        stopping: threading.Event,
        *,
        keepalive_s: float,
        client_timeout_s: float,
        wait_s: float,
    ) -> None:
        self.calls = calls
        self.stopping = stopping
        self.every_s = min(keepalive_s, client_timeout_s)
        # A handler looks at least every keepalive or wait: past two of those, it is stuck.
        self.grace_s = client_timeout_s + 2 * max(wait_s, keepalive_s)
        self._thread = threading.Thread(target=self._run, name="csnd-feed-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self.stopping.wait(self.every_s):
            for context in self.calls.silent_calls(time.monotonic(), self.grace_s):
                context.cancel()
