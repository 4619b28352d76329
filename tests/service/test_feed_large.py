"""Transactions larger than one message: stored, served and received in pieces (docs/design.md section 8).

The server here bounds a message at 2,000 bytes, so the large lines are a
few dozen kilobytes and take the same path a gigabyte transaction takes
with the real bound.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from csnd.changelog import Changelog
from csnd.consumers.client import Changefeed, LargeLine, fetch
from csnd.consumers.delivery import Delivery
from csnd.core.errors import ChangefeedError
from csnd.service import FeedSettings, RunningServer
from tests.service.feedkit import change, serve

BOUND = 2_000  # the server's message bound, and so its piece size
CSND = [sys.executable, "-m", "csnd.cli"]


def big_line(csn: int, rows: int, table: str = "acct") -> bytes:
    changes = [change(i, "public", table) for i in range(rows)]
    return json.dumps({"csn": csn, "gid": None, "nodes": {}, "changes": changes}, ensure_ascii=False).encode()


@pytest.fixture
def feed_of_large(tmp_path: object) -> Iterator[tuple[RunningServer, dict[int, bytes]]]:
    written = {
        1: big_line(1, 1),
        2: big_line(2, 300),  # (about 60 KB: 30 pieces)
        3: big_line(3, 2),
        4: big_line(4, 200, table="orders"),
        5: big_line(5, 1, table="orders"),
        6: big_line(6, 120),
    }
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        for csn, line in written.items():
            log.append(csn, line)
        log.sync()
        srv = serve(log, settings=FeedSettings(max_batch_bytes=BOUND))
        try:
            yield srv, written
        finally:
            srv.stop()


def test_large_lines_arrive_whole_and_in_order(feed_of_large: tuple[RunningServer, dict[int, bytes]]) -> None:
    srv, written = feed_of_large
    assert max(map(len, written.values())) > 20 * BOUND
    with Changefeed(srv.address) as feed:
        got = [feed.next(timeout=60) for _ in written]
        assert got == sorted(written.items())
        assert feed.next(timeout=0.3) is None
    assert list(fetch(srv.address)) == sorted(written.items())
    assert list(fetch(srv.address, 1, 2)) == [(2, written[2])]


def test_a_spooled_large_line_is_a_file(feed_of_large: tuple[RunningServer, dict[int, bytes]]) -> None:
    srv, written = feed_of_large
    with Changefeed(srv.address) as feed:
        for csn, want in sorted(written.items()):
            rec = feed.next_spooled(timeout=60)
            assert rec is not None and rec[0] == csn
            line = rec[1]
            if len(want) > BOUND:
                assert isinstance(line, LargeLine) and line.size == len(want)
                assert line.read() == want
            else:
                assert line == want


def test_a_filtered_subscriber_gets_the_kept_part_of_a_large_line(
    feed_of_large: tuple[RunningServer, dict[int, bytes]],
) -> None:
    srv, written = feed_of_large
    want = [(c, w) for c, w in sorted(written.items()) if c in (4, 5)]  # (the lines of orders only)
    with Changefeed(srv.address, tables=["public.orders"]) as feed:
        assert [feed.next(timeout=60) for _ in want] == want
        assert feed.next(timeout=0.3) is None


def test_csnd_subscribe_prints_large_lines_whole(
    feed_of_large: tuple[RunningServer, dict[int, bytes]],
) -> None:
    srv, written = feed_of_large
    proc = subprocess.run(
        [*CSND, "subscribe", srv.address, "--limit", str(len(written))], capture_output=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"".join(written[c] + b"\n" for c in sorted(written))


def test_a_stream_cut_inside_a_large_line_starts_it_again_whole(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    """The server stops while pieces of a line are on their way: the client drops them and reconnects."""
    d = os.path.join(str(tmp_path), "log")
    written = {c: big_line(c, 8_000) for c in range(1, 4)}  # (2 MB each: more than gRPC buffers)
    with Changelog(d) as log:
        for csn, line in written.items():
            log.append(csn, line)
        log.sync()
        settings = FeedSettings(max_batch_bytes=BOUND, keepalive_s=0.2, client_timeout_s=5.0)
        srv = serve(log, settings=settings)
        port = srv.port
        feed = Changefeed(srv.address, give_up=60)
        try:
            assert feed.next(timeout=60) == (1, written[1])
            deadline = time.monotonic() + 60
            while not feed._inbox.full():  # (pieces of csn 2 wait for the caller)
                assert time.monotonic() < deadline
                time.sleep(0.01)
            srv.stop(grace=0)
            srv = serve(log, settings=settings, listen=f"127.0.0.1:{port}")
            with caplog.at_level(logging.INFO, logger="csnd.consumers.client"):
                assert feed.next(timeout=60) == (2, written[2])
                assert feed.next(timeout=60) == (3, written[3])
            # (csn 2's, or csn 3's if the inbox held all of 2: then it shows only once 3 is read)
            assert "cut short; it comes again whole" in caplog.text
            assert feed.reconnects >= 1
        finally:
            feed.close()
            srv.stop()


def test_a_line_longer_to_send_than_the_silence_timeout_still_arrives(tmp_path: object) -> None:
    """A client acknowledges whole lines only: keepalives between the pieces keep it from being dropped."""
    big = big_line(1, 80_000)  # (about 20 MB: 10,000 pieces, several seconds here)
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        log.append(1, big)
        log.sync()
        settings = FeedSettings(max_batch_bytes=BOUND, keepalive_s=0.1, client_timeout_s=1.0)
        srv = serve(log, settings=settings)
        try:
            with Changefeed(srv.address, give_up=30) as feed:
                started = time.monotonic()
                assert feed.next(timeout=120) == (1, big)
                took = time.monotonic() - started
                assert feed.reconnects == 0, f"dropped while the line was sent ({took:.1f} s)"
        finally:
            srv.stop()


def test_lines_taken_in_runs_are_the_lines_one_by_one_and_a_run_stops_before_a_large_one(
    feed_of_large: tuple[RunningServer, dict[int, bytes]],
) -> None:
    """`take_ready` (how `csnd subscribe` writes a backlog) never hands out a line that came in pieces."""
    srv, written = feed_of_large
    got: list[tuple[int, bytes]] = []
    with Changefeed(srv.address) as feed:
        while len(got) < len(written):
            run = feed.take_ready(10)
            if run:
                assert all(type(line) is bytes and len(line) <= BOUND for _, line in run)
                got += run
                continue
            rec = feed.next_spooled(timeout=60)
            assert rec is not None
            csn, line = rec
            got.append((csn, line.read() if isinstance(line, LargeLine) else line))
    assert got == sorted(written.items())


def test_a_backlog_of_small_lines_is_taken_in_runs(tmp_path: object) -> None:
    written = {csn: big_line(csn, 1) for csn in range(1, 41)}
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        for csn, line in written.items():
            log.append(csn, line)
        log.sync()
        srv = serve(log)
        try:
            with Changefeed(srv.address) as feed:
                first = feed.next_spooled(timeout=60)  # (waits for the stream's first message)
                assert first is not None
                got, runs = [first], []
                while len(got) < len(written):
                    run = feed.take_ready(10)
                    if not run:
                        one = feed.next(timeout=60)
                        assert one is not None
                        run = [one]
                    runs.append(len(run))
                    got += run
                assert got == sorted(written.items())
                assert max(runs) == 10 and feed.last_csn == 40
        finally:
            srv.stop()


def test_lines_taken_in_runs_out_of_order_are_refused_naming_both() -> None:
    """(the client's Delivery, which `take_ready` hands its runs out of)"""
    delivery = Delivery("127.0.0.1:7000", 3)
    delivery.pending.extend([(5, b"five"), (4, b"four")])  # (as a faulty service would send them)
    with pytest.raises(ChangefeedError, match="sent csn 4 after csn 5; reconnect to recover"):
        delivery.take_ready(10)
    delivery.pending.clear()
    delivery.last_csn = 9
    delivery.pending.extend([(9, b"nine")])
    with pytest.raises(ChangefeedError, match="sent csn 9 after csn 9"):
        delivery.take_ready(10)
