"""A gRPC server for the changefeed over an open changelog: `start_changefeed(...)`.

    start_changefeed(log) ─► grpc.server ─┬─ AccessInterceptor (with credentials: token, roles)
                                         ├─ StreamLimitInterceptor (streams' own bound)
                                         ├─ csnd.changefeed.v1.Changefeed (ChangefeedServicer),
                                         │   also as csnd.v1.Changefeed (its earlier name, deprecated)
                                         ├─ grpc.health.v1.Health (SERVING once started,
                                         │   or once `set_serving()` says so; open without
                                         │   the token unless `health_needs_token`)
                                         └─ server reflection (grpc.reflection.v1 and v1alpha)

The caller owns the changelog (opens, appends, closes it); this module only
serves it.  `RunningServer.stop()` says NOT_SERVING, lets every stream end
cleanly (each sees the stop within WAIT_S and finishes with OK, so a client
reconnects -- to this address once the service is back), stores the named
marks, then shuts the server down.

Served in plaintext (no TLS) on an address beyond loopback, tokens and rows
cross the network readable by anyone on the path: the server says so in a
warning at every start (and that it takes no token, when it takes none).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from csnd.core.addresses import is_loopback as is_loopback  # (re-exported: the service's check)
from csnd.core.auth import HEALTH_SERVICE, AccessInterceptor, Credentials, token_digest
from csnd.core.errors import ConfigError
from csnd.core.listening import check_listen
from csnd.core.reflection import enable_reflection
from csnd.core.tls import TlsFiles as TlsFiles  # (re-exported: the service names it here)
from csnd.core.tls import server_credentials
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.proto.legacy import changefeed_pb2 as legacy_pb
from csnd.service.changefeed import WAIT_S, ChangefeedServicer, FeedSettings
from csnd.service.feed_ports import SnapshotJobsSource
from csnd.service.limits import StreamLimitInterceptor, StreamLimits, StreamSlots
from csnd.service.status import StatusSource

if TYPE_CHECKING:
    from csnd.changelog import Changelog, SubscriptionStore

log = logging.getLogger("csnd.changefeed")

SERVICE_NAME: Final = pb.DESCRIPTOR.services_by_name["Changefeed"].full_name
# The same service under its name before csnd.changefeed.v1 (deprecated): clients, stubs
# and grpcurl scripts written against it keep working, reflection describes it too.
LEGACY_SERVICE_NAME: Final = legacy_pb.DESCRIPTOR.services_by_name["Changefeed"].full_name
SERVICE_NAMES: Final = (SERVICE_NAME, LEGACY_SERVICE_NAME)
# Handler threads with the default limits (streams' share and unary calls').
MAX_WORKERS: Final = StreamLimits().threads
SERVER_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.so_reuseport", 0),  # (a second server on a used port is an error, not a silent share)
]


@dataclass
class RunningServer:
    port: int
    address: str  # HOST:PORT as clients reach it
    servicer: ChangefeedServicer
    _server: grpc.Server = field(repr=False)
    _health: health.HealthServicer = field(repr=False)
    streams: StreamSlots = field(default_factory=lambda: StreamSlots(StreamLimits()))
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)

    def set_serving(self) -> None:
        """Health says SERVING (a server started with `serving=False` is ready now)."""
        for service in ("", *SERVICE_NAMES):
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


def start_changefeed(
    changelog: Changelog,
    *,
    listen: str = "127.0.0.1:0",
    token: str | None = None,
    tls: TlsFiles | None = None,
    status: StatusSource | None = None,
    subscriptions: SubscriptionStore | None = None,
    settings: FeedSettings | None = None,
    directory: str = "",
    serving: bool = True,
    health_needs_token: bool = False,
    credentials: Credentials | None = None,
    limits: StreamLimits | None = None,
    databases: Mapping[str, str] | None = None,
    snapshots: SnapshotJobsSource | None = None,
) -> RunningServer:
    """Serves `changelog` on `listen` (port 0: a free port, in `.port`) until `.stop()`.

    `serving=False`: health says NOT_SERVING until `set_serving()` (the
    service has more to do before it is ready: its new slots).  With a
    `token`, health checking is open to callers without it (probes cannot
    send one) unless `health_needs_token`; every other service needs it.
    `token` is an admin credential; `credentials` adds (or holds) others,
    with roles (csnd.core.auth).  `limits`: how many streams it serves
    at once, in all and per host (csnd.service.limits).  `databases`: each
    node's database name, which the Debezium formats write as `source.db`.
    `snapshots`: the service's incremental snapshots once it has them
    (StartSnapshot and Status; None: it takes none).
    """
    access = _access(token, credentials)
    limits = limits or StreamLimits()
    slots = StreamSlots(limits)
    servicer = ChangefeedServicer(
        changelog,
        subscriptions=subscriptions,
        status=status,
        settings=settings,
        directory=directory,
        credentials=access,
        databases=databases,
        snapshots=snapshots,
    )
    interceptors: list[grpc.ServerInterceptor] = []
    if access is not None:
        interceptors.append(AccessInterceptor(access, () if health_needs_token else (HEALTH_SERVICE,)))
    interceptors.append(StreamLimitInterceptor(slots))
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=limits.threads, thread_name_prefix="csnd-feed"),
        interceptors=interceptors,
        options=SERVER_OPTIONS,
        maximum_concurrent_rpcs=limits.threads,
    )
    add_changefeed(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    enable_reflection(server, (*SERVICE_NAMES, HEALTH_SERVICE))
    check_listen(listen)  # (the cause in words: gRPC's own failure names none)
    try:
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, server_credentials(tls))
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on {listen}: {e}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {listen}: the address is in use or not valid here")
    for service in ("", *SERVICE_NAMES):
        health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.start()
    host = listen.rsplit(":", 1)[0]
    _warn_if_exposed(host, port, tls is not None, access is not None)
    running = RunningServer(port, f"{host}:{port}", servicer, server, health_servicer, slots)
    if serving:
        running.set_serving()
    return running


def _access(token: str | None, credentials: Credentials | None) -> Credentials | None:
    """The credentials the server takes: `token` as admin, with `credentials`' (None: no check at all)."""
    if token is None:
        return credentials
    admin = Credentials.of(token, None)
    assert admin is not None
    if credentials is None:
        return admin
    if any(c.digest == token_digest(token) for c in credentials.entries):
        raise ConfigError("the --token-file token is also in --credentials-file; give each its own token")
    return Credentials([*admin.entries, *credentials.entries])


