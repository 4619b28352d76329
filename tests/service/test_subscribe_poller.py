"""`csnd subscribe` reads its stream on gRPC's channel thread: the event engine's client is off for it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from csnd.consumers.grpcpoll import OWN_THREAD_POLLER, experiments_for, grpcio_series

# A `csnd subscribe` whose client only reports what gRPC would be imported with, then exits:
# what is under test is that the command sets the experiments before anything imports gRPC.
_REPORTING_CLIENT = """
import os, sys, types
client = types.ModuleType("csnd.consumers.client")
class ChangefeedClient:
    def __init__(self, *args, **kwargs):
        print(os.environ.get("GRPC_EXPERIMENTS"), "grpc" in sys.modules, flush=True)
        os._exit(0)
client.ChangefeedClient = ChangefeedClient
sys.modules["csnd.consumers.client"] = client
from csnd.cli import main
sys.exit(main(["subscribe", "127.0.0.1:1"]))
"""


def _subscribe_reports(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if env_value is not None:
        env["GRPC_EXPERIMENTS"] = env_value
    done = subprocess.run(
        [sys.executable, "-c", _REPORTING_CLIENT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_subscriber_turns_the_event_engine_client_off_before_grpc_is_imported() -> None:
    from importlib import metadata

    expected = OWN_THREAD_POLLER if grpcio_series(metadata.version("grpcio")) == (1, 85) else "None"
    assert _subscribe_reports(None) == f"{expected} False"


def test_the_users_own_grpc_experiments_win() -> None:
    assert _subscribe_reports("event_engine_client") == "event_engine_client False"


@pytest.mark.parametrize(
    ("environ", "version", "expected"),
    [
        ({}, "1.85.3", OWN_THREAD_POLLER),
        ({}, "1.85.1rc1", OWN_THREAD_POLLER),
        ({"GRPC_EXPERIMENTS": ""}, "1.85.3", None),  # (set, even empty: the user's)
        ({}, "1.86.0", None),  # (a series it was not measured with: gRPC's own choice)
        ({}, "1.84.0", None),
        ({}, "2.0.0", None),
        ({}, "garbage", None),
        ({}, None, None),  # (grpcio's metadata not found)
    ],
)
def test_experiments_for(environ: dict[str, str], version: str | None, expected: str | None) -> None:
    assert experiments_for(environ, version) == expected
