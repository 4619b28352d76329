"""The Changefeed over a real changelog, through a real gRPC server on port 0 (nothing mocked)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from csnd.changelog import Changelog, SubscriptionStore
from csnd.consumers.client import Changefeed, fetch
from csnd.core.errors import ChangefeedError, ChangefeedRejected, ChangefeedUnauthenticated, CsnOutOfRange
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service import FeedSettings, NodesOnly, NodeState, TlsFiles, start_changefeed
from tests.service.feedkit import FAST, fill, line, serve, wait_for


@pytest.fixture
def log(tmp_path: object) -> Iterator[Changelog]:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        yield log


def drain(feed: Changefeed, n: int, timeout: float = 60.0) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for _ in range(n):
        rec = feed.next(timeout=timeout)
        assert rec is not None, f"only {len(out)} of {n} transactions arrived"
        out.append(rec)
    return out


def kept(raw: bytes, tables: set[tuple[str, str]]) -> bytes | None:
    """The filter's oracle: parse, keep, dump (the format is json.dumps's)."""
    obj = json.loads(raw)
    changes = [c for c in obj["changes"] if (c["schema"], c["table"]) in tables]
    return json.dumps({**obj, "changes": changes}, ensure_ascii=False).encode() if changes else None


def test_subscribe_from_zero_then_tail(log: Changelog) -> None:
    written = fill(log, range(10, 210, 2))
    srv = serve(log)
    try:
        with Changefeed(srv.address) as feed:
            assert drain(feed, 100) == sorted(written.items())
            assert feed.next(timeout=0.3) is None  # (nothing invented at the durable end)
            more = fill(log, [500, 501])  # tailing: new durable transactions arrive
            assert drain(feed, 2) == sorted(more.items())
    finally:
        srv.stop()


def test_subscribe_from_the_middle_and_past_the_end(log: Changelog) -> None:
    written = fill(log, range(1, 51))
    srv = serve(log)
    try:
        with Changefeed(f"grpc://{srv.address}", after_csn=30) as feed:
            assert drain(feed, 20) == [(c, written[c]) for c in range(31, 51)]
        with Changefeed(srv.address, after_csn=10_000) as feed:
            assert feed.next(timeout=0.3) is None
            fill(log, [10_001])
            assert drain(feed, 1)[0][0] == 10_001
    finally:
        srv.stop()


def test_table_filters(log: Changelog) -> None:
    written = fill(log, range(1, 41))
    # csn 41 touches only sales.acct: with the filter below, every change is filtered out
    log.append(41, line(41, [("sales", "acct"), ("sales", "acct")]))
    log.append(42, line(42, [("public", "orders"), ("sales", "acct"), ("odd", "a.b")]))
    log.sync()
    written[41] = line(41, [("sales", "acct"), ("sales", "acct")])
    written[42] = line(42, [("public", "orders"), ("sales", "acct"), ("odd", "a.b")])
    want = {("public", "acct"), ("odd", "a.b")}
    expect = [(c, k) for c, raw in sorted(written.items()) if (k := kept(raw, want)) is not None]
    assert 41 not in [c for c, _ in expect] and 0 < len(expect) < len(written)
    srv = serve(log)
    try:
        with Changefeed(srv.address, tables=["public.acct", 'odd."a.b"']) as feed:
            got = drain(feed, len(expect))
            assert got == expect
            assert feed.next(timeout=0.3) is None
        # csn, gid, commit_time and nodes are kept as they were
        head = json.loads(got[-1][1])
        assert (head["csn"] == 42 and head["gid"] == "g-42") or head["gid"] is None
        assert [c["table"] for c in head["changes"]] == ["a.b"]
        assert list(fetch(srv.address, 0, 0, tables=["public.acct", 'odd."a.b"'])) == expect
    finally:
        srv.stop()


def test_fetch_ranges(log: Changelog) -> None:
    written = fill(log, range(1, 101))
    srv = serve(log, settings=FeedSettings(max_batch_bytes=2000))  # (many small batches)
    try:
        assert list(fetch(srv.address, 20, 30)) == [(c, written[c]) for c in range(21, 31)]
        assert list(fetch(srv.address)) == sorted(written.items())
        assert list(fetch(srv.address, 95)) == [(c, written[c]) for c in range(96, 101)]
        assert list(fetch(srv.address, 100, 200)) == []
        with pytest.raises(ChangefeedRejected, match="until_csn 5 is before after_csn 9"):
            list(fetch(srv.address, 9, 5))
    finally:
        srv.stop()


def test_named_subscription_resumes_after_its_ack_across_a_restart(tmp_path: object) -> None:
    d = os.path.join(str(tmp_path), "log")
    log = Changelog(d)
    written = fill(log, range(1, 31))
    srv = serve(log, settings=FAST)
    with Changefeed(srv.address, name="billing") as feed:
        got = drain(feed, 12)
        feed.ack(got[-1][0])
        feed.ack(5)  # (an older acknowledgement never moves the mark back)
    status = srv.servicer.feed_status()
    assert [(c.name, c.acknowledged_csn, c.lag_transactions, c.connected) for c in status.consumers] == [
        ("billing", 12, 18, False)
    ]
    srv.stop()
    log.close()
    assert SubscriptionStore(d).get("billing") == 12

    log = Changelog(d)
    srv = serve(log, settings=FAST)
    try:
        with Changefeed(srv.address, name="billing") as feed:
            assert drain(feed, 18) == [(c, written[c]) for c in range(13, 31)]
            status = srv.servicer.feed_status()
            (c,) = status.consumers
            assert (c.name, c.acknowledged_csn, c.sent_csn, c.connected) == ("billing", 12, 30, True)
            assert c.peer.startswith("ipv4:127.0.0.1:")
            feed.ack(30)
            wait_for(lambda: srv.servicer.feed_status().consumers[0].acknowledged_csn == 30, "the ack")
        # an explicit start overrides the stored mark (and does not move it)
        with Changefeed(srv.address, name="billing", after_csn=25) as feed:
            assert drain(feed, 5)[0][0] == 26
        assert SubscriptionStore(d).get("billing") == 30
    finally:
        srv.stop()
        log.close()


def test_a_stream_the_client_half_closes_ends_without_waiting_for_news(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Spark source's commit acknowledges and half-closes, then waits for the stream's end
    (the mark is stored by then): it must not wait out the stream's idle wait for new records."""
    from csnd.consumers.spark import feed as spark_feed
    from csnd.consumers.spark.options import parse_options
    from csnd.service import feed_subscribe

    monkeypatch.setattr(feed_subscribe, "WAIT_S", 3600.0)
    d = os.path.join(str(tmp_path), "log")
    log = Changelog(d)
    fill(log, range(1, 11))
    srv = serve(log, settings=FeedSettings(keepalive_s=3600.0, client_timeout_s=7200.0))
    try:
        opts = parse_options({"target": srv.address}, stream=True)
        done = threading.Thread(target=spark_feed.acknowledge, args=(opts, "spark-q", 10), daemon=True)
        done.start()
        done.join(120.0)  # (a bound on a hang, not a timing: without the wake-up this is an hour)
        assert not done.is_alive(), "the acknowledgement waited for the stream's idle wait"
        assert SubscriptionStore(d).get("spark-q") == 10
    finally:
        srv.stop()
        log.close()


