"""`csnd node SOURCE --listen ADDR`: one node pipeline served to the coordinator over gRPC.

    source ─► DecoderPool ─► NodeSender ─► producer ─► unacked window ─► Stream RPC ─► coordinator
                                            (cuts batches,   (bounded; a full     ◄─ Subscribe / Ack
                                             skips what the   window stops the       (confirm LSN)
                                             coordinator has) pipeline)

The agent keeps every batch it produced until the coordinator acknowledges it,
so a dropped connection loses nothing: a new subscription says the last
position the coordinator has, and the agent re-sends what follows.  After an
agent restart the window is empty; the pipeline re-reads its source (a file
from the start, a live slot from its confirmed LSN, which is never past what
the coordinator wrote) and the producer drops every batch at or before the
coordinator's position.  A live slot is confirmed only to the LSN the
coordinator sends in its acknowledgements.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from csnd.coordinator.wire import BEFORE_ALL, Position, batch_to_pb, end_to_pb, position_from_pb
from csnd.core.errors import ConfigError
from csnd.nodeitems import EndItem, TxnItem, WatermarkItem, cut_batches
from csnd.proto import csnd_pb2 as pb
from csnd.proto import csnd_pb2_grpc as pb_grpc
from csnd.replay import NodePipeline, open_source
from csnd.sources import parse_source

# Batches produced but not yet acknowledged.  Larger: more slack over a slow
# link; smaller: less memory (a batch is up to MERGE_BATCH_CHANGES changes).
MAX_UNACKED: Final = 256
# An idle stream sends a keepalive this often, so the coordinator can tell a
# quiet node from a dead one.
KEEPALIVE_S: Final = 1.0
# Tests only: slow the producer down so a kill lands mid-stream.
_TEST_DELAY_S: Final = float(os.environ.get("CSND_TEST_AGENT_DELAY_S", "0") or 0)
GRPC_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
]


class _Entry:
    __slots__ = ("seq", "pos", "msg")

    def __init__(self, seq: int, pos: Position, msg: pb.AgentMessage) -> None:
        self.seq = seq  # order within this agent's life
        self.pos = pos  # order across restarts (a watermark carries the position before it)
        self.msg = msg


class AgentState:
    """The node pipeline's output as a window of unacknowledged messages."""

    def __init__(self, pipeline: NodePipeline) -> None:
        self.pipeline = pipeline
        self.cond = threading.Condition()
        self.window: deque[_Entry] = deque()
        self.acked: Position = BEFORE_ALL
        self.seq = 0
        self.end: pb.AgentMessage | None = None
        self.generation = 0  # bumped by each new subscription; older streams stop
        self.stopping = False
        self.confirmed = 0

    # --- producer (its own thread) ----------------------------------------------

    def produce(self) -> None:
        pipe = self.pipeline
        pipe.start(threading.Event())
        last_pos: Position = BEFORE_ALL
        try:
            while not self.stopping:
                item = pipe.out.get()
                if isinstance(item, TxnItem):
                    for index, batch in enumerate(cut_batches(item.txn)):
                        pos = (batch.csn, index)
                        last_pos = pos
                        msg = pb.AgentMessage(
                            batch=batch_to_pb(batch, index, item.confirmable if index == 0 else None)
                        )
                        self._append(pos, msg)
                        if _TEST_DELAY_S:
                            time.sleep(_TEST_DELAY_S)
                elif isinstance(item, WatermarkItem):
                    if item.csn < 0:
                        continue  # the sender has no watermark yet
                    self._append(last_pos, pb.AgentMessage(watermark=pb.Watermark(csn=item.csn)), always=True)
                else:
                    assert isinstance(item, EndItem)
                    with self.cond:
                        self.end = pb.AgentMessage(end=end_to_pb(item.error))
                        self.cond.notify_all()
                    return
        except BaseException as e:  # noqa: BLE001 - reported to the coordinator
            with self.cond:
                self.end = pb.AgentMessage(end=end_to_pb(e))
                self.cond.notify_all()

    def _append(self, pos: Position, msg: pb.AgentMessage, always: bool = False) -> None:
        with self.cond:
            if not always and pos <= self.acked:
                return  # the coordinator has it already (we restarted)
            while len(self.window) >= MAX_UNACKED and not self.stopping:
                self.cond.wait(0.5)  # back-pressure: the pipeline waits for acknowledgements
            self.seq += 1
            self.window.append(_Entry(self.seq, pos, msg))
            self.cond.notify_all()

    # --- coordinator side -------------------------------------------------------

    def ack(self, received: Position, confirm_lsn: int, final: bool) -> None:
        with self.cond:
            if received > self.acked:
                self.acked = received
            window = self.window
            # A watermark stays until a later batch is acknowledged: it may not have arrived yet.
            while window and (
                window[0].pos < self.acked
                or (window[0].pos == self.acked and window[0].msg.HasField("batch"))
            ):
                window.popleft()
            self.cond.notify_all()
        source = self.pipeline.source
        advanced = confirm_lsn > self.confirmed
        if advanced:
            self.confirmed = confirm_lsn
        if final and hasattr(source, "confirm_final"):
            # Even when an earlier Ack already carried this position: once the
            # stream has ended (--until-lsn) only confirm_final moves the slot,
            # and it does nothing twice.
            source.confirm_final(self.confirmed)
        elif advanced:
            source.confirm(confirm_lsn)

    def messages(
        self, generation: int, after: Position, active: threading.Event
    ) -> Iterator[pb.AgentMessage]:
        """What one subscription receives: the window after `after` (in order), new output, then End.

        Batches at or before `after` are not sent again; watermarks always are
        (they are idempotent, and a lost one could stall the merge on an idle
        node).
        """
        with self.cond:
            if after > self.acked:
                self.acked = after
        sent_seq = 0
        last_send = time.monotonic()
        while True:
            entry: _Entry | None = None
            end: pb.AgentMessage | None = None
            with self.cond:
                if self.generation != generation or self.stopping or not active.is_set():
                    return
                window = self.window
                if window:
                    # seqs in the window are consecutive: jump to the first one not yet sent
                    i = max(0, sent_seq + 1 - window[0].seq)
                    while i < len(window):
                        e = window[i]
                        if e.pos > after or not e.msg.HasField("batch"):
                            entry = e
                            break
                        sent_seq = e.seq  # at or before `after`: the coordinator has it
                        i += 1
                if entry is None:
                    if self.window:
                        sent_seq = max(sent_seq, self.window[-1].seq)
                    end = self.end
                    if end is None:
                        self.cond.wait(0.2)
                else:
                    sent_seq = entry.seq
            if entry is not None:
                last_send = time.monotonic()
                yield entry.msg
                continue
            if end is not None:
                yield end
                # stay open until the coordinator is done (its final Ack) or goes away
                while active.is_set() and self.generation == generation and not self.stopping:
                    with self.cond:
                        self.cond.wait(0.5)
                return
            if time.monotonic() - last_send >= KEEPALIVE_S:
                last_send = time.monotonic()
                yield pb.AgentMessage(keepalive=pb.Keepalive(send_time_us=int(time.time() * 1e6)))


