"""Which of gRPC's client pollers `csnd subscribe` runs on: the channel's own thread, not the event engine's.

grpcio 1.85's client hands every message it receives from its event
engine's threads to the channel's poller and only then to the caller: live,
a transaction that arrives alone crosses four threads in `csnd subscribe`
before its line is written.  With gRPC's `event_engine_client` experiment
off, the channel's thread reads the socket itself.  Measured with
`python -m bench latency` (docs/performance.md, "Live latency"), two
alternated rounds on an idle machine: `csnd subscribe` woke 3.1 times a
transaction instead of 6.8-7.1 at 100 a second, 1.2-1.3 instead of
2.8-3.4 at 1,000, with 7-20% less CPU a transaction, and its p99 was lower
in all four pairs.

gRPC reads `GRPC_EXPERIMENTS` once, when it is first imported, so this is
decided before that, and only for the command-line subscriber: a program
that uses `csnd.consumers.client` chooses its own gRPC settings.  It is
left alone when the user set `GRPC_EXPERIMENTS` (theirs wins, to turn the
engine back on: `GRPC_EXPERIMENTS=event_engine_client`), and for a grpcio
outside the series it was measured with: gRPC prints an error line for an
experiment it no longer knows, and a newer client may have made the
difference moot.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from importlib import metadata
from typing import Final

EXPERIMENTS: Final = "GRPC_EXPERIMENTS"
OWN_THREAD_POLLER: Final = "-event_engine_client"
# The grpcio releases (major, minor) in which the experiment was measured to pay.
MEASURED_SERIES: Final = frozenset({(1, 85)})


def grpcio_series(version: str) -> tuple[int, int] | None:
    """(major, minor) of a grpcio version string, None when it is not of that form."""
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def experiments_for(environ: MutableMapping[str, str], version: str | None) -> str | None:
    """The `GRPC_EXPERIMENTS` to set for the subscriber, or None to leave gRPC's own choice."""
    if EXPERIMENTS in environ or version is None:
        return None
    return OWN_THREAD_POLLER if grpcio_series(version) in MEASURED_SERIES else None


def prefer_channel_thread_poller(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Turn the event engine's client off for this process, if gRPC is not imported yet; whether it was."""
    if "grpc" in sys.modules:  # (too late: the experiments were read at its import)
        return False
    try:
        version: str | None = metadata.version("grpcio")
    except metadata.PackageNotFoundError:
        version = None
    value = experiments_for(environ, version)
    if value is None:
        return False
    environ[EXPERIMENTS] = value
    return True