def test_a_name_taken_over_ends_the_older_stream(log: Changelog) -> None:
    fill(log, range(1, 5))
    srv = serve(log, settings=FAST)
    try:
        old = Changefeed(srv.address, name="etl")
        drain(old, 4)
        with Changefeed(srv.address, name="etl") as new:
            drain(new, 4)
            with pytest.raises(ChangefeedError, match="took this subscription name over"):
                old.next(timeout=30)
    finally:
        srv.stop()


class Silent:
    """A raw Subscribe call that sends its start and then nothing (no keepalive replies)."""

    def __init__(self, address: str, start: pb.SubscribeStart, metadata: tuple[tuple[str, str], ...] = ()):
        self.release = threading.Event()
        self.channel = grpc.insecure_channel(address)
        stub = pb_grpc.ChangefeedStub(self.channel)
        self.call = stub.Subscribe(self._requests(start), metadata=metadata)

    def _requests(self, start: pb.SubscribeStart) -> Iterator[pb.SubscribeRequest]:
        yield pb.SubscribeRequest(start=start)
        self.release.wait()

    def error(self) -> grpc.RpcError:
        try:
            for _ in self.call:
                pass
        except grpc.RpcError as e:
            return e
        finally:
            self.release.set()
            self.channel.close()
        raise AssertionError("the stream ended without an error")