class NodeAgentServicer(pb_grpc.NodeAgentServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(self, state: AgentState) -> None:
        self.state = state

    def Describe(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.Hello:  # noqa: N802
        src = self.state.pipeline.source
        return pb.Hello(node=self.state.pipeline.node, mode=src.mode, binary=src.binary)

    def Stream(  # noqa: N802
        self, request_iterator: Iterator[pb.CoordinatorMessage], context: grpc.ServicerContext
    ) -> Iterator[pb.AgentMessage]:
        state = self.state
        first = next(request_iterator, None)
        if first is None or not first.HasField("subscribe"):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message must be a Subscribe")
            return
        sub = first.subscribe
        after = position_from_pb(sub.after) if sub.HasField("after") else BEFORE_ALL
        with state.cond:
            if after < state.acked:
                # What was acknowledged is forgotten: this subscriber would silently miss it.
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"node {state.pipeline.node} already delivered up to csn {state.acked[0]} to a "
                    "coordinator and no longer has it; restart the node agent to stream it again",
                )
                return
            state.generation += 1
            generation = state.generation
            state.cond.notify_all()
        active = threading.Event()
        active.set()

        def read_requests() -> None:
            try:
                for msg in request_iterator:
                    if msg.HasField("ack"):
                        a = msg.ack
                        # no `received`: an ack sent before the first batch arrived
                        got = position_from_pb(a.received) if a.HasField("received") else BEFORE_ALL
                        state.ack(got, a.confirm_lsn, a.final)
                        if a.final:
                            break
            except Exception:  # noqa: BLE001, S110 - the stream broke: the subscriber is gone
                pass
            finally:
                active.clear()
                with state.cond:
                    state.cond.notify_all()

        threading.Thread(target=read_requests, daemon=True, name="csnd-agent-acks").start()
        context.add_callback(active.clear)
        yield from state.messages(generation, after, active)


def serve(args: argparse.Namespace) -> int:
    spec = parse_source(args.source)
    if spec.is_grpc:
        raise ConfigError("csnd node serves one database node or recorded file, not another agent")
    source = open_source(spec, args, 0)
    pipeline = NodePipeline(source, args.decoders)
    state = AgentState(pipeline)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS)
    pb_grpc.add_NodeAgentServicer_to_server(NodeAgentServicer(state), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set("csnd.v1.NodeAgent", health_pb2.HealthCheckResponse.SERVING)
    try:
        port = server.add_insecure_port(args.listen)
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on {args.listen}: {e}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {args.listen}")
    server.start()
    host = args.listen.rsplit(":", 1)[0]
    print(f"csnd node {pipeline.node}: listening on {host}:{port}", file=sys.stderr, flush=True)
    threading.Thread(target=state.produce, daemon=True, name="csnd-agent-producer").start()
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stop.wait()
    with state.cond:
        state.stopping = True
        state.cond.notify_all()
    server.stop(grace=2).wait()
    pipeline.stop()
    print(f"csnd node {pipeline.node}: stopped", file=sys.stderr)
    return 0
