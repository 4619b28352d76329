"""Why a gRPC server cannot listen on an address, found out before gRPC tries.

gRPC's server says only "Failed to bind to address ...; set
GRPC_VERBOSITY=debug ..." when `add_insecure_port` fails, after its C core
has logged the cause on stderr in a line of its own format
(`E1128 ... add_port.cc:83] ... Address already in use`).  So before a
server is given an address, `check_listen` resolves it and binds a socket
there as the server will (SO_REUSEADDR, no SO_REUSEPORT), then lets it go:
a name that does not resolve, a port in use, a privileged port, an address
that is not this machine's is a ConfigError naming the cause.  (`--http`
binds its own socket and says the cause already.)

The server binds a moment later; between the two another program may take
the port.  That race is rare and harmless: its loser gets gRPC's own
message, as before.
"""

from __future__ import annotations

import contextlib
import errno
import socket

from csnd.core.errors import ConfigError


def check_listen(address: str, flag: str = "--listen") -> None:
    """ConfigError naming why `address` (HOST:PORT, as a gRPC server takes it) cannot be listened on.

    Nothing is raised for a form gRPC reads and this does not (`unix:...`):
    the server says what it says then.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or address.startswith(("unix:", "unix-abstract:", "vsock:")):
        return
    host = host.strip("[]")
    try:
        found = socket.getaddrinfo(
            host or None, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise ConfigError(
            f"cannot listen on {address}: the host {host} is not known here ({e.strerror}); "
            f"give {flag} a name or address of this machine (127.0.0.1, or 0.0.0.0 for every interface)"
        ) from None
    failures: list[OSError] = []
    for family, kind, proto, _, where in found:
        try:
            with socket.socket(family, kind, proto) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (as gRPC: TIME_WAIT is no conflict)
                if family == socket.AF_INET6:
                    with contextlib.suppress(OSError):
                        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                s.bind(where)
        except OSError as e:
            if (
                e.errno == errno.EADDRINUSE
            ):  # (one address of the name taken: clients may reach the other program)
                raise ConfigError(_why(address, host, e, flag)) from None
            failures.append(e)
    if failures and len(failures) == len(found):
        raise ConfigError(_why(address, host, failures[0], flag))


def _why(address: str, host: str, e: OSError, flag: str) -> str:
    if e.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {address}: the address is in use (another csnd serve, or another program, "
            f"listens there); stop it or choose another {flag} port"
        )
    if e.errno == errno.EACCES:
        return (
            f"cannot listen on {address}: permission denied (a port below 1024 needs privileges); "
            f"choose a {flag} port from 1024 up"
        )
    if e.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {address}: {host} is not an address of this machine; give {flag} one of "
            "its own (127.0.0.1, or 0.0.0.0 for every interface)"
        )
    return f"cannot listen on {address}: {e.strerror or e}"