def test_keepalive_timeout_drops_a_silent_client(log: Changelog) -> None:
    fill(log, range(1, 4))
    srv = serve(log, settings=FeedSettings(keepalive_s=0.1, client_timeout_s=1.0))
    try:
        silent = Silent(srv.address, pb.SubscribeStart())
        wait_for(lambda: srv.servicer.feed_status().consumers, "the silent consumer to be registered")
        e = silent.error()
        assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert "no reply to keepalives for 1 s" in e.details()
        wait_for(lambda: not srv.servicer.feed_status().consumers, "the consumer to be forgotten")
        # a client that answers is not dropped, however long it is idle
        with Changefeed(srv.address) as feed:
            drain(feed, 3)
            assert feed.next(timeout=3.0) is None
            fill(log, [4])
            assert drain(feed, 1)[0][0] == 4
            assert feed.reconnects == 0
    finally:
        srv.stop()


def test_out_of_range_after_retention(tmp_path: object) -> None:
    d = os.path.join(str(tmp_path), "log")
    with Changelog(d, segment_bytes=4096, retention_bytes=8192) as log:
        written = fill(log, range(1, 61))
        assert log.apply_retention() > 0
        oldest = log.oldest_csn
        assert oldest > 2
        srv = serve(log)
        try:
            with pytest.raises(CsnOutOfRange, match=f"the oldest retained csn is {oldest}"):
                Changefeed(srv.address, after_csn=1).next(timeout=30)
            with pytest.raises(CsnOutOfRange, match="dropped by retention"):
                list(fetch(srv.address, 1, 50))
            e = Silent(srv.address, pb.SubscribeStart(after_csn=1)).error()
            assert e.code() == grpc.StatusCode.OUT_OF_RANGE
            # 0 means the oldest retained; the csn just before it is fine too
            with Changefeed(srv.address, after_csn=0) as feed:
                assert drain(feed, 60 - oldest + 1) == [(c, written[c]) for c in range(oldest, 61)]
            with Changefeed(srv.address, after_csn=oldest - 1) as feed:
                assert drain(feed, 1)[0][0] == oldest
        finally:
            srv.stop()


@pytest.mark.parametrize("bad", ["acct", "public.", "a.b.c", ""])
def test_malformed_filter_is_invalid_argument(log: Changelog, bad: str) -> None:
    srv = serve(log)
    try:
        e = Silent(srv.address, pb.SubscribeStart(tables=["public.acct", bad])).error()
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"table filter {bad!r} is not SCHEMA.TABLE" in e.details()
        with pytest.raises(ChangefeedRejected, match=r"is not SCHEMA\.TABLE"):
            Changefeed(srv.address, tables=[bad]).next(timeout=30)
        with pytest.raises(ChangefeedRejected, match=r"is not SCHEMA\.TABLE"):
            list(fetch(srv.address, tables=[bad]))
        with pytest.raises(ChangefeedRejected, match="subscription name"):
            Changefeed(srv.address, name="no spaces").next(timeout=30)
    finally:
        srv.stop()


