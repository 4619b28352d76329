"""A gRPC server for the changefeed over an open changelog: `start_changefeed(...)`.

    start_changefeed(log) ─► grpc.server ─┬─ BearerTokenInterceptor (with a token)
                                         ├─ csnd.v1.Changefeed   (ChangefeedServicer)
                                         ├─ grpc.health.v1.Health (SERVING once started,
                                         │   or once `set_serving()` says so; open without
                                         │   the token unless `health_needs_token`)
                                         └─ server reflection

The caller owns the changelog (opens, appends, closes it); this module only
serves it.  `RunningServer.stop()` says NOT_SERVING, lets every stream end
cleanly (each sees the stop within WAIT_S and finishes with OK, so a client
reconnects -- to this address once the service is back), stores the named
marks, then shuts the server down.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from csnd.core.errors import ConfigError
from csnd.proto import csnd_pb2 as pb
from csnd.proto import csnd_pb2_grpc as pb_grpc
from csnd.service.auth import HEALTH_SERVICE, BearerTokenInterceptor
from csnd.service.changefeed import WAIT_S, ChangefeedServicer, FeedSettings
from csnd.service.status import NodeStatusSource

if TYPE_CHECKING:
    from csnd.changelog import Changelog, SubscriptionStore

SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["Changefeed"].full_name
# Handler threads: each subscriber holds one for as long as it is subscribed.
# A call beyond this is refused with RESOURCE_EXHAUSTED (the client retries)
# rather than waiting unseen in grpc's queue.
MAX_WORKERS: Final = 64
SERVER_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.so_reuseport", 0),  # (a second server on a used port is an error, not a silent share)
]


@dataclass(frozen=True)
class TlsFiles:
    cert: str  # PEM certificate chain
    key: str  # PEM private key


@dataclass
class RunningServer:
    port: int
    address: str  # HOST:PORT as clients reach it
    servicer: ChangefeedServicer
    _server: grpc.Server = field(repr=False)
    _health: health.HealthServicer = field(repr=False)
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)

    def set_serving(self) -> None:
        """Health says SERVING (a server started with `serving=False` is ready now)."""
        for service in ("", SERVICE_NAME):
            self._health.set(service, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace: float = 5.0) -> None:
        """Ends every stream cleanly, stores the named marks and shuts down (idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._health.enter_graceful_shutdown()
        self.servicer.stop()
        self._server.stop(grace=max(grace, 2 * WAIT_S)).wait()
        self.servicer.stop()  # (marks acknowledged during the grace period)


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the TLS {what} {path}: {e.strerror or e}") from None


def start_changefeed(
    changelog: Changelog,
    *,
    listen: str = "127.0.0.1:0",
    token: str | None = None,
    tls: TlsFiles | None = None,
    status: NodeStatusSource | None = None,
    subscriptions: SubscriptionStore | None = None,
    settings: FeedSettings | None = None,
    directory: str = "",
    serving: bool = True,
    health_needs_token: bool = False,
) -> RunningServer:
    """Serves `changelog` on `listen` (port 0: a free port, in `.port`) until `.stop()`.

    `serving=False`: health says NOT_SERVING until `set_serving()` (the
    service has more to do before it is ready: its new slots).  With a
    `token`, health checking is open to callers without it (probes cannot
    send one) unless `health_needs_token`; every other service needs it.
    """
    servicer = ChangefeedServicer(
        changelog, subscriptions=subscriptions, status=status, settings=settings, directory=directory
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="csnd-feed"),
        interceptors=(
            [BearerTokenInterceptor(token, () if health_needs_token else (HEALTH_SERVICE,))]
            if token is not None
            else []
        ),
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=MAX_WORKERS,
    )
    add_changefeed(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, HEALTH_SERVICE, reflection.SERVICE_NAME),
        server,
    )
    try:
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            creds = grpc.ssl_server_credentials([(_read(tls.key, "key"), _read(tls.cert, "certificate"))])
            port = server.add_secure_port(listen, creds)
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on {listen}: {e}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {listen}: the address is in use or not valid here")
    for service in ("", SERVICE_NAME):
        health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.start()
    host = listen.rsplit(":", 1)[0]
    running = RunningServer(port, f"{host}:{port}", servicer, server, health_servicer)
    if serving:
        running.set_serving()
    return running


class _Registration:
    """Stands in for a server while a generated `add_*Servicer_to_server` hands it its method handlers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, _handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.service, self.handlers = service, handlers


def add_changefeed(servicer: ChangefeedServicer, server: grpc.Server) -> None:
    """The generated registration of the Changefeed service, with Subscribe and Fetch taking bytes too.

    Their batches come serialized already (`changefeed._batch_response`): the
    serializer passes bytes through and serializes every other message.
    """
    got = _Registration()
    pb_grpc.add_ChangefeedServicer_to_server(servicer, got)
    handlers = dict(got.handlers)
    for name in ("Subscribe", "Fetch"):
        handler = handlers[name]
        handlers[name] = handler._replace(response_serializer=_bytes_or(handler.response_serializer))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(got.service, handlers),))
    server.add_registered_method_handlers(got.service, handlers)


def _bytes_or(serialize: Any) -> Any:
    def serializer(message: object) -> bytes:
        return message if type(message) is bytes else serialize(message)

    return serializer
