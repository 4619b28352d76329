"""An HTTP/1.0 server whose threads never wait on a client: one loop reads, a few workers answer.

    accept ─► connection loop (one thread, a selector) ──────────► queue (bounded) ─► workers (fixed)
              holds up to max_connections connections:             full: 503 at once    answer one
              TLS handshake, request line, headers and a short                          whole request,
              body, each within its deadline, or 408 and closed                         then close

A thread per connection (`ThreadingHTTPServer`) lets a slowloris -- many
connections each sending part of a request and stalling, or trickling a
byte every few seconds so no read ever times out -- take a thread each and,
with enough of them, the process.  Here a connection costs a socket and its
buffer until its request is whole: `idle_timeout_s` to send its first byte
(TLS: its ClientHello), then `header_timeout_s` for the rest, however it
trickles.  A worker is given only a request already read whole, and its
answer has `send_timeout_s` in all to leave, so a worker is never held by a
client for longer than that: a probe is answered while hundreds of slow
connections wait.  When every worker is busy and `queued` requests wait,
the next is answered 503 (Retry-After: 1) at once rather than left hanging.

Every connection carries one request (HTTP/1.0: the answer ends with the
connection), so there is no keep-alive to time out; the idle timeout is
the time a new connection may say nothing.  `serve(sock, address,
request)` is given the request's bytes (headers and any body up to
`max_body_bytes`) and a blocking socket to answer on.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from csnd.core.errors import ConfigError

log = logging.getLogger(__name__)

# Threads answering requests.  An answer is a snapshot or a static file, done in
# milliseconds; four keep a dashboard (three requests a second), a scraper and
# the probes from waiting on each other, and bound what the HTTP side can take
# from the pipeline's cores.
WORKERS: Final = 4
# Whole requests waiting for a worker before the next is answered 503: a burst
# of a few dashboards opening at once waits, a flood is refused at once.
QUEUED: Final = 32
# Connections the loop holds while their requests come in (a socket and at most
# MAX_REQUEST_BYTES each).  Past it a new connection is answered 503 and closed:
# well below the usual 1024 open files, well above any honest load.
MAX_CONNECTIONS: Final = 256
# How long a new connection may send nothing.  Browsers open spare connections
# and keep them idle a few seconds; longer is a client holding a socket for free.
IDLE_TIMEOUT_S: Final = 10.0
# From a request's first byte to its last (TLS handshake, headers, a login's
# body).  Any real client sends a request in one go, in milliseconds even over a
# slow link; a slowloris trickling its headers is cut here, not after hours.
HEADER_TIMEOUT_S: Final = 10.0
# How long an answer has, in all, to leave: the largest (the history, ~600 kB) over
# a slow link.  A client that does not read holds a worker this long at most.
SEND_TIMEOUT_S: Final = 30.0
# The longest request line and headers taken (the answer past it: 431).
MAX_REQUEST_BYTES: Final = 16 * 1024
# The longest body the loop reads before a worker sees the request; a longer
# one is handed over without its body (the only body taken is /login's form).
MAX_BODY_BYTES: Final = 4096
# After an answer the loop writes itself (408, 431, 503), how long it goes on
# reading and dropping what the client still sends, so that closing does not
# reset the connection before the client has read the answer.
_LINGER_S: Final = 2.0

_END_OF_HEADERS: Final = re.compile(rb"\r?\n\r?\n")
_CONTENT_LENGTH: Final = re.compile(rb"(?im)^content-length[ \t]*:[ \t]*(\d{1,12})[ \t]*\r?$")


@dataclass(frozen=True)
class HttpLimits:
    """The bounds of the HTTP side (the constants above; tests make the timeouts short)."""

    workers: int = WORKERS
    queued: int = QUEUED
    max_connections: int = MAX_CONNECTIONS
    idle_timeout_s: float = IDLE_TIMEOUT_S
    header_timeout_s: float = HEADER_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S
    max_request_bytes: int = MAX_REQUEST_BYTES
    max_body_bytes: int = MAX_BODY_BYTES

    def __post_init__(self) -> None:
        for name in ("workers", "queued", "max_connections", "max_request_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"http limits: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("idle_timeout_s", "header_timeout_s", "send_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"http limits: {name} must be > 0, got {getattr(self, name)}")
        if self.max_body_bytes < 0:
            raise ConfigError(f"http limits: max_body_bytes must be >= 0, got {self.max_body_bytes}")


@dataclass(frozen=True)
class HttpStatistics:
    """The HTTP side's state now and its totals since the start."""

    waiting: int  # connections whose request is still coming in
    queued: int  # whole requests waiting for a worker
    busy: int  # workers answering
    workers: int
    accepted: int
    rejected: int  # answered 503: every worker busy and the queue full, or too many connections
    timed_out: int  # cut at the idle or header timeout


