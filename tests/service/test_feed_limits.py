"""The changefeed's limits: streams bounded apart from unary calls and health, per host too.

Through a real gRPC server on port 0; the streams are held open by clients
that send their start and then nothing, as a quiet subscriber does.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from csnd.changelog import Changelog
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service.limits import StreamLimits, StreamSlots, peer_host
from tests.service.feedkit import FAST, fill, serve, wait_for


@pytest.fixture
def log(tmp_path: object) -> Iterator[Changelog]:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        fill(log, range(1, 4))
        yield log


class HeldStreams:
    """Subscribe streams that stay open (each has said where it starts, and waits) until closed."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.ChangefeedStub(self.channel)
        self.calls: list[tuple[grpc.Future, queue.Queue[object]]] = []

    def open(self) -> grpc.RpcError | None:
        """One more stream; None once the server has answered it, else the error it ended with."""
        requests: queue.Queue[object] = queue.Queue()
        requests.put(pb.SubscribeRequest(start=pb.SubscribeStart()))
        call = self.stub.Subscribe(iter(requests.get, None), timeout=120)
        try:
            first = next(call)
        except grpc.RpcError as e:
            return e
        assert first.HasField("subscribed")
        self.calls.append((call, requests))
        return None

    def close_one(self) -> None:
        call, requests = self.calls.pop()
        requests.put(None)  # (half-close: the server ends the stream)
        call.cancel()

    def close(self) -> None:
        while self.calls:
            self.close_one()
        self.channel.close()


def unary_calls_answer(address: str) -> None:
    with grpc.insecure_channel(address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        assert (
            health.Check(health_pb2.HealthCheckRequest(), timeout=30).status
            == health_pb2.HealthCheckResponse.SERVING
        )
        stub = pb_grpc.ChangefeedStub(ch)
        assert stub.Status(pb.StatusRequest(), timeout=30).changelog.newest_csn == 3
        stub.ListSubscriptions(pb.ListSubscriptionsRequest(), timeout=30)


def test_64_subscribers_leave_status_and_health_answering(log: Changelog) -> None:
    """Today streams and unary calls share 64 threads: the 64th subscriber starves Status and health."""
    srv = serve(log, settings=FAST)
    held = HeldStreams(srv.address)
    try:
        for _ in range(64):
            assert held.open() is None
        unary_calls_answer(srv.address)
        assert srv.streams.in_use == 64
    finally:
        held.close()
        srv.stop()


def test_a_stream_past_the_bound_is_refused_while_unary_calls_answer(log: Changelog) -> None:
    srv = serve(log, settings=FAST, limits=StreamLimits(max_streams=3, max_per_peer=3))
    held = HeldStreams(srv.address)
    try:
        for _ in range(3):
            assert held.open() is None
        for _ in range(3):  # (refused again and again: no slot leaks from a refusal)
            refused = held.open()
            assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "serving 3 streams, the most it serves at once (--max-streams 3)" in str(refused.details())
            with pytest.raises(grpc.RpcError) as rpc:
                list(held.stub.Fetch(pb.FetchRequest(), timeout=30))
            assert rpc.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        unary_calls_answer(srv.address)
        # a stream that ends gives its slot back
        held.close_one()
        wait_for(lambda: srv.streams.in_use == 2, "the slot given back")
        assert held.open() is None
        assert srv.streams.refused == 6 and srv.streams.peak == 3
    finally:
        held.close()
        wait_for(lambda: srv.streams.in_use == 0, "every slot given back")
        srv.stop()


def test_one_host_holds_at_most_its_share(log: Changelog) -> None:
    srv = serve(log, settings=FAST, limits=StreamLimits(max_streams=10, max_per_peer=2))
    held = HeldStreams(srv.address)
    try:
        assert held.open() is None and held.open() is None
        refused = held.open()
        assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "127.0.0.1 holds 2 streams, the most one host may (--max-streams-per-peer 2)" in str(
            refused.details()
        )
        unary_calls_answer(srv.address)
    finally:
        held.close()
        srv.stop()


def test_peer_hosts() -> None:
    assert peer_host("ipv4:127.0.0.1:53412") == "127.0.0.1"
    assert peer_host("ipv6:[::1]:53412") == "[::1]"
    assert peer_host("unix:/run/csnd.sock") == "/run/csnd.sock"
    assert peer_host("odd") == "odd"


class SlotsMachine(RuleBasedStateMachine):
    """StreamSlots against a list of the streams held (the oracle), from several threads' worth of calls."""

    def __init__(self) -> None:
        super().__init__()
        self.slots = StreamSlots(StreamLimits(max_streams=5, max_per_peer=3))
        self.held: list[str] = []
        self.refusals = 0

    @rule(host=st.sampled_from(["a", "b", "c"]))
    def take(self, host: str) -> None:
        why = self.slots.take(host)
        fits = len(self.held) < 5 and self.held.count(host) < 3
        assert (why is None) == fits, why
        if fits:
            self.held.append(host)
        else:
            self.refusals += 1

    @rule(data=st.data())
    def give_back(self, data: st.DataObject) -> None:
        if self.held:
            host = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
            self.slots.give_back(host)

    @invariant()
    def agrees(self) -> None:
        self.slots._check()
        assert self.slots.in_use == len(self.held) and self.slots.refused == self.refusals
        for host in "abc":
            assert self.slots.held_by(host) == self.held.count(host)


test_slots = SlotsMachine.TestCase
test_slots.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_slots_hold_under_threads() -> None:
    slots = StreamSlots(StreamLimits(max_streams=8, max_per_peer=8))
    taken: list[int] = []

    def worker() -> None:
        n = 0
        for _ in range(2000):
            if slots.take("h") is None:
                n += 1
                slots.give_back("h")
        taken.append(n)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slots._check()
    assert slots.in_use == 0 and slots.peak <= 8 and sum(taken) + slots.refused == 16 * 2000
