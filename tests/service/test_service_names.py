"""The changefeed answers under its versioned name and, deprecated, under its earlier one.

`csnd.changefeed.v1.Changefeed` is the contract; `csnd.v1.Changefeed` is how
clients, stubs and grpcurl scripts written before the versioned packages call
it.  Both reach the same servicer through a real gRPC server: the same
answers, the same roles (a read credential administers under neither name),
health SERVING for both, and reflection describing both.  The node agent
likewise answers as csnd.agent.v1.NodeAgent and, for a merge of the
previous release, as csnd.v1.NodeAgent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from csnd.changelog import Changelog
from csnd.core.auth import ADMIN, READ, Credential, Credentials, token_digest
from csnd.gtm import generate_cluster
from csnd.proto.agent.v1 import agent_pb2 as agent_pb
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.server import RunningServer
from tests.runtime.test_agent import Agent
from tests.service.feedkit import fill, serve
from tests.service.test_reflection import V1, V1ALPHA, _described, _services

CONTRACT: Final = "csnd.changefeed.v1.Changefeed"
DEPRECATED: Final = "csnd.v1.Changefeed"
ADMIN_TOKEN: Final = "adm1n-t0ken"
READ_TOKEN: Final = "r3ad-t0ken"


def md(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        fill(log, range(1, 4))
        creds = Credentials(
            [
                Credential("admin", ADMIN, token_digest(ADMIN_TOKEN)),
                Credential("reader", READ, token_digest(READ_TOKEN)),
            ]
        )
        srv = serve(log, credentials=creds)
        try:
            yield srv
        finally:
            srv.stop()


def _status(channel: grpc.Channel, service: str, token: str) -> pb.StatusResponse:
    call = channel.unary_unary(
        f"/{service}/Status",
        request_serializer=pb.StatusRequest.SerializeToString,
        response_deserializer=pb.StatusResponse.FromString,
    )
    answer: pb.StatusResponse = call(pb.StatusRequest(), metadata=md(token), timeout=30)
    return answer


def _fetch(channel: grpc.Channel, service: str, token: str) -> list[int]:
    call = channel.unary_stream(
        f"/{service}/Fetch",
        request_serializer=pb.FetchRequest.SerializeToString,
        response_deserializer=pb.FetchResponse.FromString,
    )
    responses = call(pb.FetchRequest(), metadata=md(token), timeout=30)
    return [t.csn for r in responses for t in r.batch.transactions]


def test_both_names_serve_the_same_changefeed(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        for service in (CONTRACT, DEPRECATED):
            status = _status(ch, service, READ_TOKEN)
            assert (status.changelog.oldest_csn, status.changelog.newest_csn) == (1, 3), service
            assert _fetch(ch, service, READ_TOKEN) == [1, 2, 3], service


def test_a_read_credential_administers_under_neither_name(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        for service in (CONTRACT, DEPRECATED):
            call = ch.unary_unary(
                f"/{service}/DeleteSubscription",
                request_serializer=pb.DeleteSubscriptionRequest.SerializeToString,
                response_deserializer=pb.SubscriptionInfo.FromString,
            )
            with pytest.raises(grpc.RpcError) as refused:
                call(pb.DeleteSubscriptionRequest(name="nobody"), metadata=md(READ_TOKEN), timeout=30)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, service
            with pytest.raises(grpc.RpcError) as allowed:  # (admin passes the role; the name is unknown)
                call(pb.DeleteSubscriptionRequest(name="nobody"), metadata=md(ADMIN_TOKEN), timeout=30)
            assert allowed.value.code() == grpc.StatusCode.NOT_FOUND, service


def test_health_answers_serving_for_both_names(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in (CONTRACT, DEPRECATED):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service


def test_reflection_describes_both_names_with_the_contract_s_messages(tmp_path: Path) -> None:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        srv = serve(log)
        try:
            with grpc.insecure_channel(srv.address) as ch:
                for method in (V1, V1ALPHA):
                    assert {CONTRACT, DEPRECATED} <= _services(ch, method)
                    contract = _described(ch, method, CONTRACT)
                    deprecated = _described(ch, method, DEPRECATED)
                    assert contract.package == "csnd.changefeed.v1"
                    assert deprecated.service[0].options.deprecated
                    old = {m.name: (m.input_type, m.output_type) for m in deprecated.service[0].method}
                    new = {m.name: (m.input_type, m.output_type) for m in contract.service[0].method}
                    assert old == new  # (method for method, the contract's own messages)
        finally:
            srv.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("agents")
    generate_cluster(str(d), 1, 20, seed=3, binary=True)
    return d


def test_a_node_agent_describes_itself_under_both_names(cluster: Path) -> None:
    """A merge of the previous release calls csnd.v1.NodeAgent: the agent still answers it."""
    agent = Agent(str(cluster / "dn1.pgstream"))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{agent.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for service in ("csnd.agent.v1.NodeAgent", "csnd.v1.NodeAgent"):
                describe = ch.unary_unary(
                    f"/{service}/Describe",
                    request_serializer=agent_pb.DescribeRequest.SerializeToString,
                    response_deserializer=agent_pb.Hello.FromString,
                )
                hello = describe(agent_pb.DescribeRequest(), timeout=30)
                assert (hello.node, hello.mode) == ("dn1", "gtm"), service
                answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    finally:
        agent.stop()