class _Pending:
    """A connection the loop holds: its request so far and its deadline."""

    __slots__ = ("sock", "address", "data", "deadline", "started", "handshaking", "closing")

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.data = bytearray()
        self.deadline = deadline
        self.started = False  # its first byte came
        self.handshaking = False  # TLS: wrapped, handshake under way
        self.closing = False  # answered by the loop; reading and dropping until EOF or the deadline


Serve = Callable[[socket.socket, Any, bytes], None]


class BoundedHttpServer:
    """See the module docstring; `start()` binds (OSError if it cannot) and runs the threads."""

    def __init__(
        self,
        address: tuple[str, int],
        serve: Serve,
        *,
        limits: HttpLimits | None = None,
        tls: ssl.SSLContext | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.limits = limits or HttpLimits()
        self._serve = serve
        self._tls = tls
        self._headers = dict(headers or {})  # on every answer the loop writes itself
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._listener = socket.create_server(address, family=family, backlog=128)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._queue: queue.Queue[tuple[socket.socket, Any, bytes] | None] = queue.Queue(self.limits.queued)
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._lock = threading.Lock()
        self._busy = 0
        self._waiting = 0
        self._accepted = self._rejected = self._timed_out = 0
        self._threads: list[threading.Thread] = []

    def statistics(self) -> HttpStatistics:
        with self._lock:
            return HttpStatistics(
                waiting=self._waiting,
                queued=self._queue.qsize(),
                busy=self._busy,
                workers=self.limits.workers,
                accepted=self._accepted,
                rejected=self._rejected,
                timed_out=self._timed_out,
            )

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._loop, name="csnd-http", daemon=True)]
        self._threads += [
            threading.Thread(target=self._work, name=f"csnd-http-worker-{i}", daemon=True)
            for i in range(self.limits.workers)
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stops taking connections, drops those not yet whole, lets the workers finish their answers."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        for _ in range(self.limits.workers):
            self._queue.put(None)  # (after what is queued: those are answered)
        for t in self._threads:
            t.join(timeout=self.limits.send_timeout_s)
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- the connection loop ----------------------------------------------------------------

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        pending: dict[int, _Pending] = {}  # by file descriptor
        try:
            while not self._stopping:
                now = time.monotonic()
                nearest = min((p.deadline for p in pending.values()), default=now + 1.0)
                for key, _ in sel.select(max(0.0, nearest - now)):
                    if key.fileobj is self._listener:
                        self._accept(sel, pending)
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    else:
                        self._step_guarded(sel, pending, key.data)
                self._expire(sel, pending, time.monotonic())
        except Exception:
            log.exception("http: the connection loop failed; the dashboard no longer answers")
        finally:
            for p in list(pending.values()):
                self._drop(sel, pending, p)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, pending: dict[int, _Pending]) -> None:
        for _ in range(64):  # (then the others' turn)
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # (out of files: the loop goes on, the client is refused by the kernel)
                log.warning("http: cannot accept a connection: %s", e)
                return
            sock.setblocking(False)
            with self._lock:
                self._accepted += 1
            if len(pending) >= self.limits.max_connections:
                with self._lock:
                    self._rejected += 1
                _send_now(
                    sock, _answer(503, "Service Unavailable", b"csnd: too many connections\n", self._headers)
                )
                sock.close()
                continue
            p = _Pending(sock, address, time.monotonic() + self.limits.idle_timeout_s)
            pending[sock.fileno()] = p
            sel.register(sock, selectors.EVENT_READ, p)
            self._count(pending)

    def _step_guarded(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> None:
        try:
            self._step(sel, pending, p)
        except Exception:  # (one connection's surprise must not end the loop that serves the others)
            log.exception("http %s: reading the request failed; the connection is closed", p.address)
            self._drop(sel, pending, p)

    def _step(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> None:
        if p.closing:
            self._drain(sel, pending, p)
            return
        if self._tls is not None and not isinstance(p.sock, ssl.SSLSocket):
            # (the ClientHello came: the request has started; wrapping detaches the socket)
            sel.unregister(p.sock)
            del pending[p.sock.fileno()]
            p.sock = self._tls.wrap_socket(p.sock, server_side=True, do_handshake_on_connect=False)
            pending[p.sock.fileno()] = p
            sel.register(p.sock, selectors.EVENT_READ, p)
            self._start(p)
            p.handshaking = True
        if p.handshaking:
            assert isinstance(p.sock, ssl.SSLSocket)
            try:
                p.sock.do_handshake()
            except ssl.SSLWantReadError:
                sel.modify(p.sock, selectors.EVENT_READ, p)
                return
            except ssl.SSLWantWriteError:
                sel.modify(p.sock, selectors.EVENT_WRITE, p)
                return
            except OSError:  # (a failed handshake: a plain HTTP request on the TLS port, a bad client)
                log.debug("http %s: TLS handshake failed", p.address, exc_info=True)
                self._drop(sel, pending, p)
                return
            p.handshaking = False
            sel.modify(p.sock, selectors.EVENT_READ, p)
        while True:
            try:
                chunk = p.sock.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                self._drop(sel, pending, p)
                return
            if not chunk:
                self._drop(sel, pending, p)  # (the client went away before its request was whole)
                return
            self._start(p)
            p.data += chunk
            if self._whole(sel, pending, p):
                return

    def _start(self, p: _Pending) -> None:
        if not p.started:
            p.started = True
            p.deadline = time.monotonic() + self.limits.header_timeout_s

    def _whole(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> bool:
        """Hands `p` on (or answers it) once its request is whole; whether it left the loop."""
        end = _END_OF_HEADERS.search(p.data)
        if end is None or end.start() > self.limits.max_request_bytes:
            if len(p.data) > self.limits.max_request_bytes:
                body = (
                    f"csnd: a request's line and headers are at most {self.limits.max_request_bytes} bytes\n"
                )
                self._refuse(sel, pending, p, 431, "Request Header Fields Too Large", body.encode())
                return True
            return False
        length = _CONTENT_LENGTH.search(p.data, 0, end.start())
        wanted = int(length.group(1)) if length else 0
        if wanted <= self.limits.max_body_bytes and len(p.data) < end.end() + wanted:
            return False
        sel.unregister(p.sock)
        del pending[p.sock.fileno()]
        self._count(pending)
        try:
            self._queue.put_nowait((p.sock, p.address, bytes(p.data)))
        except queue.Full:
            with self._lock:
                self._rejected += 1
            pending[p.sock.fileno()] = p
            sel.register(p.sock, selectors.EVENT_READ, p)
            self._refuse(
                sel, pending, p, 503, "Service Unavailable", b"csnd: busy; try again\n", {"Retry-After": "1"}
            )
        return True

    def _expire(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], now: float) -> None:
        for p in [p for p in pending.values() if p.deadline <= now]:
            if p.closing or not p.started:
                self._drop(sel, pending, p)  # (silent: there was no request to answer)
                if not p.closing:
                    with self._lock:
                        self._timed_out += 1
                continue
            with self._lock:
                self._timed_out += 1
            if p.handshaking:
                self._drop(sel, pending, p)
            else:
                seconds = self.limits.header_timeout_s
                body = f"csnd: the request did not arrive whole within {seconds:g} s\n".encode()
                self._refuse(sel, pending, p, 408, "Request Timeout", body)

    def _refuse(
        self,
        sel: selectors.BaseSelector,
        pending: dict[int, _Pending],
        p: _Pending,
        code: int,
        reason: str,
        body: bytes,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        """Answers `code` from the loop, then reads and drops until the client closes (or _LINGER_S)."""
        _send_now(p.sock, _answer(code, reason, body, {**self._headers, **(extra or {})}))
        try:
            p.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(sel, pending, p)
            return
        p.closing = True
        p.deadline = time.monotonic() + _LINGER_S
        sel.modify(p.sock, selectors.EVENT_READ, p)

    def _drain(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> None:
        try:
            chunk = p.sock.recv(65536)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(sel, pending, p)

    def _drop(self, sel: selectors.BaseSelector, pending: dict[int, _Pending], p: _Pending) -> None:
        pending.pop(p.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(p.sock)
        p.sock.close()
        self._count(pending)

    def _count(self, pending: dict[int, _Pending]) -> None:
        with self._lock:
            self._waiting = sum(1 for p in pending.values() if not p.closing)

    # --- the workers ------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            sock, address, request = item
            with self._lock:
                self._busy += 1
            try:
                sock.setblocking(True)
                self._serve(sock, address, request)
            except Exception:
                log.debug("http %s: answering failed", address, exc_info=True)
            finally:
                with self._lock:
                    self._busy -= 1
                sock.close()


class DeadlineWriter:
    """A binary writer on a socket that sends everything or fails once `seconds` have passed in all.

    (A timeout per send would let a client that reads a byte at a time hold a worker for ever.)
    """

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._deadline = time.monotonic() + seconds

    def write(self, data: bytes | bytearray | memoryview) -> int:
        with memoryview(data) as view, view.cast("B") as octets:
            sent = 0
            while sent < len(octets):
                left = self._deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the client did not take the answer in time")
                self._sock.settimeout(left)
                sent += self._sock.send(octets[sent:])
            return sent

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def _answer(code: int, reason: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    head = [
        f"HTTP/1.0 {code} {reason}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _send_now(sock: socket.socket, data: bytes) -> None:
    """One non-blocking send of a short answer: the loop never waits on a client."""
    try:
        sock.setblocking(False)
        sock.send(data)
    except (OSError, ValueError):
        pass  # (a client that cannot take a few hundred bytes gets nothing)
