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
coordinator sends in its acknowledgements; a new one (`--create-slot`) is
made before the ready line, so that it streams every transaction committed
after the line (`LiveSource.prepare`).  The window itself is pure
(`csnd.runtime.window.AckWindow`); this module adds the lock, the waiting
and the gRPC service around it.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from types import FrameType
from typing import Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from csnd.coordinator.wire import BEFORE_ALL, Position, batch_to_pb, end_to_pb, position_from_pb
from csnd.core.errors import ConfigError
from csnd.proto import csnd_pb2 as pb
from csnd.proto import csnd_pb2_grpc as pb_grpc
from csnd.runtime.config import NodeAgentConfig
from csnd.runtime.inputs import NodePipeline
from csnd.runtime.items import EndItem, TxnItem, WatermarkItem, cut_batches
from csnd.runtime.remote import CHANNEL_OPTIONS
from csnd.runtime.sources import open_live, open_source, parse_source
from csnd.runtime.window import MAX_UNACKED, AckWindow, Entry

# An idle stream sends a keepalive this often, so the coordinator can tell a
# quiet node from a dead one.
KEEPALIVE_S: Final = 1.0
# How soon the main thread notices a stop signal that another thread received.
STOP_POLL_S: Final = 0.2
GRPC_OPTIONS: Final = [*CHANNEL_OPTIONS, ("grpc.http2.min_ping_interval_without_data_ms", 1000)]


class AgentState:
    """The node pipeline's output as a window of unacknowledged messages.

    `after_batch` is called by the producer after each batch it appended
    (tests slow the producer down with it, so a kill lands mid-stream).
    """

    def __init__(
        self,
        pipeline: NodePipeline,
        capacity: int = MAX_UNACKED,
        after_batch: Callable[[], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.cond = threading.Condition()
        self.window: AckWindow[pb.AgentMessage] = AckWindow(capacity)
        self.end: pb.AgentMessage | None = None
        self.generation = 0  # bumped by each new subscription; older streams stop
        self.stopping = False
        self.confirmed = 0
        self._after_batch = after_batch

    @property
    def acked(self) -> Position:
        return self.window.acked

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
                        self._append(pos, msg, is_batch=True)
                        if self._after_batch is not None:
                            self._after_batch()
                elif isinstance(item, WatermarkItem):
                    if item.csn < 0:
                        continue  # the sender has no watermark yet
                    self._append(
                        last_pos, pb.AgentMessage(watermark=pb.Watermark(csn=item.csn)), is_batch=False
                    )
                else:
                    assert isinstance(item, EndItem)
                    with self.cond:
                        self.end = pb.AgentMessage(end=end_to_pb(item.error))
                        self.cond.notify_all()
                    return
        except BaseException as e:  # (reported to the coordinator)
            with self.cond:
                self.end = pb.AgentMessage(end=end_to_pb(e))
                self.cond.notify_all()

    def _append(self, pos: Position, msg: pb.AgentMessage, is_batch: bool) -> None:
        with self.cond:
            if is_batch and pos <= self.window.acked:
                return  # the coordinator has it already (we restarted)
            while self.window.full and not self.stopping:
                self.cond.wait(0.5)  # back-pressure: the pipeline waits for acknowledgements
            self.window.append(pos, msg, is_batch)
            self.cond.notify_all()

    # --- coordinator side -------------------------------------------------------

    def ack(self, received: Position, confirm_lsn: int, final: bool) -> None:
        with self.cond:
            self.window.ack(received)
            self.cond.notify_all()
        pipe = self.pipeline
        advanced = confirm_lsn > self.confirmed
        if advanced:
            self.confirmed = confirm_lsn
        if final:
            # Even when an earlier Ack already carried this position: once the
            # stream has ended (--until-lsn) only confirm_final moves the slot,
            # and it does nothing twice.
            pipe.confirm_final(self.confirmed)
        elif advanced:
            pipe.confirm(confirm_lsn)

    def messages(
        self, generation: int, after: Position, active: threading.Event
    ) -> Iterator[pb.AgentMessage]:
        """What one subscription receives: the window after `after` (in order), new output, then End.

        Batches at or before `after` are not sent again; watermarks always are
        (they are idempotent, and a lost one could stall the merge on an idle
        node).
        """
        with self.cond:
            self.window.ack(after)
        sent_seq = 0
        last_send = time.monotonic()
        while True:
            entry: Entry[pb.AgentMessage] | None = None
            end: pb.AgentMessage | None = None
            with self.cond:
                if self.generation != generation or self.stopping or not active.is_set():
                    return
                entry, sent_seq = self.window.next_to_send(sent_seq, after)
                if entry is None:
                    end = self.end
                    if end is None:
                        self.cond.wait(0.2)
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

    def Describe(self, request: pb.DescribeRequest, context: grpc.ServicerContext) -> pb.Hello:
        pipe = self.state.pipeline
        return pb.Hello(node=pipe.node, mode=pipe.mode, binary=pipe.source.binary)

    def Stream(
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
            except Exception:  # (the stream broke: the subscriber is gone)
                pass
            finally:
                active.clear()
                with state.cond:
                    state.cond.notify_all()

        threading.Thread(target=read_requests, daemon=True, name="csnd-agent-acks").start()
        context.add_callback(active.clear)
        yield from state.messages(generation, after, active)


def serve(config: NodeAgentConfig, after_batch: Callable[[], None] | None = None) -> int:
    """Serve until SIGTERM or Ctrl-C; `after_batch` as in `AgentState`."""
    spec = parse_source(config.source)
    if spec.is_grpc:
        raise ConfigError("csnd node serves one database node or recorded file, not another agent")
    live = open_live(spec, config.live) if spec.is_live else None
    source = live if live is not None else open_source(spec, config.live, 0)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS)
    try:
        port = server.add_insecure_port(config.listen)  # (first: a taken port makes no slot)
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on {config.listen}: {e}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {config.listen}")
    if live is not None:
        live.prepare()  # the slot at its consistent point before the ready line
    pipeline = NodePipeline(source, config.decoders)
    state = AgentState(pipeline, after_batch=after_batch)
    pb_grpc.add_NodeAgentServicer_to_server(NodeAgentServicer(state), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    health_servicer.set("csnd.v1.NodeAgent", health_pb2.HealthCheckResponse.SERVING)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Before the ready line: whoever waits for it may stop us at once.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    host = config.listen.rsplit(":", 1)[0]
    print(f"csnd node {pipeline.node}: listening on {host}:{port}", file=sys.stderr, flush=True)
    threading.Thread(target=state.produce, daemon=True, name="csnd-agent-producer").start()
    # A timed wait, never a bare one: the kernel hands a process's signal to
    # any of its threads (gRPC's among them), and Python runs the handler only
    # when the main thread next runs bytecode -- which a main thread asleep
    # in an untimed wait never does, so the agent did not stop.
    while not stop.wait(STOP_POLL_S):
        pass
    with state.cond:
        state.stopping = True
        state.cond.notify_all()
    server.stop(grace=2).wait()
    pipeline.stop()
    print(f"csnd node {pipeline.node}: stopped", file=sys.stderr)
    return 0
