"""Nobody in uninvited: a node agent's token, TLS, mutual TLS, its loopback rule, and its confirm LSN bound.

Before these, anyone who reached `csnd node --listen` read every decoded row,
ended the real coordinator's stream by subscribing (a new Stream bumps the
generation) and moved the slot with an Ack of any confirm LSN (with `final`,
`pg_replication_slot_advance`: a silent gap in the source).
"""

from __future__ import annotations

import queue
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from csnd.coordinator.wire import BEFORE_ALL, Position, position_from_pb, position_to_pb
from csnd.core.addresses import is_loopback
from csnd.core.errors import AckError, UsageError
from csnd.core.ids import Lsn, lsn_from_str
from csnd.proto.agent.v1 import agent_pb2 as pb
from csnd.proto.agent.v1 import agent_pb2_grpc as pb_grpc
from csnd.runtime.agent import AgentState
from csnd.runtime.window import AckWindow
from csnd.testing import pgworkload as workload
from tests.fixtures.certs import Certs, make_certs
from tests.fixtures.generated import shared_cluster
from tests.fixtures.pg import PgDatabase
from tests.runtime.test_agent import CSND, Agent, agents, replay, wait_for_lines

__all__ = ["agents"]  # (a fixture)

# --- the confirm LSN bound, against a brute-force model ----------------------------------------------


class ConfirmBoundMachine(RuleBasedStateMachine):
    """One node's transactions through agent lives and a coordinator, honest and not.

    Transaction i has `parts[i]` batches at positions (i + 1, index) and the
    confirmable LSN `lsns[i]` (strictly increasing) on its first batch.  The
    coordinator receives what the window sends and confirms (honestly) the
    LSN of a transaction it received; a stranger confirms anything.  An
    agent restart re-reads the source from the slot, as a live source does.
    The slot must never move past the LSN of a transaction the coordinator
    received, and the honest coordinator must never be refused.
    """

    @initialize(
        parts=st.lists(st.integers(1, 3), min_size=1, max_size=12),
        gaps=st.lists(st.integers(1, 50), min_size=12, max_size=12),
    )
    def setup(self, parts: list[int], gaps: list[int]) -> None:
        self.parts = parts
        self.lsns = [sum(gaps[: i + 1]) for i in range(len(parts))]
        self.slot = 0  # where the slot has been moved to
        self.received: Position = BEFORE_ALL  # the coordinator has every batch up to here
        self.received_lsns: list[int] = [0]  # confirmable LSNs the coordinator received
        self._new_life(0)

    def _new_life(self, first_txn: int) -> None:
        self.window: AckWindow[str] = AckWindow(capacity=4, resumed_lsn=Lsn(self.slot))
        self.next_txn, self.next_index = first_txn, 0
        self.delivered: list[int] = [self.slot]  # the model's record: LSNs sent or passed over in this life
        self.produced: list[Position] = []
        self.sent: list[Position] = []
        self.window.ack(self.received)  # the coordinator subscribes after what it has
        self.acked = self.received
        self.sent_seq = 0

    @property
    def ended(self) -> bool:
        return self.next_txn == len(self.parts)

    @precondition(lambda self: not self.ended)
    @rule()
    def produce(self) -> None:
        i, index = self.next_txn, self.next_index
        pos = (i + 1, index)
        lsn = self.lsns[i] if index == 0 else 0
        if self.window.full and pos > self.window.acked:
            return  # (the agent waits for acknowledgements)
        kept = self.window.append(pos, f"{pos}", True, Lsn(lsn))
        if not kept:
            self.delivered.append(lsn)
        self.produced.append(pos)
        self.next_index += 1
        if self.next_index == self.parts[i]:
            self.next_txn, self.next_index = i + 1, 0

    @rule()
    def send(self) -> None:
        entry, self.sent_seq = self.window.next_to_send(self.sent_seq, self.received)
        if entry is None:
            return
        self.delivered.append(entry.lsn)
        if entry.is_batch:
            self.sent.append(entry.pos)
        if entry.is_batch and entry.pos > self.received:
            self.received = entry.pos
            self.received_lsns.append(entry.lsn)

    def _apply(self, confirm: int, received: Position) -> int | None:
        # The oracle, from the record of this life: behind while the coordinator has more than was produced.
        claimable = received <= max(self.acked, max(self.sent, default=BEFORE_ALL))
        assert self.window.received_ok(received) == claimable
        if not claimable:
            return None  # (refused whole)
        limit = self.window.confirm_limit(Lsn(confirm), self.ended)
        behind = self.acked > max(self.produced, default=BEFORE_ALL)
        if confirm <= max(self.delivered):
            assert limit == confirm
        elif behind and not self.ended:
            assert limit == max(self.delivered)
        else:
            assert limit is None
        if limit is not None:
            self.window.ack(received)
            self.acked = max(self.acked, received)
            self.slot = max(self.slot, limit)
        return limit

    @rule(data=st.data())
    def coordinator_acks(self, data: st.DataObject) -> None:
        confirm = data.draw(st.sampled_from(self.received_lsns))
        assert self._apply(confirm, self.received) is not None, "an honest confirm LSN was refused"

    @rule(confirm=st.integers(0, 700), csn=st.integers(0, 14))
    def stranger_acks(self, confirm: int, csn: int) -> None:
        self._apply(confirm, BEFORE_ALL if csn == 0 else (csn, 0))

    @rule(data=st.data())
    def agent_restarts(self, data: st.DataObject) -> None:
        # The source resumes at the slot: every transaction whose LSN is past it comes again, maybe more.
        resumes = sum(1 for lsn in self.lsns if lsn <= self.slot)
        self._new_life(data.draw(st.integers(0, resumes)))

    @invariant()
    def the_slot_never_passes_what_the_coordinator_received(self) -> None:
        assert self.slot <= max(self.received_lsns)

    @invariant()
    def window_holds(self) -> None:
        self.window._check()


