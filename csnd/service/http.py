"""The service's HTTP side: the ops dashboard, `/metrics`, `/api/status` and the probes.

    status() ──┬─► /api/status    the gRPC Status content as JSON (proto3 JSON names)
               ├─► /metrics       Prometheus text (csnd.service.metrics)
               ├─► /api/history   the last minutes of samples, for the plots
               └─► /              the dashboard (static files bundled in the package:
                                  it works with no internet, nothing from a CDN)
    alive     ───► /healthz       200 while the process serves HTTP at all
    ready()   ───► /readyz        200 once the service is ready, else 503 and why

Every surface reads the same snapshot function, so the dashboard, the metrics
and the gRPC Status cannot disagree.  A sampler thread takes one snapshot a
second into a bounded ring (`HISTORY_S` of them) so a page opened now shows
the last minutes at once.  HEAD is answered as GET is, without the body.

It binds 127.0.0.1 unless told otherwise: the figures name hosts, slots and
consumers.  With a token, every request for figures needs it:
`Authorization: Bearer <token>` (Prometheus, scripts), or for a browser a
session cookie.  The page and its scripts hold no figures and are open; when
the API refuses it, the page shows a form that POSTs the token to `/login`,
which answers with the cookie.  The token never rides in a URL (it would stay
in the browser's history, in proxy logs and in Referer headers), and the
cookie holds not the token but an HMAC of it, so a stolen cookie opens the
dashboard and nothing else (not the changefeed), and only for
`SESSION_TTL_S` after the login (csnd.service.http_guard).  Over TLS the
cookie is `Secure`.  `/login` takes `login_limit.MAX_FAILURES` refused
tokens a minute from one address, then answers 429 with Retry-After.  The
probes (`/healthz`, `/readyz`) are open: a Kubernetes probe sends no token,
and they say only whether the service is up and ready.

Without a token, a DNS rebinding page could read the figures as its own
origin: every request but the probes' must name in its Host `localhost`, an
address, the name `--http` listens on or one of `--http-allowed-hosts`
(http_guard).  Every answer says `Content-Security-Policy` (scripts, styles
and requests from this origin only, nothing inline, no framing),
`X-Frame-Options: DENY` and `X-Content-Type-Options: nosniff`.

Connections are taken by csnd.service.http_server: one loop reads each
request whole (TLS handshake included) within its timeouts, a fixed pool of
workers answers, so slow clients cost sockets, not threads.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import math
import secrets
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from csnd.core.addresses import split_host_port
from csnd.core.auth import AUTH_HEADER, Credentials
from csnd.core.errors import ConfigError
from csnd.service.http_guard import Sessions, check_allowed_host, host_allowed
from csnd.service.http_server import (
    MAX_BODY_BYTES,
    BoundedHttpServer,
    DeadlineWriter,
    HttpLimits,
    HttpStatistics,
)
from csnd.service.login_limit import LoginLimiter
from csnd.service.metrics import registry_for
from csnd.service.server import TlsFiles

log = logging.getLogger(__name__)

# Seconds of one-per-second samples kept for the plots.  Ten minutes covers a
# "what just happened" look at 3 a.m.; at ~1 kB a sample it is ~600 kB.
HISTORY_S: Final = 600
SAMPLE_INTERVAL_S: Final = 1.0
# The session cookie: its issue time and an HMAC of it under the token, never the token.
SESSION_COOKIE: Final = "csnd_session"
# How long a login lasts, in the browser (Max-Age) and on the server.  A working
# day: an operator logs in once a shift; a cookie left on a shared machine or
# copied off it opens the dashboard until the evening, not for good.
SESSION_TTL_S: Final = 12 * 3600
# Every answer's: scripts, styles, images and requests from this origin only,
# nothing inline or eval'd, forms posted here only, never in a frame.  The
# dashboard's page has no inline script or style (its scripts set styles
# through the DOM, which a policy does not forbid).
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# Open without the token: the probes, the page and its scripts (no figures in them).
_PROBES: Final = ("/healthz", "/readyz")

_STATIC: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    # the plotting library, vendored (dashboard/uplot/README.md says which version)
    "/uplot/uPlot.iife.min.js": ("uplot/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/uplot/uPlot.min.css": ("uplot/uPlot.min.css", "text/css; charset=utf-8"),
}


@dataclass(frozen=True)
class Thresholds:
    """When the dashboard turns a figure amber or red (documented in the README).

    Lag in seconds is the age of a node's oldest commit not yet durable; WAL is
    what a slot holds back on its server (the database's disk); consumer lag
    counts durable transactions a consumer has not acknowledged.  A node that
    is not flowing (reconnecting, restarting, failed) is red; a stuck
    watermark (an idle GTM node without ticks) is amber.
    """

    lag_seconds_amber: float = 10.0
    lag_seconds_red: float = 60.0
    retained_wal_bytes_amber: int = 1 << 30
    retained_wal_bytes_red: int = 8 << 30
    consumer_lag_amber: int = 10_000
    consumer_lag_red: int = 100_000

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Thresholds:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown dashboard threshold {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        try:
            t = cls(**{k: type(getattr(cls, k))(v) for k, v in values.items()})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"dashboard thresholds: {e}") from None
        for what in ("lag_seconds", "retained_wal_bytes", "consumer_lag"):
            amber, red = getattr(t, f"{what}_amber"), getattr(t, f"{what}_red")
            if not 0 <= amber <= red:
                raise ConfigError(f"dashboard thresholds: need 0 <= {what}_amber <= {what}_red")
        return t


class History:
    """A bounded ring of (time, snapshot summary) samples for the plots."""

    def __init__(self, capacity: int = HISTORY_S) -> None:
        self._samples: deque[dict[str, Any]] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, now: float, status: Mapping[str, Any]) -> None:
        totals = status.get("totals", {})
        nodes = status.get("nodes", [])
        sample = {
            "t": now,
            "transactions": int(totals.get("transactions", 0) or 0),
            "changes": int(totals.get("changes", 0) or 0),
            "changelog_bytes": int(status.get("changelog", {}).get("bytes", 0) or 0),
            "lag_seconds": {n["name"]: float(n.get("lag_seconds", 0.0)) for n in nodes},
            "lag_bytes": {n["name"]: int(n.get("lag_bytes", 0) or 0) for n in nodes},
            "retained_wal_bytes": {n["name"]: int(n.get("retained_wal_bytes", 0) or 0) for n in nodes},
            "consumer_lag": {
                str(c.get("name") or c.get("peer") or "anonymous"): int(c.get("lag_transactions", 0) or 0)
                for c in status.get("consumers", [])
            },
        }
        with self._lock:
            self._samples.append(sample)

    def samples(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._samples)


def _read_static(name: str) -> bytes:
    return resources.files("csnd.service").joinpath("dashboard", *name.split("/")).read_bytes()


def _always_ready() -> tuple[bool, str]:
    return True, "ready"


def tls_context(tls: TlsFiles) -> ssl.SSLContext:
    """A server-side TLS context over the certificate chain and key (ConfigError if they cannot be read)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except FileNotFoundError as e:
        raise ConfigError(
            f"--http: cannot read the TLS certificate or key: {e.filename}: {e.strerror}"
        ) from None
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            f"--http: cannot use the TLS certificate {tls.cert} with the key {tls.key}: {e}"
        ) from None
    return context


