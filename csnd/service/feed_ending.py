"""Why the changefeed's streams end when the service ends on a failure its consumers must be told.

A service that stops cleanly ends its streams with OK (a client reconnects
once it is back).  One that ends on a failure a restart cannot mend -- its
slot on a node gone, so what that node commits from then on can never be
delivered -- must not leave its consumers reconnecting to nothing, seeing
only a lost connection: each open stream is sent what the changelog holds
(for up to `DRAIN_S`), then ends with the failure's status and message, which
the client prints and stops on.  Set once, before the streams' stop.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Final

import grpc

# How long a stream may go on sending what the changelog holds after the
# failure before it ends with it: well inside the server's grace at stop
# (csnd.service.server), so the status reaches even a slow consumer.
DRAIN_S: Final = 3.0


@dataclass(frozen=True)
class Failure:
    code: grpc.StatusCode
    details: str
    through_csn: int  # the changelog's durable end when the failure came: sent before the status
    at: float  # time.monotonic() of the failure


class Ending:
    """The failure the streams end with (None: a clean stop, or still serving)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failure: Failure | None = None

    def fail(self, code: grpc.StatusCode, details: str, through_csn: int) -> None:
        """The first failure wins: the streams end with it."""
        with self._lock:
            if self.failure is None:
                self.failure = Failure(code, details, through_csn, time.monotonic())

    def due(self, pos: int) -> Failure | None:
        """The failure a stream at `pos` ends with now: once it sent what was durable, or drained long enough."""
        f = self.failure
        if f is None:
            return None
        if pos >= f.through_csn or time.monotonic() - f.at >= DRAIN_S:
            return f
        return None