TestConfirmBound = ConfirmBoundMachine.TestCase
TestConfirmBound.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)


def test_loopback_addresses() -> None:
    for host in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost", "LOCALHOST"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "db1", "localhost.example.com", ""):
        assert not is_loopback(host), host


class _Slot:
    """A source's confirm calls, as a live node's slot sees them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.node = "dn1"
        self.slot_name = None  # (no slot name to tell)

    def confirm(self, lsn: int) -> None:
        self.calls.append(("confirm", lsn))

    def confirm_final(self, lsn: int) -> None:
        self.calls.append(("confirm_final", lsn))


def test_an_ack_past_what_the_agent_sent_is_refused_and_confirms_nothing() -> None:
    slot = _Slot()
    state = AgentState(slot)  # type: ignore[arg-type]  # (a node pipeline's confirm and confirm_final)
    state.window.append((10, 0), pb.AgentMessage(), True, lsn=Lsn(0x500))
    state.window.next_to_send(0, BEFORE_ALL)
    with pytest.raises(AckError, match=r"confirmed 0/600.*beyond 0/500"):
        state.ack((10, 0), Lsn(0x600), final=True)
    with pytest.raises(AckError, match=r"acknowledged csn 11 batch 0, beyond the last batch this agent sent"):
        state.ack((11, 0), Lsn(0x500), final=True)
    assert slot.calls == [] and state.acked == BEFORE_ALL
    state.ack((10, 0), Lsn(0x500), final=True)
    assert slot.calls == [("confirm_final", 0x500)]


# --- the gRPC surface: a real agent process ----------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_cluster(tmp_path_factory, 2, 300, seed=7, binary=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    f = tmp_path / "token"
    f.write_text("s3cret-agent-token\n", encoding="utf-8")
    return f


def _stub(channel: grpc.Channel) -> pb_grpc.NodeAgentStub:
    return pb_grpc.NodeAgentStub(channel)


class Subscriber:
    """A hand-made coordinator: subscribes, reads what the agent sends, and sends the Acks it is told to."""

    def __init__(self, channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.acks: queue.Queue[pb.CoordinatorMessage | None] = queue.Queue()
        self.call = _stub(channel).Stream(self._requests(), metadata=metadata, timeout=60)

    def _requests(self) -> Iterator[pb.CoordinatorMessage]:
        yield pb.CoordinatorMessage(subscribe=pb.Subscribe())
        while (msg := self.acks.get()) is not None:
            yield msg

    def first_batch(self) -> pb.NodeBatch:
        for msg in self.call:
            if msg.WhichOneof("body") == "batch":
                batch: pb.NodeBatch = msg.batch
                return batch
        raise AssertionError("the stream ended before its first batch")

    def ack(self, received: Position, confirm_lsn: int, final: bool) -> None:
        self.acks.put(
            pb.CoordinatorMessage(
                ack=pb.Ack(received=position_to_pb(received), confirm_lsn=confirm_lsn, final=final)
            )
        )

    def close(self) -> None:
        self.acks.put(None)
        self.call.cancel()


def test_without_the_token_a_stranger_gets_nothing_and_the_coordinator_streams_on(
    cluster: Path, agents: list[Agent], token_file: Path, tmp_path: Path
) -> None:
    agents += [
        Agent(str(cluster / "dn1.pgstream"), delay_s=0.01, extra=("--token-file", str(token_file))),
        Agent(str(cluster / "dn2.pgstream"), extra=("--token-file", str(token_file))),
    ]
    out = tmp_path / "out.jsonl"
    coordinator = subprocess.Popen(
        [*CSND, "replay", agents[0].url, agents[1].url, "--agent-token-file", str(token_file), "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    wait_for_lines(coordinator, tmp_path / "out.jsonl.partial", 20)  # its stream is under way
    with grpc.insecure_channel(f"127.0.0.1:{agents[0].port}") as channel:
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as e:
                _stub(channel).Describe(pb.DescribeRequest(), metadata=metadata, timeout=10)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stranger = Subscriber(channel, metadata)
            with pytest.raises(grpc.RpcError) as e:
                stranger.first_batch()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stranger.close()
        # an Ack alone (no Subscribe first) meets the same door
        with pytest.raises(grpc.RpcError) as e:
            call = _stub(channel).Stream(
                iter([pb.CoordinatorMessage(ack=pb.Ack(confirm_lsn=1 << 40, final=True))]), timeout=10
            )
            next(iter(call))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    _, stderr = coordinator.communicate(timeout=120)
    assert coordinator.returncode == 0, stderr
    assert out.read_bytes() == (cluster / "expected.jsonl").read_bytes()  # its stream was never ended


def test_a_coordinator_without_the_token_is_told_so_at_once(
    cluster: Path, agents: list[Agent], token_file: Path
) -> None:
    agents.append(Agent(str(cluster / "dn1.pgstream"), extra=("--token-file", str(token_file))))
    proc = replay(agents[0].url, "--agent-give-up", "3600")  # (refused, not retried for an hour)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "UNAUTHENTICATED" in lines[0] and "--agent-token-file" in lines[0]


def test_mutual_tls_lets_in_only_the_coordinator_with_its_certificate(
    cluster: Path, agents: list[Agent], certs: Certs, token_file: Path, tmp_path: Path
) -> None:
    security = ("--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-client-ca", certs.ca,
                "--token-file", str(token_file))  # fmt: skip
    agents += [
        Agent(str(cluster / "dn1.pgstream"), extra=security),
        Agent(str(cluster / "dn2.pgstream"), extra=security),
    ]
    address = f"127.0.0.1:{agents[0].port}"
    token = (("authorization", "Bearer s3cret-agent-token"),)

    def describe(creds: grpc.ChannelCredentials | None) -> grpc.StatusCode:
        channel = grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)
        with channel:
            try:
                _stub(channel).Describe(pb.DescribeRequest(), metadata=token, timeout=5)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

    ca = Path(certs.ca).read_bytes()
    no_cert = grpc.ssl_channel_credentials(root_certificates=ca)
    wrong_ca_cert = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=Path(certs.stranger_key).read_bytes(),
        certificate_chain=Path(certs.stranger_cert).read_bytes(),
    )
    right = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=Path(certs.client_key).read_bytes(),
        certificate_chain=Path(certs.client_cert).read_bytes(),
    )
    assert describe(None) == grpc.StatusCode.UNAVAILABLE  # plaintext: no TLS handshake, no call
    assert describe(no_cert) == grpc.StatusCode.UNAVAILABLE  # the handshake wants a client certificate
    assert describe(wrong_ca_cert) == grpc.StatusCode.UNAVAILABLE  # ... signed by the agent's CA
    assert describe(right) == grpc.StatusCode.OK
    out = tmp_path / "out.jsonl"
    dial = ("--agent-ca", certs.ca, "--agent-cert", certs.client_cert, "--agent-key", certs.client_key,
            "--agent-token-file", str(token_file))  # fmt: skip
    proc = replay(agents[1].url, agents[0].url, *dial, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (cluster / "expected.jsonl").read_bytes()


def _node(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, "node", *args], capture_output=True, text=True, timeout=60)


def test_listening_beyond_the_loopback_without_token_and_tls_is_refused(
    cluster: Path, token_file: Path, certs: Certs
) -> None:
    source = str(cluster / "dn1.pgstream")
    for listen, extra in (
        ("0.0.0.0:0", ()),
        ("[::]:0", ()),
        ("db1.example:0", ()),
        ("0.0.0.0:0", ("--token-file", str(token_file))),  # a token in plaintext: readable on the way
        ("0.0.0.0:0", ("--tls-cert", certs.server_cert, "--tls-key", certs.server_key)),  # TLS, but anyone
    ):
        proc = _node(source, "--listen", listen, *extra)
        assert proc.returncode == 2, (listen, extra, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("csnd node: error: --listen "), lines
        assert "--insecure-listen" in lines[0] and "Traceback" not in proc.stderr


def test_insecure_listen_serves_but_warns_on_every_start(cluster: Path, agents: list[Agent]) -> None:
    for _ in range(2):
        proc = subprocess.Popen(
            [*CSND, "node", str(cluster / "dn1.pgstream"), "--listen", "0.0.0.0:0", "--decoders", "1",
             "--insecure-listen"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert proc.stderr is not None
            listening, warning = proc.stderr.readline(), proc.stderr.readline()
            assert "listening on 0.0.0.0:" in listening, listening
            port = listening.rsplit(":", 1)[1].strip()
            assert f"warning: serving 0.0.0.0:{port} without a token and TLS (--insecure-listen)" in warning
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_tls_options_that_cannot_work_are_usage_errors(cluster: Path, certs: Certs) -> None:
    source = str(cluster / "dn1.pgstream")
    for extra, said in (
        (("--tls-cert", certs.server_cert), "both --tls-cert and --tls-key"),
        (("--tls-client-ca", certs.ca), "--tls-client-ca needs TLS"),
    ):
        proc = _node(source, "--listen", "127.0.0.1:0", *extra)
        assert proc.returncode == 2 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = _node(
        source, "--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem", "--tls-key", certs.server_key
    )
    assert proc.returncode == 1 and "cannot read the TLS certificate /nonexistent.pem" in proc.stderr


def _confirmed(pg: PgDatabase) -> int:
    (row,) = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='csnd'")
    return lsn_from_str(str(row[0]))


def test_an_ack_past_what_the_agent_sent_leaves_the_slot_where_it_is(
    pg: PgDatabase, agents: list[Agent]
) -> None:
    """A final Ack of the server's WAL end, after one batch: today the slot jumped over every unread row."""
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    workload.run(pg.dsn, rounds=2, seed=3)
    before = _confirmed(pg)
    end = pg.current_lsn()
    # The producer sleeps after each batch: when the Ack comes, the agent has sent one or two.
    agent = Agent(f"dn1={pg.url}", delay_s=30, extra=("--slot", "csnd", "--publication", "csnd_pub"))
    agents.append(agent)
    with grpc.insecure_channel(f"127.0.0.1:{agent.port}") as channel:
        sub = Subscriber(channel)
        batch = sub.first_batch()
        assert 0 < batch.confirmable_lsn < lsn_from_str(end)
        sub.ack(position_from_pb(batch.position), lsn_from_str(end), final=True)
        with pytest.raises(grpc.RpcError) as e:
            for _ in sub.call:
                pass
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"confirmed {end} for slot csnd, beyond" in str(e.value.details())
        sub.close()
    assert _confirmed(pg) == before
    agent.stop()
    assert agent.proc.stderr is not None
    log = agent.proc.stderr.read()
    assert f"node dn1: the coordinator confirmed {end} for slot csnd, beyond" in log


def test_serve_reads_how_to_reach_agents_from_its_config_file() -> None:
    from csnd.runtime.options import AgentDialConfig
    from csnd.service.config import build_config

    file = {"changelog": "/tmp/log", "agent_token_file": "/t", "agent_ca": "/ca.pem"}
    flags = {"agent_cert": "/c.pem", "agent_key": "/k.pem"}
    config = build_config(file, flags, ["grpc://127.0.0.1:7001"], environ={"CSND_AGENT_CA": "/env-ca.pem"})
    assert config.agent_dial == AgentDialConfig("/t", "/env-ca.pem", "/c.pem", "/k.pem")
    with pytest.raises(UsageError, match="--agent-cert and --agent-key"):
        build_config(file, {"agent_cert": "/c.pem"}, ["grpc://127.0.0.1:7001"], environ={})
