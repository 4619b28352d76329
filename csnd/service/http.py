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
dashboard and nothing else (not the changefeed).  Over TLS the cookie is
`Secure`.  The probes (`/healthz`, `/readyz`) are open: a Kubernetes probe
sends no token, and they say only whether the service is up and ready.

TLS (`--tls-cert`/`--tls-key`, the changefeed's certificate) wraps each
accepted connection; the handshake runs in the connection's own thread, so
a client that connects and says nothing holds one thread until
`CONNECTION_TIMEOUT_S`, never the accept loop.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from csnd.core.addresses import split_host_port
from csnd.core.errors import ConfigError
from csnd.service.metrics import registry_for
from csnd.service.server import TlsFiles

log = logging.getLogger(__name__)

# Seconds of one-per-second samples kept for the plots.  Ten minutes covers a
# "what just happened" look at 3 a.m.; at ~1 kB a sample it is ~600 kB.
HISTORY_S: Final = 600
SAMPLE_INTERVAL_S: Final = 1.0
# A connection that sends nothing (or never finishes its TLS handshake) for this
# long is closed: it holds a thread meanwhile.  Every request of the dashboard
# and of a scraper is one short exchange.
CONNECTION_TIMEOUT_S: Final = 30.0
# The session cookie: an HMAC of the token under this label, never the token.
SESSION_COOKIE: Final = "csnd_session"
_SESSION_LABEL: Final = b"csnd dashboard session"
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


class _HttpServer(ThreadingHTTPServer):
    """A threading HTTP server that speaks TLS when given a context (see the module docstring)."""

    daemon_threads = True
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away or failed its handshake (a plain HTTP request on
        # the TLS port): the default would print a traceback on stderr.
        log.debug("http %s: connection failed", client_address, exc_info=True)


class DashboardServer:
    """The HTTP server; `start()` binds (a port in use is a ConfigError) and serves in a thread."""

    def __init__(
        self,
        listen: str,
        status: Callable[[], Mapping[str, Any]],
        *,
        token: str | None = None,
        thresholds: Thresholds | None = None,
        clock: Callable[[], float] = time.time,
        ready: Callable[[], tuple[bool, str]] = _always_ready,
        tls: TlsFiles | None = None,
    ) -> None:
        self.host, self.port = _split_listen(listen)
        self.status = status
        self.ready = ready
        self.token = token
        self._session = (
            None if token is None else hmac.new(token.encode(), _SESSION_LABEL, hashlib.sha256).hexdigest()
        )
        self._tls = tls_context(tls) if tls is not None else None
        self.thresholds = thresholds or Thresholds()
        self.history = History()
        self._clock = clock
        self._registry = registry_for(status)
        self._stop = threading.Event()
        self._httpd: _HttpServer | None = None
        self._threads: list[threading.Thread] = []

    @property
    def tls(self) -> bool:
        return self._tls is not None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}/"

    def start(self) -> None:
        handler = _handler_for(self)
        try:
            httpd = _HttpServer((self.host, self.port), handler)
        except OSError as e:
            raise ConfigError(f"--http {self.host}:{self.port}: cannot listen: {e.strerror or e}") from None
        httpd.tls = self._tls
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._threads = [
            threading.Thread(
                target=httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="csnd-http", daemon=True
            ),
            threading.Thread(target=self._sample, name="csnd-http-sampler", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.history.add(self._clock(), self.status())
            except Exception:  # a failing snapshot must not end the plots for good
                log.exception("dashboard: taking a status sample failed")
            self._stop.wait(SAMPLE_INTERVAL_S)

    # --- what the handler asks --------------------------------------------------------

    def authorized(self, headers: Mapping[str, str]) -> bool:
        """The token in `Authorization: Bearer`, or the session cookie `/login` gave."""
        if self.token is None or self._session is None:
            return True
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self.token_matches(auth[len("Bearer ") :].strip())
        for part in headers.get("Cookie", "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == SESSION_COOKIE and hmac.compare_digest(v.encode(), self._session.encode()):
                return True
        return False

    def token_matches(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def session_cookie(self) -> str:
        """The Set-Cookie value `/login` answers a good token with (`Secure` over TLS)."""
        assert self._session is not None
        secure = "; Secure" if self.tls else ""
        return f"{SESSION_COOKIE}={self._session}; HttpOnly; SameSite=Strict; Path=/{secure}"

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
# The longest /login body read (a token is far shorter).
_LOGIN_MAX: Final = 4096


def _handler_for(server: DashboardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "csnd"
        timeout = CONNECTION_TIMEOUT_S
        _head = False

        def setup(self) -> None:
            if isinstance(self.request, ssl.SSLSocket):
                self.request.settimeout(self.timeout)
                self.request.do_handshake()  # (here, in this connection's thread)
            super().setup()

        def log_message(self, format: str, *args: Any) -> None:  # (the base class's name)
            log.debug("http %s: " + format, self.address_string(), *args)

        def do_HEAD(self) -> None:  # (the base class's name)
            self._head = True
            self.do_GET()

        def do_GET(self) -> None:  # (the base class's name)
            url = urlsplit(self.path)
            try:
                if url.path == "/healthz":
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
            if urlsplit(self.path).path != "/login":
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
            if server.token is None:
                self._send(HTTPStatus.SEE_OTHER, b"", _TEXT, extra={"Location": "./"})
            elif server.token_matches(given):
                extra = {"Location": "./", "Set-Cookie": server.session_cookie()}
                self._send(HTTPStatus.SEE_OTHER, b"", _TEXT, extra=extra)
            else:
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