def test_an_ack_of_what_was_never_sent_is_invalid(log: Changelog) -> None:
    fill(log, range(1, 4))
    srv = serve(log)
    try:
        feed = Changefeed(srv.address)
        drain(feed, 3)
        feed.ack(99)
        with pytest.raises(
            ChangefeedRejected, match="acknowledged csn 99, but the newest transaction sent is csn 3"
        ):
            feed.next(timeout=30)
    finally:
        srv.stop()


def test_bearer_token(log: Changelog) -> None:
    fill(log, range(1, 4))
    srv = serve(log, token="s3cret")
    try:
        for token in (None, "wrong"):
            with pytest.raises(ChangefeedUnauthenticated, match="refused us") as info:
                Changefeed(srv.address, token=token).next(timeout=30)
            assert ("needs a token" if token is None else "was not accepted") in str(info.value)
            with pytest.raises(ChangefeedUnauthenticated):
                list(fetch(srv.address, token=token))
        with grpc.insecure_channel(srv.address) as ch:
            for call in (
                lambda md: pb_grpc.ChangefeedStub(ch).Status(pb.StatusRequest(), metadata=md),
                lambda md: _reflected_services(ch, md),
            ):
                with pytest.raises(grpc.RpcError) as rpc:
                    call(())
                assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
                call((("authorization", "Bearer s3cret"),))
        with Changefeed(srv.address, token="s3cret") as feed:
            assert [c for c, _ in drain(feed, 3)] == [1, 2, 3]
        assert [c for c, _ in fetch(srv.address, token="s3cret")] == [1, 2, 3]
    finally:
        srv.stop()


def _reflected_services(channel: grpc.Channel, metadata: Sequence[tuple[str, str]]) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=30
    )
    return {s.name for a in answers for s in a.list_services_response.service}


