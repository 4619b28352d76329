"""A client that asked for "the oldest retained" keeps that start across a reconnect.

`after_csn = 0` means the oldest retained record *when the stream starts*;
the service reports the CSN it resolved that to (`Subscribed.after_csn`).
A client that reconnected before it had handed anything out used to ask
for 0 again -- and, with retention run in between, silently started past
records it had never seen.  It now continues from the start the service
resolved, so the gap is OUT_OF_RANGE, never a silent move.
"""

from __future__ import annotations

import os

import pytest

from csnd.changelog import Changelog
from csnd.consumers.client import Changefeed
from tests.service.feedkit import FAST, fill, serve, wait_for


def test_a_reconnect_before_the_first_transaction_keeps_the_resolved_start(tmp_path: object) -> None:
    d = os.path.join(str(tmp_path), "log")
    log = Changelog(d, segment_bytes=4096, retention_bytes=40_000)
    fill(log, range(1, 401))
    log.apply_retention()
    start = log.oldest_after_csn
    assert start > 0
    log.hold_readers(start)  # (the client is subscribed, but is handed nothing yet)
    srv = serve(log, settings=FAST)
    port = srv.port
    feed = Changefeed(srv.address, after_csn=0, give_up=30)
    try:
        assert feed.next(timeout=0.5) is None
        wait_for(lambda: srv.servicer.feed_status().consumers, "the client to subscribe")
        srv.stop(grace=0.5)
        fill(log, range(401, 1201))
        log.apply_retention()  # (the records after `start` the client never saw are gone)
        assert log.oldest_after_csn > start
        log.release_readers()
        srv = serve(log, settings=FAST, listen=f"127.0.0.1:{port}")
        with pytest.raises(Exception, match="dropped by retention") as raised:
            got = feed.next(timeout=30)
            raise AssertionError(f"the client moved on silently: it was handed csn {got and got[0]}")
        assert f"after csn {start}" in str(raised.value)
    finally:
        feed.close()
        srv.stop()
        log.close()
