"""A fuzzer over the changefeed's gRPC surface: every method, random and mutated messages.

What a stranger, a buggy client or a client of another version can send
must end in a clear status: the call finishes (never a hang: every call
here has a deadline, and running into it is a failure), with a status
that says what was wrong -- never UNKNOWN, which is what grpc answers for
an exception a handler let escape.  Afterwards the service still answers
health and Status, and has not kept a thread per bad call.

Messages are built from the service's own descriptors, so a field added
to csnd/proto/changefeed/v1/changefeed.proto is fuzzed without a change here: integers at their
edges (0, 1, 2**63, 2**64-1), strings that are empty, huge, not names at
all or thousands of table names, and, beside the well-formed messages,
their serialized bytes mutated (flipped, cut, doubled) and sent raw.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as pbd
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.gtm import generate_cluster
from csnd.proto.agent.v1 import agent_pb2 as agent_pb
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service import RunningServer
from csnd.service.server import MAX_WORKERS
from tests.runtime.test_agent import Agent
from tests.service.feedkit import FAST, fill, in_dir, open_log, serve

# Every call gets this long; a call still running then hangs, and fails the test.
CALL_DEADLINE_S = 20.0
# Statuses a refusal may carry: each names a cause the client can act on.
CLEAR = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.CANCELLED,  # (a stream this test cancels once it has seen enough)
}
# grpc's own answer to bytes that are not the request message: it never reaches
# a handler, and says what happened.
UNPARSABLE = "Exception deserializing request!"
# The name grpc's handler pool gives its threads (csnd.service.server).
POOL_PREFIX = "csnd-feed_"

SERVICE = pb.DESCRIPTOR.services_by_name["Changefeed"]
METHODS = list(SERVICE.methods)
AGENT_SERVICE = agent_pb.DESCRIPTOR.services_by_name["NodeAgent"]

_U64_EDGES = [0, 1, 2, 1000, 2**31 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
_I64_EDGES = [0, -1, 1, -(2**63), 2**63 - 1]
_NAMES = [
    "",
    "public.acct",
    "public.*",
    "*",
    '"odd"."a.b"',
    "no_such.table",
    ".",
    '"',
    "a" * 70_000,
    "\x00",
    "ü.ñ",
    "public.acct;drop table x",
]


def _scalar(field: pbd.FieldDescriptor) -> st.SearchStrategy[Any]:
    t = field.type
    if t in (pbd.FieldDescriptor.TYPE_UINT64, pbd.FieldDescriptor.TYPE_FIXED64):
        return st.sampled_from(_U64_EDGES) | st.integers(0, 2**64 - 1)
    if t in (pbd.FieldDescriptor.TYPE_UINT32, pbd.FieldDescriptor.TYPE_FIXED32):
        return st.sampled_from([0, 1, 2**31, 2**32 - 1]) | st.integers(0, 2**32 - 1)
    if t in (
        pbd.FieldDescriptor.TYPE_INT64,
        pbd.FieldDescriptor.TYPE_SINT64,
        pbd.FieldDescriptor.TYPE_SFIXED64,
    ):
        return st.sampled_from(_I64_EDGES) | st.integers(-(2**63), 2**63 - 1)
    if t in (
        pbd.FieldDescriptor.TYPE_INT32,
        pbd.FieldDescriptor.TYPE_SINT32,
        pbd.FieldDescriptor.TYPE_SFIXED32,
    ):
        return st.integers(-(2**31), 2**31 - 1)
    if t == pbd.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == pbd.FieldDescriptor.TYPE_STRING:
        return st.sampled_from(_NAMES) | st.text(max_size=40)
    if t == pbd.FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=200)
    if t == pbd.FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    raise AssertionError(f"no strategy for field type {t} of {field.full_name}")


@st.composite
def message(draw: st.DrawFn, desc: pbd.Descriptor, depth: int = 0) -> Message:
    """A message of type `desc` with a random subset of its fields set (a oneof: one member)."""
    from google.protobuf import message_factory

    msg = message_factory.GetMessageClass(desc)()
    oneof_done: set[str] = set()
    for field in desc.fields:
        if field.containing_oneof is not None:
            if field.containing_oneof.name in oneof_done or not draw(st.booleans()):
                continue
            oneof_done.add(field.containing_oneof.name)
        elif not draw(st.booleans()):
            continue
        repeated = field.is_repeated
        if field.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            if depth > 2:
                continue
            if repeated:
                for sub in draw(st.lists(message(field.message_type, depth + 1), max_size=3)):
                    getattr(msg, field.name).add().CopyFrom(sub)
            else:
                getattr(msg, field.name).CopyFrom(draw(message(field.message_type, depth + 1)))
        elif repeated:
            if field.type == pbd.FieldDescriptor.TYPE_STRING and draw(st.booleans()):
                # thousands of table names, most of them published nowhere
                n = draw(st.sampled_from([2000, 5000]))
                getattr(msg, field.name).extend(f"s{i % 7}.t{i}" for i in range(n))
            else:
                getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=4)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


@st.composite
def mutated(draw: st.DrawFn, desc: pbd.Descriptor) -> bytes:
    """A well-formed message's bytes, then flipped, cut or spliced: what a broken peer sends."""
    data = bytearray(draw(message(desc)).SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "cut", "double", "junk"]))
        if how == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut" and data:
            del data[draw(st.integers(0, len(data) - 1)) :]
        elif how == "double":
            data = data + data
        else:
            data += draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@pytest.fixture(scope="module")
