"""Scale-out: node agents (`csnd node`) in their own processes, the coordinator over gRPC on loopback."""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd.core.ids import Lsn, lsn_from_str
from csnd.testing import pgworkload as workload
from tests.fixtures.generated import shared_cluster
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]

# `csnd node ARGS`, with the producer slowed down after each batch (injected,
# so a kill lands mid-stream); sys.argv[1] is the delay in seconds.
AGENT = """
import sys, time
from csnd import cli
from csnd.runtime.agent import serve
delay = float(sys.argv[1])
args = cli.build_parser().parse_args(["node", *sys.argv[2:]])
cli.install_agent_runtime()
sys.exit(serve(cli.node_config(args), after_batch=(lambda: time.sleep(delay)) if delay else None))
"""


class Agent:
    def __init__(self, source: str, port: int = 0, delay_s: float = 0.0, extra: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                AGENT,
                str(delay_s),
                source,
                "--listen",
                f"127.0.0.1:{port}",
                "--decoders",
                "1",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert m, f"agent did not start: {line!r}"
        self.port = int(m.group(1))
        self.url = f"grpc://127.0.0.1:{self.port}"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_cluster(tmp_path_factory, 2, 800, seed=31, binary=True)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop()


def replay(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, "replay", *args], capture_output=True, text=True, timeout=timeout)


