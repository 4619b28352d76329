"""The client reading its stream on the caller's thread (`read_on_caller`, as `csnd subscribe` does)."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import ClassVar

import pytest

from csnd.changelog import Changelog
from csnd.consumers import client as client_mod
from csnd.consumers import subscribe as subscribe_cmd
from csnd.consumers.client import ChangefeedClient
from tests.service.feedkit import FAST, line, serve, txn_tables

RESPONSE_THREAD = "csnd-feed-responses"


def _response_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == RESPONSE_THREAD]


def test_a_live_stream_is_read_on_the_callers_thread(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path / "log"))
    srv = serve(log, settings=FAST)
    feed = ChangefeedClient(srv.address, read_on_caller=True)
    try:
        feed.connect()
        for csn in range(1, 21):  # (one at a time, each committed once the one before arrived)
            want = line(csn, txn_tables(csn), gid=f"g-{csn}")
            log.append(csn, want)
            log.sync()
            assert feed.next(timeout=60) == (csn, want)
            # No thread between gRPC and the caller: what arrives is read here.
            assert _response_threads() == []
    finally:
        feed.close()
        srv.stop()
        log.close()


def test_keepalives_are_answered_while_the_caller_waits(tmp_path: Path) -> None:
    # FAST: a keepalive every 0.2 s, and a client silent for 2 s is dropped: waiting 3 s
    # in next() answers them, so the stream stays up and nothing is reconnected.
    log = Changelog(str(tmp_path / "log"))
    srv = serve(log, settings=FAST)
    feed = ChangefeedClient(srv.address, read_on_caller=True)
    try:
        feed.connect()
        assert feed.next(timeout=3.0) is None
        assert feed.reconnects == 0
        want = line(1, txn_tables(1))
        log.append(1, want)
        log.sync()
        assert feed.next(timeout=60) == (1, want)
        assert feed.reconnects == 0
    finally:
        feed.close()
        srv.stop()
        log.close()


def test_close_waits_for_the_last_acknowledgement_to_be_stored(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path / "log"))
    for csn in range(1, 6):
        log.append(csn, line(csn, txn_tables(csn)))
    log.sync()
    srv = serve(log, settings=FAST)
    feed = ChangefeedClient(srv.address, name="caller", read_on_caller=True)
    try:
        got = [feed.next(timeout=60) for _ in range(5)]
        assert [rec[0] for rec in got if rec is not None] == [1, 2, 3, 4, 5]
        feed.ack(5)
        feed.close()  # (returns once the service ended the stream, the acknowledgement stored)
        status = srv.servicer.feed_status()
        assert [c.acknowledged_csn for c in status.consumers if c.name == "caller"] == [5]
    finally:
        feed.close()
        srv.stop()
        log.close()


class _Watched(ChangefeedClient):
    """The real client; notes whether a response thread ran while the command read its lines."""

    made: ClassVar[list[_Watched]] = []

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.response_threads_seen = 0
        _Watched.made.append(self)

    def take_ready(self, most: int) -> list[tuple[int, bytes]]:
        self.response_threads_seen += len(_response_threads())
        return super().take_ready(most)


def test_csnd_subscribe_reads_on_the_thread_that_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    log = Changelog(str(tmp_path / "log"))
    want = [line(csn, txn_tables(csn), gid=f"g-{csn}") for csn in range(1, 4)]
    for csn, text in enumerate(want, 1):
        log.append(csn, text)
    log.sync()
    srv = serve(log, settings=FAST)
    monkeypatch.setattr(client_mod, "ChangefeedClient", _Watched)
    _Watched.made = []
    try:
        args = argparse.Namespace(
            target=srv.address,
            from_csn=None,
            name=None,
            table=[],
            token_file=None,
            tls_ca=None,
            schemas=False,
            format="native",
            limit=3,
            idle_timeout=None,
        )
        assert subscribe_cmd.cmd_subscribe(args) == 0
        out = capfd.readouterr().out.encode()
        assert out == b"".join(text + b"\n" for text in want)  # (the output as ever)
        (feed,) = _Watched.made
        assert feed.read_on_caller and feed.response_threads_seen == 0
    finally:
        srv.stop()
        log.close()
