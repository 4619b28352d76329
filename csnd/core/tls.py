"""TLS for csnd's gRPC servers and clients: PEM files in, grpc credentials out.

    TlsFiles(cert, key[, client_ca]) ─► server_credentials ─► a server's add_secure_port
    ca, cert, key                    ─► channel_credentials ─► a client's secure_channel

One builder for the changefeed and the node agent, so both read their files
the same way and say the same thing about one they cannot read.  With a
`client_ca` the server asks every client for a certificate signed by it and
refuses the handshake without one (mutual TLS): the node agent uses it to
let in its coordinator only.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from csnd.core.errors import ConfigError


@dataclass(frozen=True)
class TlsFiles:
    cert: str  # PEM certificate chain
    key: str  # PEM private key
    client_ca: str | None = None  # PEM CA certificates: clients must present a certificate it signed


def read_pem(path: str, what: str) -> bytes:
    """The bytes of a PEM file; ConfigError naming it (`what`: "certificate", "key", ...) otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read the TLS {what} {path}: {e.strerror or e}") from None
    if b"-----BEGIN " not in data:
        raise ConfigError(f"the TLS {what} {path} is not a PEM file (no -----BEGIN line)")
    return data


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """A server's credentials: its certificate and key, and with `client_ca` client certificates required."""
    pair = [(read_pem(tls.key, "key"), read_pem(tls.cert, "certificate"))]
    if tls.client_ca is None:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(
        pair, root_certificates=read_pem(tls.client_ca, "client CA certificate"), require_client_auth=True
    )


def channel_credentials(
    ca: str | None = None, cert: str | None = None, key: str | None = None
) -> grpc.ChannelCredentials:
    """A client's credentials: trust `ca` (None: the system's CAs); present `cert` and `key` if given."""
    if (cert is None) != (key is None):
        raise ConfigError("a TLS client certificate needs both its certificate and its key")
    return grpc.ssl_channel_credentials(
        root_certificates=read_pem(ca, "CA certificate") if ca is not None else None,
        private_key=read_pem(key, "key") if key is not None else None,
        certificate_chain=read_pem(cert, "certificate") if cert is not None else None,
    )