def test_two_agents_merge_to_the_expected_output(cluster: Path, agents: list[Agent], tmp_path: Path) -> None:
    agents += [Agent(str(cluster / "dn1.pgstream")), Agent(str(cluster / "dn2.pgstream"))]
    out = tmp_path / "out.jsonl"
    proc = replay(agents[1].url, agents[0].url, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (cluster / "expected.jsonl").read_bytes()


def test_a_file_and_an_agent_mix(cluster: Path, agents: list[Agent], tmp_path: Path) -> None:
    agents.append(Agent(str(cluster / "dn2.pgstream")))
    out = tmp_path / "out.jsonl"
    proc = replay(str(cluster / "dn1.pgstream"), agents[0].url, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (cluster / "expected.jsonl").read_bytes()


def test_a_consumed_agent_refuses_a_new_coordinator_instead_of_giving_it_half(
    cluster: Path, agents: list[Agent], tmp_path: Path
) -> None:
    agents.append(Agent(str(cluster / "dn2.pgstream")))
    assert replay(str(cluster / "dn1.pgstream"), agents[0].url).returncode == 0
    proc = replay(str(cluster / "dn1.pgstream"), agents[0].url)
    assert proc.returncode == 1
    assert "already delivered" in proc.stderr and "Traceback" not in proc.stderr


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def wait_for_lines(proc: subprocess.Popen[str], partial: Path, lines: int, timeout: float = 120) -> None:
    """Until a running replay's output holds `lines` lines (it is provably mid-stream)."""
    deadline = time.monotonic() + timeout
    while _lines(partial) < lines:
        assert proc.poll() is None, "replay ended before the kill"
        assert time.monotonic() < deadline, f"fewer than {lines} lines in {partial} after {timeout} s"
        time.sleep(0.05)


def test_an_agent_killed_and_restarted_mid_stream_loses_and_repeats_nothing(
    cluster: Path, agents: list[Agent], tmp_path: Path
) -> None:
    agents += [Agent(str(cluster / "dn1.pgstream"), delay_s=0.01), Agent(str(cluster / "dn2.pgstream"))]
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [*CSND, "replay", agents[0].url, agents[1].url, "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_lines(proc, tmp_path / "out.jsonl.partial", 50)
    port = agents[0].port
    agents[0].kill()
    time.sleep(1.0)  # the coordinator notices and starts reconnecting
    agents.append(Agent(str(cluster / "dn1.pgstream"), port=port))
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert out.read_bytes() == (cluster / "expected.jsonl").read_bytes()


def test_an_agent_that_never_comes_back_fails_the_run_clearly(
    cluster: Path, agents: list[Agent], tmp_path: Path
) -> None:
    agents += [Agent(str(cluster / "dn1.pgstream"), delay_s=0.01), Agent(str(cluster / "dn2.pgstream"))]
    proc = subprocess.Popen(
        [
            *CSND,
            "replay",
            agents[0].url,
            agents[1].url,
            "--agent-give-up",
            "2",
            "--output",
            str(tmp_path / "o"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_lines(proc, tmp_path / "o.partial", 20)  # under way: the agent is streaming
    agents[0].kill()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr
    assert f"127.0.0.1:{agents[0].port}" in lines[0] and "not back after 2s" in lines[0]
    assert "dn1" in lines[0]


def test_an_unreachable_agent_at_start_is_a_clear_error(tmp_path: Path) -> None:
    proc = replay("grpc://127.0.0.1:1", "--agent-give-up", "1")
    assert proc.returncode == 1
    assert "127.0.0.1:1" in proc.stderr and "Traceback" not in proc.stderr


class _Slot:
    """A source's confirm calls, as a live node's slot sees them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def confirm(self, lsn: int) -> None:
        self.calls.append(("confirm", lsn))

    def confirm_final(self, lsn: int) -> None:
        self.calls.append(("confirm_final", lsn))


def test_the_final_ack_moves_the_slot_even_if_an_earlier_ack_carried_its_position() -> None:
    """A periodic Ack may carry the last position before the final one; the slot must still move at the end."""
    from csnd.coordinator.wire import BEFORE_ALL
    from csnd.proto.agent.v1 import agent_pb2 as pb
    from csnd.runtime.agent import AgentState

    slot = _Slot()
    state = AgentState(slot)  # type: ignore[arg-type]  # (a node pipeline's confirm and confirm_final)
    state.window.append((10, 0), pb.AgentMessage(), True, lsn=Lsn(0x500))  # (sent: confirmable to 0/500)
    state.window.next_to_send(0, BEFORE_ALL)
    state.ack((10, 0), Lsn(0x500), final=False)
    state.ack((10, 0), Lsn(0x500), final=True)
    assert slot.calls == [("confirm", 0x500), ("confirm_final", 0x500)]
    state.ack((10, 0), Lsn(0x400), final=True)  # never backwards
    assert slot.calls[-1] == ("confirm_final", 0x500)


def test_an_agent_on_a_live_node_confirms_its_slot_only_as_the_coordinator_says(
    pg: PgDatabase, agents: list[Agent], tmp_path: Path
) -> None:
    """Two rounds through an agent on a live node: the second continues exactly after the first."""
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    seen: list[set[int]] = []
    for run in range(2):
        workload.run(pg.dsn, rounds=1, seed=run)
        end = pg.current_lsn()
        agent = Agent(
            f"dn1={pg.url}", extra=("--slot", "csnd", "--publication", "csnd_pub", "--until-lsn", end)
        )
        agents.append(agent)
        out = tmp_path / f"run{run}.jsonl"
        proc = replay(agent.url, "--output", str(out))
        assert proc.returncode == 0, proc.stderr
        docs = [json.loads(ln) for ln in out.read_text(encoding="utf-8").splitlines()]
        assert docs and all(a["csn"] < b["csn"] for a, b in itertools.pairwise(docs))
        seen.append({d["nodes"]["dn1"]["xid"] for d in docs})
        last_commit = lsn_from_str(docs[-1]["nodes"]["dn1"]["commit_lsn"])
        deadline = time.monotonic() + 120
        while True:  # the agent advances its slot when the coordinator's final Ack arrives
            (row,) = pg.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='csnd'"
            )
            confirmed = lsn_from_str(str(row[0]))
            if confirmed > last_commit or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert last_commit < confirmed <= lsn_from_str(end)
        agent.stop()
    assert not seen[0] & seen[1]


def test_a_grpc_server_that_is_not_a_node_agent_is_refused_at_once(tmp_path: Path) -> None:
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        # Refused, not retried: with an hour's patience a retry would run into replay()'s ceiling.
        proc = replay(f"grpc://127.0.0.1:{port}", "--agent-give-up", "3600")
        assert proc.returncode == 1 and "not a csnd node agent" in proc.stderr
    finally:
        server.stop(0)


def test_an_ack_before_the_first_batch_carries_no_position(cluster: Path, agents: list[Agent]) -> None:
    """The periodic ack may fire before any batch arrived (a slow start): it must encode, without `received`.

    It used to try to encode the "before everything" position (-1, -1) and kill the ack thread with a
    traceback; a missing `received` is taken by the agent as nothing received.
    """
    from csnd.runtime.remote import RemoteNode

    agents.append(Agent(str(cluster / "dn1.pgstream")))
    node = RemoteNode(agents[0].url.removeprefix("grpc://"), name=None, give_up_s=10)
    try:
        msg = node._ack()
        assert not msg.ack.HasField("received")
        assert msg.SerializeToString()
    finally:
        node.channel.close()