@pytest.mark.parametrize("needs_token", [False, True])
def test_health_is_open_to_probes_without_the_token_unless_told(log: Changelog, needs_token: bool) -> None:
    """A Kubernetes gRPC probe or grpc_health_probe sends no token: health answers it; nothing else does."""
    fill(log, range(1, 4))
    srv = serve(log, token="s3cret", **({"health_needs_token": True} if needs_token else {}))
    try:
        with grpc.insecure_channel(srv.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for service in ("", "csnd.v1.Changefeed"):
                request = health_pb2.HealthCheckRequest(service=service)
                if needs_token:
                    with pytest.raises(grpc.RpcError) as rpc:
                        health.Check(request, timeout=30)
                    assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    with pytest.raises(grpc.RpcError) as rpc:
                        next(health.Watch(request, timeout=30))
                    assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
                else:
                    assert health.Check(request, timeout=30).status == health_pb2.HealthCheckResponse.SERVING
                    watch = health.Watch(request, timeout=30)
                    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
                    watch.cancel()
            md = (("authorization", "Bearer s3cret"),)
            assert health.Check(health_pb2.HealthCheckRequest(), metadata=md, timeout=30).status == (
                health_pb2.HealthCheckResponse.SERVING
            )
            # reflection describes the API: it keeps needing the token, as every other call does
            for call in (
                lambda md: _reflected_services(ch, md),
                lambda md: pb_grpc.ChangefeedStub(ch).Status(pb.StatusRequest(), metadata=md, timeout=30),
            ):
                with pytest.raises(grpc.RpcError) as rpc:
                    call(())
                assert rpc.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "csnd.v1.Changefeed" in _reflected_services(ch, md)
        with pytest.raises(ChangefeedUnauthenticated, match="needs a token"):
            Changefeed(srv.address).next(timeout=30)
    finally:
        srv.stop()


def test_tls_with_a_self_signed_certificate(log: Changelog, tmp_path: object) -> None:
    cert, key = os.path.join(str(tmp_path), "cert.pem"), os.path.join(str(tmp_path), "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )  # fmt: skip
    written = fill(log, range(1, 6))
    srv = serve(log, tls=TlsFiles(cert=cert, key=key), token="t")
    try:
        with Changefeed(srv.address, tls_ca=cert, token="t") as feed:
            assert drain(feed, 5) == sorted(written.items())
        assert list(fetch(srv.address, 2, 3, tls_ca=cert, token="t")) == [(3, written[3])]
        # without TLS the server does not answer a plaintext client
        with pytest.raises(ChangefeedError):
            Changefeed(srv.address, token="t", connect_timeout=1.0).next(timeout=30)
    finally:
        srv.stop()


def test_health_reflection_and_status(log: Changelog) -> None:
    fill(log, range(1, 11))
    nodes = [NodeState("dn1", "gtm", "streaming", received_lsn=0x16B3748, watermark_csn=10, stuck=True)]
    srv = start_changefeed(log, status=NodesOnly(nodes))  # (no SubscriptionStore: names are refused)
    try:
        with grpc.insecure_channel(srv.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for service in ("", "csnd.v1.Changefeed"):
                got = health.Check(health_pb2.HealthCheckRequest(service=service))
                assert got.status == health_pb2.HealthCheckResponse.SERVING
            services = ProtoReflectionDescriptorDatabase(ch).get_services()
            assert "csnd.v1.Changefeed" in services and "grpc.health.v1.Health" in services
            with Changefeed(srv.address, after_csn=4) as feed:
                drain(feed, 6)
                feed.ack(7)
                wait_for(
                    lambda: [c.acknowledged_csn for c in srv.servicer.feed_status().consumers] == [7],
                    "the ack",
                )
                status = pb_grpc.ChangefeedStub(ch).Status(pb.StatusRequest())
        (node,) = status.nodes
        assert (node.name, node.mode, node.state, node.received_lsn, node.stuck) == (
            "dn1", "gtm", "streaming", 0x16B3748, True
        )  # fmt: skip
        cl = status.changelog
        assert (cl.oldest_csn, cl.newest_csn, cl.segments) == (1, 10, 1) and cl.bytes > 0
        assert cl.directory == log.directory
        (c,) = status.consumers
        assert (c.name, c.acknowledged_csn, c.sent_csn, c.lag_transactions, c.transactions_sent) == (
            "",
            7,
            10,
            3,
            6,
        )
        with pytest.raises(ChangefeedRejected, match="keeps no named subscriptions"):
            Changefeed(srv.address, name="x").next(timeout=30)
    finally:
        srv.stop()


def test_client_reconnects_without_gap_or_duplicate(tmp_path: object) -> None:
    """The server stopped and started again mid-stream, several times: the client notices nothing."""
    d = os.path.join(str(tmp_path), "log")
    log = Changelog(d)
    written = fill(log, range(1, 5001))
    settings = FeedSettings(max_batch_bytes=4000, keepalive_s=0.2, client_timeout_s=5.0)
    srv = serve(log, settings=settings)
    port = srv.port
    feed = Changefeed(srv.address, give_up=60)
    got = drain(feed, 300)
    for round_ in range(3):
        # Read on until the client is subscribed here (it may still be reading what it
        # buffered before the last restart): then the stop below cuts a live stream.
        deadline = time.monotonic() + 60
        while not srv.servicer.feed_status().consumers:
            assert time.monotonic() < deadline, "the client did not subscribe to the restarted server"
            if (rec := feed.next(timeout=0.05)) is not None:
                got.append(rec)
        srv.stop(grace=0.5)
        srv = serve(log, settings=settings, listen=f"127.0.0.1:{port}")
        fill(log, range(5001 + 10 * round_, 5011 + 10 * round_))
    try:
        while got[-1][0] < 5030:  # (the newest transaction)
            rec = feed.next(timeout=60)
            assert rec is not None, f"nothing after csn {got[-1][0]}"
            got.append(rec)
        assert feed.next(timeout=0.2) is None
        assert feed.reconnects >= 3
    finally:
        feed.close()
        srv.stop()
        log.close()
    with Changelog(d) as again:
        assert got == list(again.read(0))
    assert len(got) == 5030 and [c for c, _ in got] == sorted({c for c, _ in got})
    assert all(written[c] == raw for c, raw in got if c in written)


def test_a_client_that_stops_reading_is_dropped(log: Changelog) -> None:
    """A client that reads nothing leaves the handler blocked in flow control; the watchdog frees it."""
    big = b"x" * 60_000
    for csn in range(1, 501):  # 30 MB: far more than gRPC buffers for a reader that does not read
        log.append(csn, line(csn, [("public", "acct")])[:-2] + b', "pad": "' + big + b'"}')
    log.sync()
    srv = serve(log, settings=FeedSettings(keepalive_s=0.1, client_timeout_s=1.0))
    try:
        silent = Silent(srv.address, pb.SubscribeStart())
        wait_for(lambda: srv.servicer.feed_status().consumers, "the consumer to be registered")
        wait_for(lambda: not srv.servicer.feed_status().consumers, "the stuck consumer to be dropped")
        assert silent.error().code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    finally:
        srv.stop()


def test_stop_ends_streams_cleanly(log: Changelog) -> None:
    fill(log, range(1, 4))
    srv = serve(log)
    with grpc.insecure_channel(srv.address) as ch:
        release = threading.Event()

        def requests() -> Iterator[pb.SubscribeRequest]:
            yield pb.SubscribeRequest(start=pb.SubscribeStart())
            release.wait()

        call = pb_grpc.ChangefeedStub(ch).Subscribe(requests())
        got = []
        first = next(call)
        assert first.subscribed.newest_csn == 3
        stopper = threading.Thread(target=srv.stop)
        for msg in call:  # ends without an error once the server stops
            if msg.HasField("batch"):
                got += [t.csn for t in msg.batch.transactions]
                stopper.start()
        release.set()
        stopper.join()
        assert got == [1, 2, 3] and call.code() == grpc.StatusCode.OK


def test_a_record_that_is_not_a_transaction_is_data_loss(log: Changelog) -> None:
    fill(log, range(1, 3))
    log.append(3, b'{"csn": 3, "changes": [{"schema": "public", "table": "acct"}')  # (cut short)
    log.sync()
    srv = serve(log)
    try:
        feed = Changefeed(srv.address, tables=["public.acct"])
        with pytest.raises(ChangefeedError, match="record of csn 3 is not a transaction line"):
            feed.next(timeout=30)
            feed.next(timeout=30)
        with pytest.raises(ChangefeedError, match="record of csn 3 is not a transaction line"):
            list(fetch(srv.address, tables=["public.acct"]))
        assert [c for c, _ in fetch(srv.address)] == [1, 2, 3]  # (unfiltered, it is passed on as stored)
    finally:
        srv.stop()


def test_close_leaves_no_response_thread_inside_grpc(tmp_path: object) -> None:
    """A response thread alive at interpreter exit can hang it (`csnd subscribe --limit N` never exited)."""
    d = os.path.join(str(tmp_path), "log")
    with Changelog(d) as log:
        written = fill(log, range(1, 2001))
        settings = FeedSettings(max_batch_bytes=4000)
        srv = serve(log, settings=settings)
        port = srv.port
        feed = Changefeed(srv.address, give_up=60)
        try:
            assert drain(feed, 10) == [(c, written[c]) for c in range(1, 11)]
            srv.stop(grace=0)  # (a stream lost: its thread is left behind by the reconnect)
            srv = serve(log, settings=settings, listen=f"127.0.0.1:{port}")
            assert drain(feed, 20)[-1][0] > 20
        finally:
            feed.close()
            srv.stop()
    alive = [t for t in threading.enumerate() if t.name == "csnd-feed-responses"]
    assert alive == []