def _warn_if_exposed(host: str, port: int, tls: bool, authenticated: bool) -> None:
    """A warning at start for a changefeed others can reach in plaintext, or without a token."""
    if is_loopback(host):
        return
    where = f"{host or '0.0.0.0'}:{port}"
    if not tls:
        log.warning(
            "changefeed on %s is served in plaintext beyond loopback: tokens and rows cross the network "
            "readable; give it --tls-cert and --tls-key, or listen on 127.0.0.1",
            where,
        )
    if not authenticated:
        log.warning(
            "changefeed on %s takes calls from anyone who reaches it (no --token-file or "
            "--credentials-file): every row is theirs to read",
            where,
        )


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

    Their batches come serialized already (`feed_messages.batch_response`): the
    serializer passes bytes through and serializes every other message.  The
    same handlers answer under both names (SERVICE_NAMES).
    """
    got = _Registration()
    pb_grpc.add_ChangefeedServicer_to_server(servicer, got)
    handlers = dict(got.handlers)
    for name in ("Subscribe", "Fetch"):
        handler = handlers[name]
        handlers[name] = handler._replace(response_serializer=_bytes_or(handler.response_serializer))
    for name in SERVICE_NAMES:
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)


def _bytes_or(serialize: Any) -> Any:
    def serializer(message: object) -> bytes:
        return message if type(message) is bytes else serialize(message)

    return serializer
