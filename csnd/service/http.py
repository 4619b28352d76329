"""The service's HTTP side: the ops dashboard, `/metrics` and `/api/status`.

    status() ──┬─► /api/status    the gRPC Status content as JSON (proto3 JSON names)
               ├─► /metrics       Prometheus text (csnd.service.metrics)
               ├─► /api/history   the last minutes of samples, for the plots
               └─► /              the dashboard (static files bundled in the package:
                                  it works with no internet, nothing from a CDN)

Every surface reads the same snapshot function, so the dashboard, the metrics
and the gRPC Status cannot disagree.  A sampler thread takes one snapshot a
second into a bounded ring (`HISTORY_S` of them) so a page opened now shows
the last minutes at once.

It binds 127.0.0.1 unless told otherwise: the figures name hosts, slots and
consumers.  With a token, every request needs it -- `Authorization: Bearer
<token>`, or for a browser the `token` query parameter once (kept in a
cookie for the page's own requests).
"""

from __future__ import annotations

import hmac
import json
import logging
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

log = logging.getLogger(__name__)

# Seconds of one-per-second samples kept for the plots.  Ten minutes covers a
# "what just happened" look at 3 a.m.; at ~1 kB a sample it is ~600 kB.
HISTORY_S: Final = 600
SAMPLE_INTERVAL_S: Final = 1.0

_STATIC: Final = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/index.html": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
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
        sample = {
            "t": now,
            "transactions": int(totals.get("transactions", 0) or 0),
            "changes": int(totals.get("changes", 0) or 0),
            "lag_seconds": {n["name"]: float(n.get("lag_seconds", 0.0)) for n in status.get("nodes", [])},
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
    return resources.files("csnd.service").joinpath("dashboard", name).read_bytes()


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
    ) -> None:
        self.host, self.port = _split_listen(listen)
        self.status = status
        self.token = token
        self.thresholds = thresholds or Thresholds()
        self.history = History()
        self._clock = clock
        self._registry = registry_for(status)
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> None:
        handler = _handler_for(self)
        try:
            httpd = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as e:
            raise ConfigError(f"--http {self.host}:{self.port}: cannot listen: {e.strerror or e}") from None
        httpd.daemon_threads = True
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

    def authorized(self, headers: Mapping[str, str], query: Mapping[str, list[str]]) -> bool:
        if self.token is None:
            return True
        given = None
        auth = headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            given = auth[len("Bearer ") :].strip()
        elif "token" in query:
            given = query["token"][0]
        else:
            for part in headers.get("Cookie", "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == "csnd_token":
                    given = v
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def config(self) -> dict[str, Any]:
        return {"thresholds": asdict(self.thresholds), "sample_interval_s": SAMPLE_INTERVAL_S}


def _split_listen(listen: str) -> tuple[str, int]:
    try:
        return split_host_port(listen)
    except ValueError as e:
        raise ConfigError(f"--http: {e}") from None


def _handler_for(server: DashboardServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "csnd"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("http %s: " + format, self.address_string(), *args)

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            if not server.authorized(self.headers, query):  # type: ignore[arg-type]
                self._send(
                    HTTPStatus.UNAUTHORIZED,
                    b"csnd: a token is required (Authorization: Bearer)\n",
                    "text/plain; charset=utf-8",
                    extra={"WWW-Authenticate": "Bearer"},
                )
                return
            cookie = (
                {"Set-Cookie": f"csnd_token={query['token'][0]}; HttpOnly; SameSite=Strict; Path=/"}
                if "token" in query and server.token
                else {}
            )
            try:
                if url.path in _STATIC:
                    name, ctype = _STATIC[url.path]
                    self._send(HTTPStatus.OK, _read_static(name), ctype, extra=cookie)
                elif url.path == "/metrics":
                    self._send(HTTPStatus.OK, generate_latest(server._registry), CONTENT_TYPE_LATEST)
                elif url.path == "/api/status":
                    self._json(server.status())
                elif url.path == "/api/history":
                    self._json({"samples": server.history.samples()})
                elif url.path == "/api/config":
                    self._json(server.config())
                else:
                    self._send(HTTPStatus.NOT_FOUND, b"csnd: no such page\n", "text/plain; charset=utf-8")
            except BrokenPipeError:
                pass  # the browser went away mid-answer
            except Exception as e:
                log.exception("http %s failed", url.path)
                self._send(
                    HTTPStatus.INTERNAL_SERVER_ERROR,
                    f"csnd: internal error: {e}\n".encode(),
                    "text/plain; charset=utf-8",
                )

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
            self.wfile.write(body)

    return Handler
