"""HOST:PORT addresses a csnd command listens on (`--listen`, `--http`, and their settings).

One reading for every listening address, so `--listen` and `--http` take the
same forms and refuse the same mistakes at parse time: a missing port
(gRPC would quietly take 443), or one beyond 65535 (gRPC warns and wraps it
around).  Port 0 asks for any free port.  An empty host (`:7070`) is
127.0.0.1: what csnd serves names hosts, slots and consumers, so it binds
the loopback unless told otherwise (`0.0.0.0:7070` for every interface).
"""

from __future__ import annotations

import ipaddress
from typing import Final

LOOPBACK: Final = "127.0.0.1"
EXPECTED: Final = "HOST:PORT with PORT 0 to 65535 (0: any free port)"


def split_host_port(text: str) -> tuple[str, int]:
    """`HOST:PORT` -> (host without IPv6 brackets, port); ValueError naming what is expected."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535 or host.strip() != host:
        raise ValueError(f"expected {EXPECTED}, got {text!r}")
    return host.strip("[]") or LOOPBACK, int(port)


def listen_address(text: str) -> str:
    """`text` checked as HOST:PORT, as a gRPC server is given it (`:PORT` becomes 127.0.0.1:PORT)."""
    _, port = split_host_port(text)
    return text if text.rpartition(":")[0] else f"{LOOPBACK}:{port}"


def is_loopback(host: str) -> bool:
    """Whether a listening HOST (with or without IPv6 brackets) is reachable from this machine only.

    127.0.0.0/8, ::1 and `localhost`; everything else is not, including
    0.0.0.0 and :: (every interface), an empty host, and any other name
    (what it resolves to can change).
    """
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # (a name other than localhost)
