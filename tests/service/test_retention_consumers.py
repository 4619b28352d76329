"""Retention and the consumers that still need its records: named subscriptions and the Parquet export.

A named subscription's mark is where its stream started until its first
acknowledgement, stored before the stream answers; a resume from a mark is
range-checked, 0 included.  Marks and the export's unexported range hold
retention up to `retention_hold_bytes`/`retention_hold_hours`; past them the
records go and the consumer behind is told OUT_OF_RANGE, naming itself, its
mark and the oldest retained csn.  Real gRPC server on port 0, real changelog.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csnd.changelog import Changelog, SubscriptionStore
from csnd.consumers.client import Changefeed
from csnd.core.errors import CsnOutOfRange
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service import FeedSettings
from csnd.service.parquet import ParquetExport
from tests.service.feedkit import fill, serve

# Marks are stored at creation, not by the periodic store: a long interval keeps that out of the way.
SLOW_STORE = FeedSettings(keepalive_s=0.2, client_timeout_s=5.0, store_interval_s=3600.0)


class Held:
    """A raw Subscribe call: its first answer, then the call held open until `close()`."""

    def __init__(self, address: str, start: pb.SubscribeStart) -> None:
        self.release = threading.Event()
        self.channel = grpc.insecure_channel(address)
        self.call = pb_grpc.ChangefeedStub(self.channel).Subscribe(self._requests(start))

    def _requests(self, start: pb.SubscribeStart) -> Iterator[pb.SubscribeRequest]:
        yield pb.SubscribeRequest(start=start)
        self.release.wait()

    def subscribed(self) -> pb.Subscribed:
        first = next(iter(self.call))
        assert first.HasField("subscribed")
        subscribed: pb.Subscribed = first.subscribed
        return subscribed

    def error(self) -> grpc.RpcError:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError as e:
            return e
        finally:
            self.close()
        raise AssertionError("the stream ended without an error")

    def close(self) -> None:
        self.release.set()
        self.call.cancel()
        self.channel.close()


def _trimmed(d: str, last: int = 60) -> Changelog:
    """A changelog of csns 1..last whose oldest segments retention dropped; consumers hold nothing past 8 KiB."""
    log = Changelog(d, segment_bytes=4096, retention_bytes=8192, retention_hold_bytes=8192)
    fill(log, range(1, last + 1))
    assert log.apply_retention() > 0 and log.oldest_csn > 2
    return log


def test_a_new_named_subscription_stores_where_it_started_before_it_answers(tmp_path: Path) -> None:
    d = str(tmp_path / "log")
    with _trimmed(d) as log:
        oldest = log.oldest_csn
        srv = serve(log, settings=SLOW_STORE)
        try:
            # from the oldest retained: its mark is the csn before it, stored by the time the stream answers
            held = Held(srv.address, pb.SubscribeStart(name="fresh"))
            assert held.subscribed().after_csn == oldest - 1
            assert SubscriptionStore(d).get("fresh") == oldest - 1
            held.close()
            # an explicit start: that csn
            held = Held(srv.address, pb.SubscribeStart(name="later", after_csn=57))
            assert held.subscribed().after_csn == 57
            assert SubscriptionStore(d).get("later") == 57
            held.close()
            # an explicit 0 is the oldest retained, and says where that is
            held = Held(srv.address, pb.SubscribeStart(after_csn=0))
            assert held.subscribed().after_csn == oldest - 1
            held.close()
        finally:
            srv.stop()


def test_a_reconnect_before_the_first_ack_resumes_where_the_stream_started(tmp_path: Path) -> None:
    d = str(tmp_path / "log")
    with _trimmed(d) as log:
        oldest = log.oldest_csn
        srv = serve(log, settings=SLOW_STORE)
        try:
            with Changefeed(srv.address, name="billing") as feed:
                assert feed.next(timeout=30) is not None  # (read, never acknowledged)
            with Changefeed(srv.address, name="billing") as feed:
                got = feed.next(timeout=30)
                assert got is not None and got[0] == oldest
            # still unacknowledged, and now retention drops what it never read: told, not moved
            fill(log, range(61, 121))
            assert log.apply_retention() > 0 and log.oldest_csn > oldest
            e = Held(srv.address, pb.SubscribeStart(name="billing")).error()
            assert e.code() == grpc.StatusCode.OUT_OF_RANGE
            assert f"subscription 'billing' is at csn {oldest - 1}" in e.details()
            assert f"the oldest retained csn is {log.oldest_csn}" in e.details()
        finally:
            srv.stop()


def test_a_mark_retention_passed_is_out_of_range_even_at_0(tmp_path: Path) -> None:
    """A name stored at csn 0 (before anything was dropped) must not resume silently at the oldest retained."""
    d = str(tmp_path / "log")
    SubscriptionStore(d).set("early", 0)
    with _trimmed(d) as log:
        oldest = log.oldest_csn
        srv = serve(log, settings=SLOW_STORE)
        try:
            e = Held(srv.address, pb.SubscribeStart(name="early")).error()
            assert e.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "subscription 'early'" in e.details() and "csn 0" in e.details()
            assert f"the oldest retained csn is {oldest}" in e.details()
            with pytest.raises(CsnOutOfRange, match="subscription 'early'"):
                Changefeed(srv.address, name="early").next(timeout=30)
            assert SubscriptionStore(d).get("early") == 0  # (never moved)
        finally:
            srv.stop()


def test_a_reset_to_0_stores_where_the_oldest_retained_starts(tmp_path: Path) -> None:
    d = str(tmp_path / "log")
    SubscriptionStore(d).set("billing", 55)
    with _trimmed(d) as log:
        oldest = log.oldest_csn
        srv = serve(log, settings=SLOW_STORE)
        try:
            with grpc.insecure_channel(srv.address) as channel:
                info = pb_grpc.ChangefeedStub(channel).ResetSubscription(
                    pb.ResetSubscriptionRequest(name="billing", csn=0)
                )
            assert (info.acknowledged_csn, info.previous_csn) == (oldest - 1, 55)
            assert SubscriptionStore(d).get("billing") == oldest - 1
        finally:
            srv.stop()


def test_a_named_mark_holds_retention_up_to_the_hold_limit_then_is_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = str(tmp_path / "log")
    with Changelog(d, segment_bytes=4096, retention_bytes=8192, retention_hold_bytes=100_000) as log:
        written = fill(log, range(1, 21))
        srv = serve(log, settings=SLOW_STORE)
        try:
            for start in (pb.SubscribeStart(name="billing", after_csn=10), pb.SubscribeStart(after_csn=15)):
                held_call = Held(srv.address, start)  # (billing: mark 10, stored; anonymous: holds nothing)
                assert held_call.subscribed().after_csn == start.after_csn
                held_call.close()
            more = fill(log, range(21, 101))
            assert log.size_bytes > 8192
            log.apply_retention()
            assert log.oldest_after_csn <= 10 < log.oldest_csn + 4  # (kept from the segment holding 11)
            held = log.retention_held["subscription 'billing'"]
            assert 0 < held <= log.size_bytes - 8192 + 4096
            holds = srv.servicer.feed_status().changelog.holds
            assert [(h.holder, h.held_bytes) for h in holds] == [("subscription 'billing'", held)]
            with Changefeed(srv.address, name="billing") as feed:
                got = [feed.next(timeout=30) for _ in range(90)]
            assert got == [(c, {**written, **more}[c]) for c in range(11, 101)]
            # past the hold limit the records go, with a warning, and the consumer is told
            fill(log, range(101, 301))
            assert log.size_bytes > 100_000
            log.apply_retention()
            assert log.size_bytes <= 100_000 and log.oldest_after_csn > 10
            assert "subscription 'billing' had not read (it is at csn 10)" in caplog.text
            e = Held(srv.address, pb.SubscribeStart(name="billing")).error()
            assert e.code() == grpc.StatusCode.OUT_OF_RANGE
            assert "subscription 'billing' is at csn 10" in e.details()
            assert f"the oldest retained csn is {log.oldest_csn}" in e.details()
            assert SubscriptionStore(d).get("billing") == 10  # (never moved)
        finally:
            srv.stop()
        # with the service gone, no one holds: retention is back to its own limit
        log.apply_retention()
        assert log.size_bytes <= 8192 + 4096 and not log.retention_held


def test_the_parquet_exports_unexported_range_holds_retention(tmp_path: Path) -> None:
    with Changelog(
        str(tmp_path / "log"), segment_bytes=4000, retention_bytes=12_000, retention_hold_bytes=200_000
    ) as log:
        fill(log, range(1, 31))
        export = ParquetExport(log, str(tmp_path / "pq"), file_rows=20)  # (not started: exported nothing)
        fill(log, range(31, 101))
        log.apply_retention()
        assert log.oldest_after_csn == 0 and log.retention_held[export.holder] > 0
        export.stop()  # (stopped: it holds no more)
        assert log.apply_retention() > 0 and log.oldest_csn > 1
