"""Reaching the changefeed: targets, channels, health checks, and gRPC failures in words.

Shared by every client of the changefeed in csnd.consumers (the streaming
client, `fetch`, the admin commands, the Spark source), so each says the
same thing about the same failure.  A failed call's code and details are
read only from a `grpc.Call` (what grpc raises for a finished call); any
other RpcError has neither, and is told by its text.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from csnd.core.errors import (
    ChangefeedError,
    ChangefeedRejected,
    ChangefeedUnauthenticated,
    ConfigError,
    CsnOutOfRange,
)
from csnd.core.tls import channel_credentials

CHANNEL_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    # grpc's own reconnect backoff grows to 2 minutes; ours decides instead.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
    # A channel's connections are its own: from gRPC's shared pool, a channel opened
    # to reconnect after a dead (black-holed) path could get that path back.
    ("grpc.use_local_subchannel_pool", 1),
]

# How long the look at what answers at an unreachable address may take.
PROBE_TIMEOUT_S: Final = 2.0
NOTHING_THERE: Final = "nothing accepts connections there"
_HTTP1_PROBE: Final = b"HEAD / HTTP/1.0\r\n\r\n"

__all__ = [
    "CHANNEL_OPTIONS",
    "NOTHING_THERE",
    "PROBE_TIMEOUT_S",
    "call_metadata",
    "open_channel",
    "parse_target",
    "permanent_error",
    "rpc_code",
    "rpc_details",
    "rpc_text",
    "wait_reachable",
    "why_unreachable",
]


def parse_target(target: str) -> str:
    """HOST:PORT (or grpc://HOST:PORT) -> HOST:PORT; ConfigError otherwise."""
    scheme, sep, _ = target.partition("://")
    if sep and scheme != "grpc":
        tls = " (for TLS add --tls-ca)" if scheme == "https" else ""
        raise ConfigError(
            f"target {target!r}: csnd does not take {scheme}:// here; give HOST:PORT or grpc://HOST:PORT, "
            f"the --listen address of csnd serve{tls}"
        )
    address = target.removeprefix("grpc://").rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"target {target!r} is not HOST:PORT (for example 127.0.0.1:7000)")
    return address


def why_unreachable(address: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Why gRPC got no answer at `address`, in words: an unknown host, nothing listens there, or something else does.

    gRPC itself only says "failed to connect" whatever answered, so this
    opens a plain connection and asks `HEAD /` in HTTP/1.0 (which a gRPC
    server, HTTP/2 only, does not answer so).  A reply that starts `HTTP/`
    is an HTTP/1 server, most likely csnd serve's own dashboard (`--http`)
    given instead of its changefeed (`--listen`).
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
            s.sendall(_HTTP1_PROBE)
            head = s.recv(16)
    except socket.gaierror as e:  # (not a closed port: a name that means nothing here)
        return f"the host {host} is not known ({e.strerror}); check the address"
    except OSError:
        return NOTHING_THERE
    if head.startswith(b"HTTP/"):
        return (
            f"{address} answers HTTP, not csnd's changefeed "
            "(is this the dashboard port? the changefeed is on the --listen port)"
        )
    return (
        f"something at {address} accepts connections but does not answer as csnd's changefeed "
        "(a service with TLS? then give its CA certificate)"
    )


def open_channel(address: str, tls_ca: str | None) -> grpc.Channel:
    """A channel to the changefeed at HOST:PORT: plaintext, or TLS trusting the CA in `tls_ca`."""
    if tls_ca is None:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    # (the one builder of the project's TLS credentials, which reads and checks the PEM file)
    return grpc.secure_channel(address, channel_credentials(ca=tls_ca), CHANNEL_OPTIONS)


def call_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata every call sends: the bearer token, if there is one."""
    return () if token is None else (("authorization", f"Bearer {token}"),)


def wait_reachable(channel: grpc.Channel, metadata: Sequence[tuple[str, str]], timeout: float) -> None:
    """Returns once the service at `channel` answers a health check; grpc.RpcError otherwise.

    (Not grpc.channel_ready_future: it polls the channel's state every 0.2 s,
    so every connection took at least that long.)  DEADLINE_EXCEEDED or
    UNAVAILABLE: nothing answered within `timeout`; any other code is the
    service's answer (a wrong token: UNAUTHENTICATED).
    """
    health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout, wait_for_ready=True
    )


def rpc_code(e: grpc.RpcError) -> grpc.StatusCode | None:
    """The status code of a failed call; None for an RpcError that is not a finished call."""
    return e.code() if isinstance(e, grpc.Call) else None


def rpc_details(e: grpc.RpcError) -> str | None:
    """The service's message of a failed call; None for an RpcError that is not a finished call."""
    return e.details() if isinstance(e, grpc.Call) else None


def rpc_text(e: grpc.RpcError) -> str:
    """A failed call in words: the service's message, or the error's own text without one."""
    return str(rpc_details(e) or e).strip()


def permanent_error(e: grpc.RpcError, address: str) -> Exception | None:
    """The error to raise for a status a reconnect cannot fix; None for a transient one."""
    code = rpc_code(e)
    text = rpc_text(e)
    if code == grpc.StatusCode.UNAUTHENTICATED or code == grpc.StatusCode.PERMISSION_DENIED:
        return ChangefeedUnauthenticated(f"{address} refused us: {text}")
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return CsnOutOfRange(f"{address}: {text}")
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
    ):
        return ChangefeedRejected(f"{address} rejected the request: {text}")
    if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.DATA_LOSS):
        return ChangefeedError(f"{address}: {text}")
    return None
