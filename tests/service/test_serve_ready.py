"""The ready line of `csnd serve`: what a script may count on once it is out.

A stop at once after it is the service's clean stop, exit 0.
"""

from __future__ import annotations

import io
import signal
from pathlib import Path

from csnd.gtm import generate_cluster
from csnd.runtime.stopping import Terminated
from csnd.service.config import ServeConfig, ServedSource
from csnd.service.serve import Service


class _StopAtReady(io.StringIO):
    """A stdout that takes the ready line and at that instant receives SIGTERM (as csnd's handler raises it)."""

    def write(self, text: str) -> int:
        n = super().write(text)
        if "listening on" in text:
            raise Terminated
        return n


def test_a_stop_the_instant_the_ready_line_is_out_is_a_clean_stop(tmp_path: Path) -> None:
    """A script that stops the service as soon as it read the ready line gets exit 0, as for any stop.

    The stop used to land before the service waited for one (mostly: the
    pipeline thread was starting), so it ended as an interrupted command,
    exit 143, and at times with a decoder's traceback.
    """
    generate_cluster(str(tmp_path), 1, 20, seed=5, binary=True)
    config = ServeConfig(
        (ServedSource(str(tmp_path / "dn1.pgstream")),),
        str(tmp_path / "log"),
        listen="127.0.0.1:0",
        decoders=1,
    )
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        code = Service(config, stdout=_StopAtReady()).run()
    except KeyboardInterrupt:  # (not a clean stop; kept from pytest, which would end the session)
        code = 143
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert code == 0
