"""gRPC server reflection under both names tools ask for: `grpc.reflection.v1` first, then `v1alpha`.

A real v1 client call (grpcurl's and Postman's first question) against a
real changefeed server and a real node agent process.  grpc.reflection.v1's
messages are v1alpha's field for field, so the client here serialises with
v1alpha's classes and names the v1 method on the wire.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2 as wire

from csnd.changelog import Changelog
from csnd.gtm import generate_cluster
from csnd.service import start_changefeed
from tests.runtime.test_agent import Agent

V1: Final = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
V1ALPHA: Final = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def _ask(
    channel: grpc.Channel, method: str, *requests: wire.ServerReflectionRequest
) -> list[wire.ServerReflectionResponse]:
    call = channel.stream_stream(
        method,
        request_serializer=wire.ServerReflectionRequest.SerializeToString,
        response_deserializer=wire.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=30))


def _services(channel: grpc.Channel, method: str) -> set[str]:
    (answer,) = _ask(channel, method, wire.ServerReflectionRequest(list_services=""))
    return {s.name for s in answer.list_services_response.service}


def _described(channel: grpc.Channel, method: str, symbol: str) -> descriptor_pb2.FileDescriptorProto:
    (answer,) = _ask(channel, method, wire.ServerReflectionRequest(file_containing_symbol=symbol))
    assert not answer.HasField("error_response"), answer.error_response.error_message
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(b)
        for b in answer.file_descriptor_response.file_descriptor_proto
    ]
    return next(f for f in files if any(f"{f.package}.{s.name}" == symbol for s in f.service))


def _both_versions_answer(address: str, *own_services: str) -> None:
    with grpc.insecure_channel(address) as ch:
        for method in (V1, V1ALPHA):
            services = _services(ch, method)
            assert {*own_services, "grpc.health.v1.Health"} <= services
            assert {
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
            } <= services
            for symbol in services:  # (what `grpcurl describe` does next: every service resolves)
                assert _described(ch, method, symbol).package == symbol.rsplit(".", 1)[0]
        v1 = _described(ch, V1, "grpc.reflection.v1.ServerReflection")
        (method,) = v1.service[0].method
        assert (method.input_type, method.output_type) == (
            ".grpc.reflection.v1.ServerReflectionRequest",
            ".grpc.reflection.v1.ServerReflectionResponse",
        )


def test_the_changefeed_answers_reflection_v1_and_v1alpha(tmp_path: Path) -> None:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        srv = start_changefeed(log)
        try:
            _both_versions_answer(srv.address, "csnd.changefeed.v1.Changefeed", "csnd.v1.Changefeed")
        finally:
            srv.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("agents")
    generate_cluster(str(d), 1, 20, seed=3, binary=True)
    return d


@pytest.fixture
def agent(cluster: Path) -> Iterator[Agent]:
    a = Agent(str(cluster / "dn1.pgstream"))
    try:
        yield a
    finally:
        a.stop()


def test_the_node_agent_answers_reflection_v1_and_v1alpha(agent: Agent) -> None:
    _both_versions_answer(f"127.0.0.1:{agent.port}", "csnd.agent.v1.NodeAgent", "csnd.v1.NodeAgent")
