"""`csnd replay grpc://HOST:PORT`: a node pipeline running in a node agent (`csnd node`).

`RemoteNode` is the `NodeInput` of a node agent: the merger reads
its `Outbox` of batches (already cut by the agent), watermarks and the end.  One thread holds the Stream
RPC; it subscribes after the last position it received, acknowledges what
arrived (with the LSN the merge says is durable, for the agent's slot), and
on a lost connection reconnects with backoff (`csnd.core.backoff`: jittered,
so the coordinators of many agents cut off together do not all come back in
the same instant) -- the agent re-sends exactly what follows that position --
until `give_up_s` without the agent, when the run fails naming the node and
address.  Any message from the agent ends an outage.  A refusal is not an
outage: a token the agent does not take, or an Ack it refuses, ends the run
at once.

`AgentDialConfig` says how to reach the agents: a token sent as
`authorization: Bearer` metadata with every call, and TLS (the agent's CA,
and for mutual TLS this coordinator's certificate and key).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Final

import grpc

from csnd.coordinator.wire import BEFORE_ALL, Position, batch_from_pb, end_from_pb, position_to_pb
from csnd.core.backoff import Backoff
from csnd.core.errors import ConfigError, ConnectionLost, CsndError
from csnd.core.ids import INVALID_LSN, Csn, Lsn
from csnd.core.tls import channel_credentials
from csnd.core.tokens import read_token_file
from csnd.proto.agent.v1 import agent_pb2 as pb
from csnd.proto.agent.v1 import agent_pb2_grpc as pb_grpc
from csnd.runtime.items import BatchItem, EndItem, NodeItem, Outbox, WatermarkItem
from csnd.runtime.options import AGENT_GIVE_UP_S, AgentDialConfig
from csnd.runtime.stats import NodeStats

ACK_INTERVAL_S: Final = 0.5
# Reconnect backoff: the first wait's ceiling, doubling up to the cap.  An agent
# restarts in a second or two; the cap bounds how long the merge waits past that.
BACKOFF_FIRST_S: Final = 0.2
BACKOFF_MAX_S: Final = 2.0
# Also acknowledge after this many batches (a quarter of the agent's window).
ACK_EVERY_BATCHES: Final = 64
# An agent sends a keepalive every second when idle; this much silence is a dead agent.
SILENCE_S: Final = 10.0
QUEUE_DEPTH: Final = 256
# Both ends of the node agent's channel (the agent adds its server-side settings).
CHANNEL_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
]
# The agent answered, and said no: reconnecting would get the same answer.
REFUSED: Final = (
    grpc.StatusCode.FAILED_PRECONDITION,  # a subscription after what the agent no longer has
    grpc.StatusCode.INVALID_ARGUMENT,  # an Ack it refuses (a confirm LSN beyond what it sent)
    grpc.StatusCode.UNAUTHENTICATED,  # no token, or the wrong one
    grpc.StatusCode.PERMISSION_DENIED,
)


class RemoteNode:
    """A node agent's output as a `NodeInput`; `confirm` forwards to the agent's slot with the next Ack."""

    # The agent may stream a live slot: its confirmations are always forwarded.
    confirms = True
    releases_whole = False  # batches, already cut

    def __init__(
        self,
        address: str,
        name: str | None = None,
        give_up_s: float = AGENT_GIVE_UP_S,
        dial: AgentDialConfig | None = None,
    ) -> None:
        self.address = address
        self.give_up_s = give_up_s
        # The reconnect schedule, for the first Describe and then the stream.
        self.backoff = Backoff(time.monotonic, first=BACKOFF_FIRST_S, cap=BACKOFF_MAX_S, give_up=give_up_s)
        dial = dial or AgentDialConfig()
        token = read_token_file(dial.token_file) if dial.token_file else None
        self.metadata: tuple[tuple[str, str], ...] = (
            () if token is None else (("authorization", f"Bearer {token}"),)
        )
        if dial.tls:
            creds = channel_credentials(dial.ca, dial.cert, dial.key)
            self.channel = grpc.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        else:
            self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.NodeAgentStub(self.channel)
        hello = self._describe()
        self.node: str = name or hello.node
        self.mode = hello.mode
        self.binary = hello.binary
        self.out = Outbox(QUEUE_DEPTH)
        self.position: Position = BEFORE_ALL
        self._confirm = INVALID_LSN
        self._final = threading.Event()
        self._final_sent = threading.Event()
        self._stop = threading.Event()
        self._wakeup: threading.Event | None = None
        self._last_msg = time.monotonic()
        self.received_transactions = 0  # (for stats(): whole transactions received)
        self.watermark = 0
        self.thread = threading.Thread(target=self._run, name=f"csnd-remote-{self.node}", daemon=True)

    def resume_after(self, csn: int) -> None:
        """Start after every batch of transactions with CSN <= `csn` (the output holds them already)."""
        self.position = (csn, 0xFFFFFFFF)  # (index is a uint32 on the wire: past any batch of that csn)

    def _describe(self) -> pb.Hello:
        backoff = self.backoff
        backoff.lost()  # (give_up_s counts from the first attempt)
        while True:
            try:
                hello: pb.Hello = self.stub.Describe(pb.DescribeRequest(), timeout=5, metadata=self.metadata)
                backoff.flowing()
                return hello
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise ConfigError(f"{self.address} is not a csnd node agent: {_rpc_text(e)}") from None
                if e.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                    raise ConfigError(
                        f"node agent at {self.address} refused this coordinator: {_rpc_text(e)} "
                        "(give its token with --agent-token-file)"
                    ) from None
                wait = backoff.failed()
                if wait is None:
                    raise ConfigError(
                        f"node agent at {self.address} does not answer: {_rpc_text(e)}"
                    ) from None
                time.sleep(wait)

    # --- confirmation -----------------------------------------------------------------

    def confirm(self, lsn: Lsn) -> None:
        self._confirm = max(self._confirm, lsn)

    def confirm_final(self, lsn: Lsn) -> None:
        """Send the last confirmation and wait (at most 10 s) until the agent has taken it."""
        self.confirm(lsn)
        self._final.set()
        self._final_sent.wait(10)

    # --- the rest of the NodeInput interface -------------------------------------------

    def stats(self) -> NodeStats:
        return NodeStats(
            node=self.node,
            mode=self.mode,
            confirmed_lsn=self._confirm,
            released=self.received_transactions,
            watermark_csn=self.watermark,
            agent=self.address,
        )

    def start(self, wakeup: threading.Event, *, alone: bool) -> None:
        self._wakeup = wakeup  # (never alone: its batches are cut already, `releases_whole` is False)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._final.set()
        self.channel.close()

    def _put(self, item: NodeItem) -> bool:
        while not self._stop.is_set():
            try:
                self.out.put_many([item], timeout=0.5)
                assert self._wakeup is not None
                self._wakeup.set()
                return True
            except queue.Full:
                continue
        return False

    def _requests(self, outbox: queue.Queue[pb.CoordinatorMessage | None]) -> Iterator[pb.CoordinatorMessage]:
        after = None if self.position == BEFORE_ALL else position_to_pb(self.position)
        yield pb.CoordinatorMessage(subscribe=pb.Subscribe(after=after))
        while True:
            msg = outbox.get()
            if msg is None:
                return
            yield msg

    def _ack(self, final: bool = False) -> pb.CoordinatorMessage:
        # Before the first batch there is no position to acknowledge (BEFORE_ALL
        # has no protobuf form): the ack then carries only the confirm LSN.
        received = None if self.position == BEFORE_ALL else position_to_pb(self.position)
        return pb.CoordinatorMessage(ack=pb.Ack(received=received, confirm_lsn=self._confirm, final=final))

    def _run(self) -> None:
        backoff = self.backoff
        ended = False
        while not self._stop.is_set():
            outbox: queue.Queue[pb.CoordinatorMessage | None] = queue.Queue()
            call = self.stub.Stream(self._requests(outbox), metadata=self.metadata)
            acker = threading.Thread(target=self._acks, args=(outbox, call), daemon=True)
            acker.start()
            unacked = 0
            try:
                for msg in call:
                    self._last_msg = time.monotonic()
                    backoff.flowing()
                    kind = msg.WhichOneof("body")
                    if kind == "batch":
                        batch, pos, confirmable = batch_from_pb(msg.batch)
                        if pos <= self.position:
                            continue  # never twice, whatever the agent does
                        lsn = None if confirmable is None else Lsn(confirmable)  # (the wire's integer)
                        if not self._put(BatchItem(batch, lsn)):
                            return
                        self.position = pos
                        self.received_transactions += batch.last_of_txn
                        unacked += 1
                        if unacked >= ACK_EVERY_BATCHES:  # keep the agent's window from filling up
                            outbox.put(self._ack())
                            unacked = 0
                    elif kind == "watermark":
                        self.watermark = max(self.watermark, msg.watermark.csn)
                        if not self._put(WatermarkItem(Csn(msg.watermark.csn))):
                            return
                    elif kind == "end":
                        error = end_from_pb(msg.end)
                        if error is not None:
                            self._put(EndItem(error))
                            return
                        ended = True
                        self._put(EndItem())
                        self._final.wait()  # until the merge has confirmed what it wrote
                        outbox.put(self._ack(final=True))
                        outbox.put(None)
                        self._await_end_of_call(call)
                        return
            except grpc.RpcError as e:
                if self._stop.is_set() or ended:
                    return
                if e.code() in REFUSED:  # refused, not lost: do not retry
                    self._put(EndItem(CsndError(f"node agent at {self.address}: {e.details()}")))
                    return
                wait = backoff.failed()
                if wait is None:
                    self._put(
                        EndItem(
                            ConnectionLost(
                                f"node agent at {self.address} lost and not back after "
                                f"{self.give_up_s:.0f}s: {_rpc_text(e)}",
                                node=self.node,
                            )
                        )
                    )
                    return
                self._stop.wait(wait)
            finally:
                outbox.put(None)

    def _await_end_of_call(self, call: Iterator[pb.AgentMessage]) -> None:
        """Wait until the agent ends the call, then let `confirm_final` return.

        The agent ends it only after it has taken the final Ack (and moved its
        slot).  Putting the Ack in the outbox is not sending it: a caller that
        closed the channel as soon as it was queued could lose it, and the
        slot would stay behind, so the next run would get those transactions
        again.
        """
        try:
            for _ in call:
                pass
        except grpc.RpcError:
            pass  # the agent is gone: there is nothing more to wait for
        finally:
            self._final_sent.set()

    def _acks(self, outbox: queue.Queue[pb.CoordinatorMessage | None], call: grpc.Future) -> None:
        """Acknowledge what arrived, with the confirm LSN, every ACK_INTERVAL_S while the call lives."""
        self._last_msg = time.monotonic()
        while not self._stop.wait(ACK_INTERVAL_S):
            if call.done() or self._final.is_set():
                return
            if time.monotonic() - self._last_msg > SILENCE_S:
                call.cancel()  # a silent agent is a lost one: reconnect
                return
            outbox.put(self._ack())


def _rpc_text(e: grpc.RpcError) -> str:
    if not isinstance(e, grpc.Call):  # (an RpcError that is no call: no status to name)
        return f"error: {e}"
    code = e.code()
    return f"{code.name if code else 'error'}: {e.details()}"