class DashboardServer:
    """The HTTP server; `start()` binds (a port in use is a ConfigError) and serves in a thread."""

    def __init__(
        self,
        listen: str,
        status: Callable[[], Mapping[str, Any]],
        *,
        token: str | None = None,
        credentials: Credentials | None = None,
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] = time.time,
        ready: Callable[[], tuple[bool, str]] = _always_ready,
        tls: TlsFiles | None = None,
        allowed_hosts: Sequence[str] = (),
        limits: HttpLimits | None = None,
        session_ttl_s: int = SESSION_TTL_S,
        logins: LoginLimiter | None = None,
    ) -> None:
        self.host, self.port = _split_listen(listen)
        self.status = status
        self.ready = ready
        self.token = token
        # Every credential of the changefeed's credentials file opens the dashboard too
        # (any role: it only shows figures); without one, it would be open to anyone.
        self.credentials = credentials
        self.guarded = token is not None or credentials is not None
        # Sessions are keyed by the token; with only a credentials file, by a key of this
        # process (a restart asks each browser to log in again).
        session_key = token if token is not None else secrets.token_hex(32)
        self._sessions = Sessions(session_key, session_ttl_s) if self.guarded else None
        self._tls = tls_context(tls) if tls is not None else None
        try:
            allowed = [check_allowed_host(h) for h in allowed_hosts]
        except ValueError as e:
            raise ConfigError(f"--http-allowed-hosts: {e.args[0]!r} is not a host name") from None
        # (the name --http listens on, when it is one: a client that reaches it names it)
        self.allowed_hosts = (*allowed, self.host.lower())
        self.limits = limits or HttpLimits()
        self.logins = logins or LoginLimiter()
        self.thresholds = thresholds or Thresholds()
        self.history = History()
        self._clock = clock
        self._registry = registry_for(status)
        self._stop = threading.Event()
        self._httpd: BoundedHttpServer | None = None
        self._threads: list[threading.Thread] = []

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/"

    def start(self) -> None:
        handler = _handler_for(self)
        send_timeout_s = self.limits.send_timeout_s

        def serve(sock: socket.socket, address: Any, request: bytes) -> None:
            handler(sock, address, request, DeadlineWriter(sock, send_timeout_s))

        try:
            httpd = BoundedHttpServer(
                (self.host, self.port), serve, limits=self.limits, tls=self._tls, headers=SECURITY_HEADERS
            )
        except OSError as e:
            raise ConfigError(f"--http {self.host}:{self.port}: cannot listen: {e.strerror or e}") from None
        self._httpd = httpd
        self.port = httpd.address[1]
        httpd.start()
        self._threads = [threading.Thread(target=self._sample, name="csnd-http-sampler", daemon=True)]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.stop()
        for t in self._threads:
            t.join(timeout=5)

    def statistics(self) -> HttpStatistics:
        """The connection loop's and the workers' state (see csnd.service.http_server)."""
        assert self._httpd is not None, "statistics() of a server not started"
        return self._httpd.statistics()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.history.add(self._clock(), self.status())
            except Exception:  # a failing snapshot must not end the plots for good
                log.exception("dashboard: taking a status sample failed")
            self._stop.wait(SAMPLE_INTERVAL_S)

    # --- what the handler asks --------------------------------------------------------

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """The token in `Authorization: Bearer`, or a session cookie `/login` gave and not yet expired."""
        if not self.guarded or self._sessions is None:
            return True
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self.token_matches(auth[len("Bearer ") :].strip())
        now = self._clock()
        for part in headers.get("Cookie", "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == SESSION_COOKIE and self._sessions.valid(v, now):
                return True
        return False

    def host_allowed(self, host: str | None) -> bool:
        return host_allowed(host, self.allowed_hosts)

    def token_matches(self, given: str) -> bool:
        if self.token is not None and hmac.compare_digest(given.encode(), self.token.encode()):
            return True
        return (
            self.credentials is not None
            and self.credentials.identify([(AUTH_HEADER, f"Bearer {given}")]) is not None
        )

    def session_cookie(self) -> str:
        """The Set-Cookie value `/login` answers a good token with (`Secure` over TLS)."""
        assert self._sessions is not None
        secure = "; Secure" if self.tls else ""
        value = self._sessions.issue(self._clock())
        return (
            f"{SESSION_COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; "
            f"Max-Age={self._sessions.ttl_s}{secure}"
        )

    def config(self) -> dict[str, Any]:
        return {"thresholds": asdict(self.thresholds), "sample_interval_s": SAMPLE_INTERVAL_S}


def _split_listen(listen: str) -> tuple[str, int]:
    try:
        return split_host_port(listen)
    except ValueError as e:
        raise ConfigError(f"--http: {e}") from None


_TEXT: Final = "text/plain; charset=utf-8"
_UNAUTHORIZED: Final = (
    b"csnd: a token is required: send 'Authorization: Bearer <token>', or open the dashboard and "
    b"enter it (a token in the URL is not taken: it would stay in logs and the browser's history)\n"
)
# The longest /login body taken (a token is far shorter): what the connection loop reads.
_LOGIN_MAX: Final = MAX_BODY_BYTES


def _handler_for(server: DashboardServer) -> Callable[[socket.socket, Any, bytes, DeadlineWriter], object]:
    """What answers one whole request (read by the connection loop) on its socket."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "csnd"
        # (not 0.9: an answer to a request line it cannot read still has headers, the policy's among them)
        default_request_version = "HTTP/1.0"
        _head = False

        def __init__(self, sock: socket.socket, address: Any, request: bytes, out: DeadlineWriter) -> None:
            self._request_bytes = request
            self._out = out
            super().__init__(sock, address, None)  # type: ignore[arg-type]  # (no socketserver here)

        def setup(self) -> None:
            self.connection = self.request
            self.rfile = io.BytesIO(self._request_bytes)
            self.wfile = self._out  # type: ignore[assignment]

        def finish(self) -> None:
            pass  # (the worker closes the socket)

        def end_headers(self) -> None:
            for k, v in SECURITY_HEADERS.items():
                self.send_header(k, v)
            super().end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # (the base class's name)
            log.debug("http %s: " + format, self.address_string(), *args)

        def do_HEAD(self) -> None:  # (the base class's name)
            self._head = True
            self.do_GET()

        def _host_refused(self, path: str) -> bool:
            """403 for a Host the service does not know (DNS rebinding); the probes never."""
            host = self.headers.get("Host")
            if path in _PROBES or server.host_allowed(host):
                return False
            body = (
                f"csnd: this service does not answer to the name {host!r} (a page on another "
                "site could read it by pointing that name at this address); open it by an address "
                "or localhost, or name it with --http-allowed-hosts\n"
            )
            self._send(HTTPStatus.FORBIDDEN, body.encode(), _TEXT)
            return True

        def do_GET(self) -> None:  # (the base class's name)
            url = urlsplit(self.path)
            try:
                if self._host_refused(url.path):
                    pass
                elif url.path == "/healthz":
                    self._send(HTTPStatus.OK, b"ok\n", _TEXT)
                elif url.path == "/readyz":
                    ready, why = server.ready()
                    code = HTTPStatus.OK if ready else HTTPStatus.SERVICE_UNAVAILABLE
                    self._send(code, f"{why if ready else 'not ready: ' + why}\n".encode(), _TEXT)
                elif url.path in _STATIC:
                    name, ctype = _STATIC[url.path]
                    self._send(HTTPStatus.OK, _read_static(name), ctype)
                elif not server.authorized(self.headers):  # type: ignore[arg-type]
                    self._send(
                        HTTPStatus.UNAUTHORIZED, _UNAUTHORIZED, _TEXT, extra={"WWW-Authenticate": "Bearer"}
                    )
                elif url.path == "/metrics":
                    self._send(HTTPStatus.OK, generate_latest(server._registry), CONTENT_TYPE_LATEST)
                elif url.path == "/api/status":
                    self._json(server.status())
                elif url.path == "/api/history":
                    self._json({"samples": server.history.samples()})
                elif url.path == "/api/config":
                    self._json(server.config())
                else:
                    self._send(HTTPStatus.NOT_FOUND, b"csnd: no such page\n", _TEXT)
            except BrokenPipeError:
                pass  # the browser went away mid-answer
            except Exception as e:
                log.exception("http %s failed", url.path)
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, f"csnd: internal error: {e}\n".encode(), _TEXT)

        def do_POST(self) -> None:  # (the base class's name)
            """`/login`: the dashboard's form posts the token; a good one gets the session cookie."""
            path = urlsplit(self.path).path
            if self._host_refused(path):
                return
            if path != "/login":
                self._send(HTTPStatus.NOT_FOUND, b"csnd: no such page\n", _TEXT)
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= _LOGIN_MAX:
                self._send(HTTPStatus.BAD_REQUEST, b"csnd: a login is a short form: token=...\n", _TEXT)
                return
            form = parse_qs(self.rfile.read(length).decode("utf-8", "replace"))
            given = (form.get("token") or [""])[0].strip()
            client, now = self.client_address[0], server._clock()
            wait = server.logins.retry_after(client, now)
            if not server.guarded:
                self._send(HTTPStatus.SEE_OTHER, b"", _TEXT, extra={"Location": "./"})
            elif wait is not None:
                seconds = max(1, math.ceil(wait))
                body = (
                    f"csnd: too many refused tokens from {client}; try again in {seconds} s "
                    f"(at most {server.logins.max_failures} a {server.logins.window_s:g} s)\n"
                )
                extra = {"Retry-After": str(seconds)}
                self._send(HTTPStatus.TOO_MANY_REQUESTS, body.encode(), _TEXT, extra=extra)
            elif server.token_matches(given):
                server.logins.succeeded(client)
                extra = {"Location": "./", "Set-Cookie": server.session_cookie()}
                self._send(HTTPStatus.SEE_OTHER, b"", _TEXT, extra=extra)
            else:
                server.logins.failed(client, now)
                log.warning("http %s: a refused token at /login", client)
                # (back to the page, which says so; the fragment never reaches a server or a log)
                self._send(HTTPStatus.SEE_OTHER, b"", _TEXT, extra={"Location": "./#refused"})

        def _json(self, value: Any) -> None:
            self._send(HTTPStatus.OK, json.dumps(value).encode(), "application/json")

        def _send(
            self, code: HTTPStatus, body: bytes, ctype: str, extra: Mapping[str, str] | None = None
        ) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if not self._head:
                self.wfile.write(body)

    return Handler
