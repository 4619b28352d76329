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

Nobody else in: with `--token-file` every call but health checks needs the
token (`csnd.core.auth`, as the changefeed), with `--tls-cert` the
agent speaks TLS and with `--tls-client-ca` only a client holding a
certificate of that CA gets through the handshake.  An address beyond the
loopback needs the token and TLS unless `--insecure-listen` (checked in
`NodeAgentConfig`; a warning then on every start).  And whoever gets in
cannot move the slot past what the agent sent: an Ack whose confirm LSN is
beyond it (`AckWindow.confirm_limit`) ends that call with INVALID_ARGUMENT
and confirms nothing.
"""

from __future__ import annotations

import logging
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
from csnd.core.auth import AccessInterceptor, Credentials
from csnd.core.errors import AckError, ConfigError
from csnd.core.ids import INVALID_LSN, Lsn, lsn_to_str
from csnd.core.listening import check_listen
from csnd.core.reflection import enable_reflection
from csnd.core.tls import server_credentials
from csnd.core.tokens import read_token_file
from csnd.proto.agent.v1 import agent_pb2 as pb
from csnd.proto.agent.v1 import agent_pb2_grpc as pb_grpc
from csnd.proto.legacy import agent_pb2 as legacy_pb
from csnd.proto.legacy import agent_pb2_grpc as legacy_pb_grpc
from csnd.runtime.inputs import NodePipeline
from csnd.runtime.items import EndItem, TxnItem, WatermarkItem, cut_batches
from csnd.runtime.options import NodeAgentConfig
from csnd.runtime.remote import CHANNEL_OPTIONS
from csnd.runtime.sources import LiveNode, open_live, open_source, parse_source
from csnd.runtime.stopping import install_stop_handlers
from csnd.runtime.window import MAX_UNACKED, AckWindow, Entry

# An idle stream sends a keepalive this often, so the coordinator can tell a
# quiet node from a dead one.
KEEPALIVE_S: Final = 1.0
# How soon the main thread notices a stop signal that another thread received.
STOP_POLL_S: Final = 0.2
GRPC_OPTIONS: Final = [*CHANNEL_OPTIONS, ("grpc.http2.min_ping_interval_without_data_ms", 1000)]
# csnd.agent.v1.NodeAgent, and csnd.v1.NodeAgent: its name before the versioned packages (deprecated).
AGENT_SERVICE_NAMES: Final[tuple[str, ...]] = tuple(
    p.DESCRIPTOR.services_by_name["NodeAgent"].full_name for p in (pb, legacy_pb)
)

log = logging.getLogger(__name__)


class AgentState:
    """The node pipeline's output as a window of unacknowledged messages.

    `after_batch` is called by the producer after each batch it appended
    (tests slow the producer down with it, so a kill lands mid-stream).
    `resumed_lsn`: where the source's slot was confirmed when the agent
    started (a coordinator may confirm up to it before anything is sent).
    """

    def __init__(
        self,
        pipeline: NodePipeline,
        capacity: int = MAX_UNACKED,
        after_batch: Callable[[], None] | None = None,
        resumed_lsn: Lsn = INVALID_LSN,
    ) -> None:
        self.pipeline = pipeline
        self.cond = threading.Condition()
        self.window: AckWindow[pb.AgentMessage] = AckWindow(capacity, resumed_lsn)
        self.end: pb.AgentMessage | None = None
        self.generation = 0  # bumped by each new subscription; older streams stop
        self.stopping = False
        self.confirmed = INVALID_LSN
        self._after_batch = after_batch

    @property
    def acked(self) -> Position:
        return self.window.acked

    # --- producer (its own thread) ----------------------------------------------

    def produce(self) -> None:
        pipe = self.pipeline
        pipe.start(threading.Event(), alone=False)  # (cut into batches for a coordinator: never alone)
        last_pos: Position = BEFORE_ALL
        try:
            while not self.stopping:
                item = pipe.out.get()
                if isinstance(item, TxnItem):
                    for index, batch in enumerate(cut_batches(item.txn)):
                        pos = (batch.csn, index)
                        last_pos = pos
                        confirmable = item.confirmable if index == 0 else None
                        msg = pb.AgentMessage(batch=batch_to_pb(batch, index, confirmable))
                        self._append(pos, msg, is_batch=True, lsn=confirmable or INVALID_LSN)
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

    def _append(self, pos: Position, msg: pb.AgentMessage, is_batch: bool, lsn: Lsn = INVALID_LSN) -> None:
        with self.cond:
            # (a batch the coordinator has already -- we restarted -- is passed over at once)
            while self.window.full and not self.stopping and not (is_batch and pos <= self.window.acked):
                self.cond.wait(0.5)  # back-pressure: the pipeline waits for acknowledgements
            self.window.append(pos, msg, is_batch, lsn)
            self.cond.notify_all()

    # --- coordinator side -------------------------------------------------------

    def ack(self, received: Position, confirm_lsn: Lsn, final: bool) -> None:
        """The coordinator has every batch at or before `received` and its output is durable to `confirm_lsn`.

        AckError, and nothing acknowledged or confirmed, if `received` or
        `confirm_lsn` is beyond what this agent sent (`AckWindow.received_ok`,
        `AckWindow.confirm_limit`).
        """
        with self.cond:
            if not self.window.received_ok(received):
                raise AckError(
                    f"the coordinator acknowledged csn {received[0]} batch {received[1]}, beyond the last "
                    f"batch this agent sent (csn {self.window.sent[0]} batch {self.window.sent[1]}); "
                    "refused, the slot stays where it is",
                    node=self.pipeline.node,
                )
            limit = self.window.confirm_limit(confirm_lsn, ended=self.end is not None)
            if limit is None:
                raise AckError(
                    f"the coordinator confirmed {lsn_to_str(confirm_lsn)}{self._slot_text()}, beyond "
                    f"{lsn_to_str(self.window.sent_lsn)}, the furthest this agent has sent; refused, "
                    "the slot stays where it is",
                    node=self.pipeline.node,
                )
            self.window.ack(received)
            self.cond.notify_all()
        pipe = self.pipeline
        advanced = limit > self.confirmed
        if advanced:
            self.confirmed = limit
        if final:
            # Even when an earlier Ack already carried this position: once the
            # stream has ended (--until-lsn) only confirm_final moves the slot,
            # and it does nothing twice.
            pipe.confirm_final(self.confirmed)
        elif advanced:
            pipe.confirm(limit)

    def _slot_text(self) -> str:
        slot = self.pipeline.slot_name
        return f" for slot {slot}" if slot else ""

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
        refused: list[AckError] = []

        def read_requests() -> None:
            try:
                for msg in request_iterator:
                    if msg.HasField("ack"):
                        a = msg.ack
                        # no `received`: an ack sent before the first batch arrived
                        got = position_from_pb(a.received) if a.HasField("received") else BEFORE_ALL
                        state.ack(got, Lsn(a.confirm_lsn), a.final)
                        if a.final:
                            break
            except AckError as e:
                log.warning("%s (from %s)", e, context.peer())
                refused.append(e)
            except Exception:  # (the stream broke: the subscriber is gone)
                pass
            finally:
                active.clear()
                with state.cond:
                    state.cond.notify_all()

        threading.Thread(target=read_requests, daemon=True, name="csnd-agent-acks").start()
        context.add_callback(active.clear)
        yield from state.messages(generation, after, active)
        if refused:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(refused[0]))


def serve(config: NodeAgentConfig, after_batch: Callable[[], None] | None = None) -> int:
    """Serve until SIGTERM, SIGHUP or Ctrl-C; `after_batch` as in `AgentState`.

    Until the ready line a stop interrupts the start-up where it is: a new
    slot may wait there for long transactions on the server (its consistent
    point), and a stop while it waited went unheeded.  As an exception in
    the main thread it cancels the slot's creation on its way out.
    """
    install_stop_handlers()  # (from the ready line on, `_serve` takes the signals itself)
    try:
        return _serve(config, after_batch)
    except KeyboardInterrupt:
        name = parse_source(config.source).name or "dn1"
        print(
            f"csnd node {name}: stopped during start-up, before the ready line", file=sys.stderr, flush=True
        )
        return 0


def _serve(config: NodeAgentConfig, after_batch: Callable[[], None] | None) -> int:
    spec = parse_source(config.source)
    if spec.is_grpc:
        raise ConfigError("csnd node serves one database node or recorded file, not another agent")
    live = open_live(spec, config.live) if spec.is_live else None
    opened = LiveNode(live) if live is not None else open_source(spec, config.live, 0)
    token = read_token_file(config.token_file) if config.token_file else None
    access = Credentials.of(token, None)  # (the one token: every call)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        # (health checks stay open: a probe cannot send the token, and they tell nothing of the data)
        interceptors=[AccessInterceptor(access)] if access is not None else [],
        options=GRPC_OPTIONS,
    )
    check_listen(config.listen)  # (first: a taken port makes no slot; the cause in words)
    try:
        if config.tls is None:
            port = server.add_insecure_port(config.listen)
        else:
            port = server.add_secure_port(config.listen, server_credentials(config.tls))
    except RuntimeError as e:
        raise ConfigError(f"cannot listen on {config.listen}: {e}") from None
    if port == 0:
        raise ConfigError(f"cannot listen on {config.listen}")
    resumed_lsn = INVALID_LSN
    if live is not None:
        live.prepare()  # the slot at its consistent point before the ready line
        resumed_lsn = live.slot_position()
    pipeline = NodePipeline(opened, config.decoders)
    state = AgentState(pipeline, after_batch=after_batch, resumed_lsn=resumed_lsn)
    servicer = NodeAgentServicer(state)
    pb_grpc.add_NodeAgentServicer_to_server(servicer, server)
    # (and under its earlier name, deprecated: a merge of the previous release still reaches it)
    legacy_pb_grpc.add_NodeAgentServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for service in AGENT_SERVICE_NAMES:
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    # (what grpcurl and friends ask first; behind the token like every call but health checks)
    enable_reflection(server, (*AGENT_SERVICE_NAMES, "grpc.health.v1.Health"))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Before the ready line: whoever waits for it may stop us at once.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    server.start()
    host = config.listen.rsplit(":", 1)[0]
    print(f"csnd node {pipeline.node}: listening on {host}:{port}", file=sys.stderr, flush=True)
    if config.exposed:  # (allowed by --insecure-listen: said on every start)
        unprotected = " and ".join(
            what for what, given in (("a token", token), ("TLS", config.tls)) if not given
        )
        print(
            f"csnd node {pipeline.node}: warning: serving {host}:{port} without {unprotected} "
            "(--insecure-listen): anyone who reaches it can read every row and move the slot",
            file=sys.stderr,
            flush=True,
        )
    if live is not None:  # (after the ready line, which scripts read first)
        log.info(
            "node %s resumes from slot %s at lsn %s",
            live.node,
            live.options.slot,
            lsn_to_str(resumed_lsn),
            extra={"node": live.node, "lsn": resumed_lsn},
        )
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
