"""Whether a source server is shutting down while we stream from it.

Why the reader needs to know.  A walsender whose server is shutting down
(fast or smart) sends everything it has, then waits until the client's
status updates report *flushed* everything sent before it exits -- and the
server's shutdown waits for the walsender.  csnd reports as flushed only
what is durable downstream, which a transaction still committing on this
node (a `committing` marker with no commit yet: its writer's session was
ended by the very shutdown) holds back for good.  So the server would wait
for us and we for it: `pg_ctl stop -m fast` hung.  Reporting more as
flushed would confirm the slot past what is not durable (invariant 7), so
instead the reader hangs up when the server is stopping: nothing is lost
(the slot re-sends everything after its confirmed position), the shutdown
goes on, and the reader reconnects once the server is back.

How it tells.  The stream itself does not say: a stopping walsender sends
keepalives asking for a reply, as an idle one does.  But a stopping server
refuses new connections with SQLSTATE 57P03 ("the database system is
shutting down").  So when the server asks for a reply while the reader is
caught up and still holding the slot back, a probe connects -- in its own
thread, at most once per `PROBE_INTERVAL_S`, so the reading thread never
waits on it -- and a refusal of that kind marks the server as stopping.
A probe that fails any other way says nothing (the stream will tell).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import psycopg

# How often a probe may run at most.  A stopping walsender asks for replies
# continuously, an idle one every wal_sender_timeout / 2 (30 s by default):
# one connection attempt a second costs an idle server nothing and ends a
# shutdown's wait within about a second.
PROBE_INTERVAL_S: Final = 1.0
# A probe that hangs (a server that accepts but does not answer) is left to
# time out on its own thread.
PROBE_TIMEOUT_S: Final = 5
# SQLSTATE cannot_connect_now: shutting down, starting up, in recovery.  Only
# the first can happen while its walsender streams to us.
_CANNOT_CONNECT_NOW: Final = "57P03"


def refuses_as_stopping(err: psycopg.Error) -> bool:
    """Whether a failed connection attempt says the server is shutting down."""
    if err.sqlstate == _CANNOT_CONNECT_NOW:
        return True
    # (libpq reports a refusal at start-up as text only: no SQLSTATE to read)
    return "shutting down" in str(err)


class ShutdownProbe:
    """Connects to the source now and then to learn whether it is shutting down (see the module docstring)."""

    def __init__(
        self,
        conninfo: str,
        *,
        interval: float = PROBE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        connect: Callable[..., Any] = psycopg.connect,
    ) -> None:
        self.conninfo = conninfo
        self.interval = interval
        self.clock = clock
        self._connect = connect
        self.stopping = threading.Event()
        self.probes = 0  # started so far (statistics, tests)
        self._last: float | None = None
        self._running: threading.Thread | None = None

    def maybe_probe(self) -> None:
        """Start a probe unless one is running or one started less than `interval` ago."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval:
            return
        running = self._running
        if running is not None and running.is_alive():
            return
        self._last = now
        self.probes += 1
        thread = threading.Thread(target=self._probe, name="csnd-shutdown-probe", daemon=True)
        self._running = thread
        thread.start()

    def reset(self) -> None:
        """A new stream: whatever the last one's probes found no longer holds."""
        self.stopping.clear()
        self._last = None

    def _probe(self) -> None:
        try:
            conn = self._connect(self.conninfo, connect_timeout=PROBE_TIMEOUT_S, autocommit=True)
        except psycopg.Error as e:
            if refuses_as_stopping(e):
                self.stopping.set()
            return
        except Exception:  # (a probe says "stopping" or nothing)
            return
        with contextlib.suppress(Exception):  # (closing a probe connection)
            conn.close()