def feed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = in_dir(tmp_path_factory.mktemp("fuzz"), "log")
    log = open_log(directory, segment_bytes=64 << 10)
    fill(log, range(1, 301))
    srv = serve(log, settings=FAST)
    try:
        yield srv
    finally:
        srv.stop(grace=1.0)
        log.close()


@pytest.fixture(scope="module")
def channel(feed: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(feed.address, options=[("grpc.max_receive_message_length", 256 << 20)]) as ch:
        yield ch


def _raw_call(channel: grpc.Channel, method: pbd.MethodDescriptor) -> Any:
    """The method as a callable taking and giving bytes, whatever its shape."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    kind = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }[(method.client_streaming, method.server_streaming)]
    return kind(path, request_serializer=None, response_deserializer=None)


def _finish(call: Any, streaming_out: bool) -> grpc.StatusCode:
    """Drains at most a few responses of a call, then cancels it; returns how it ended."""
    try:
        if not streaming_out:
            call.result() if hasattr(call, "result") else None
            return grpc.StatusCode.OK
        for i, _ in enumerate(call):
            if i >= 3:
                call.cancel()
                return grpc.StatusCode.CANCELLED
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
        if code == grpc.StatusCode.INTERNAL and UNPARSABLE in (e.details() or ""):
            return grpc.StatusCode.INVALID_ARGUMENT
        assert code in CLEAR, f"{code}: {e.details()}"
        return code


def _invoke(channel: grpc.Channel, method: pbd.MethodDescriptor, requests: list[bytes]) -> grpc.StatusCode:
    call = _raw_call(channel, method)
    if method.client_streaming:
        handle = call(iter(requests), timeout=CALL_DEADLINE_S) if method.server_streaming else None
        if handle is None:
            handle = call.future(iter(requests), timeout=CALL_DEADLINE_S)
    else:
        request = requests[0] if requests else b""
        handle = (
            call(request, timeout=CALL_DEADLINE_S)
            if method.server_streaming
            else call.future(request, timeout=CALL_DEADLINE_S)
        )
    return _finish(handle, method.server_streaming)


@st.composite
def call_of(draw: st.DrawFn, method: pbd.MethodDescriptor) -> list[bytes]:
    n = draw(st.integers(0, 4)) if method.client_streaming else 1
    out = []
    for _ in range(n):
        if draw(st.integers(0, 3)) == 0:
            out.append(draw(mutated(method.input_type)))
        else:
            out.append(draw(message(method.input_type)).SerializeToString())
    return out


FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def _healthy(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    got = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert got.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("method_name", [m.name for m in METHODS])
def test_every_method_answers_random_and_mutated_messages_with_a_clear_status(
    channel: grpc.Channel, method_name: str
) -> None:
    method = SERVICE.methods_by_name[method_name]

    @FUZZ
    @given(requests=call_of(method))
    def run(requests: list[bytes]) -> None:
        _invoke(channel, method, requests)

    run()
    _healthy(channel)


def test_concurrent_bad_calls_leave_the_service_answering_and_no_thread_behind(
    feed: RunningServer, channel: grpc.Channel
) -> None:
    """Many bad calls at once, from many threads: each ends clearly, none outlives its call."""
    stub_status = channel.unary_unary(f"/{SERVICE.full_name}/Status")
    before = _threads_outside_the_pool()
    bad = [
        ("Subscribe", [pb.SubscribeRequest(ack=pb.SubscribeAck(csn=5)).SerializeToString()]),
        ("Subscribe", [b"\xff\xff\xff\xff"]),
        ("Subscribe", []),
        ("Fetch", [pb.FetchRequest(after_csn=2**64 - 1).SerializeToString()]),
        ("Fetch", [pb.FetchRequest(after_csn=200, until_csn=100).SerializeToString()]),
        ("Fetch", [pb.FetchRequest(format="no-such-format").SerializeToString()]),
        ("ResetSubscription", [pb.ResetSubscriptionRequest(name="\x00" * 1000).SerializeToString()]),
        ("DeleteSubscription", [b"\x0a\xff\xff\xff\xff\x0f"]),
        ("StartSnapshot", [pb.StartSnapshotRequest(tables=["x.y"] * 3000).SerializeToString()]),
    ]
    failures: list[str] = []

    def worker(name: str, requests: list[bytes]) -> None:
        try:
            for _ in range(5):
                _invoke(channel, SERVICE.methods_by_name[name], requests)
        except BaseException as e:  # (reported below, on the test's thread)
            failures.append(f"{name}: {e!r}")

    def round_of_bad_calls() -> None:
        threads = [threading.Thread(target=worker, args=b) for b in bad * 4]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=4 * CALL_DEADLINE_S)
            assert not t.is_alive(), "a bad call hung"
        assert not failures, failures

    for _ in range(4):
        round_of_bad_calls()
    assert stub_status(pb.StatusRequest().SerializeToString(), timeout=10)
    _healthy(channel)
    # The handler threads are grpc's pool, bounded and reused; any other thread
    # the service started for a call must have ended with it.
    assert _threads_outside_the_pool() == before
    assert sum(t.name.startswith(POOL_PREFIX) for t in threading.enumerate()) <= MAX_WORKERS


def _threads_outside_the_pool() -> collections.Counter[str]:
    """The service's own threads beside its handler pool, by name.

    Every thread csnd starts is named `csnd-...`; the unnamed `Thread-N (target)` ones belong to
    other tests' helpers in the same pytest worker (a pipe reader, a writer) and come and go on
    their own, so they are not counted.
    """
    return collections.Counter(
        t.name.rstrip("0123456789_")
        for t in threading.enumerate()
        if t.name.startswith("csnd") and not t.name.startswith(POOL_PREFIX)
    )


# -- the node agent ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    d = tmp_path_factory.mktemp("fuzz-agent")
    generate_cluster(str(d), 1, 200, seed=3, binary=True)
    running = Agent(str(d / "dn1.pgstream"), extra=("--token-file", _token_file(d)))
    try:
        yield running
    finally:
        running.stop()


def _token_file(d: Path) -> str:
    (d / "token").write_text(AGENT_TOKEN + "\n", encoding="utf-8")
    return str(d / "token")


AGENT_TOKEN = "fuzz-agent-token"


def _threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


class _WithToken(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Adds the agent's token to every call: the fuzzing then reaches the handlers, not only the guard."""

    def _add(self, details: Any) -> Any:
        return details._replace(
            metadata=[*(details.metadata or ()), ("authorization", f"Bearer {AGENT_TOKEN}")]
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._add(details), request)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._add(details), requests)


@pytest.mark.parametrize("with_token", [False, True])
@pytest.mark.parametrize("method_name", [m.name for m in AGENT_SERVICE.methods])
def test_every_agent_method_answers_random_and_mutated_messages_with_a_clear_status(
    agent: Agent, method_name: str, with_token: bool
) -> None:
    """Strangers (no token) and a coordinator gone wrong (the token, any message): a clear end, the agent up."""
    method = AGENT_SERVICE.methods_by_name[method_name]
    with grpc.insecure_channel(f"127.0.0.1:{agent.port}") as plain:
        channel = grpc.intercept_channel(plain, _WithToken()) if with_token else plain
        threads = []

        @FUZZ
        @given(requests=call_of(method))
        def run(requests: list[bytes]) -> None:
            code = _invoke(channel, method, requests)
            if not with_token:
                assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT), code
            threads.append(_threads_of(agent.proc.pid))

        run()
        assert agent.proc.poll() is None, "the agent died"
        _healthy(plain)
        # a thread kept per call would grow with the examples; grpc's pool does not
        assert threads[-1] <= threads[len(threads) // 2] + 8, threads
