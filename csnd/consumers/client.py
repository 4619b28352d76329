"""A Python client of the changefeed: transactions in CSN order, acknowledgements, reconnects.

    feed = ChangefeedClient("host:7000", name="billing", tables=["public.acct"], token=...)
    for csn, line in feed:          # line: the docs/design.md section 7 JSON line (bytes)
        process(line)
        feed.ack(csn)               # named: the service stores it; a restart continues after it
    feed.close()

                 ┌────────── one Subscribe stream at a time ──────────┐
    user thread ◄┤ inbox (bounded) ◄─ response thread ◄─ batches       │◄─ service
        ack() ──►│ request queue ─────────────────────► start, acks,   │
                 │                                       keepalive replies
                 └─────────────────────────────────────────────────────┘

With `schemas=True` the iteration also yields relation lines
(docs/design.md section 7: a table's column names and types), each a
`RelationRecord` -- a (csn, line) too, told apart by its type -- before the
first transaction it is in force with; never acknowledge one (its csn is
that transaction's, still to come).  The versions in force at the start
come first; after a reconnect the ones already handed out are not repeated.

A lost connection (service restarted, network cut, the service dropped us
for silence) is not an error: the client opens a new stream after the last
transaction it handed out, with exponential backoff and jitter
(`csnd.core.backoff`: the consumers of a restarted service do not all come
back in the same instant), so the caller sees no gap and no duplicate.
Errors that a reconnect cannot fix raise at once: a refused token
(ChangefeedUnauthenticated), a malformed request (ChangefeedRejected), a
start older than the retained changelog (CsnOutOfRange), or nothing
reachable -- within `connect_timeout` at the first connect, within
`give_up` after a loss (ChangefeedUnavailable).

The response thread answers keepalives while the caller works, but it stops
reading when the inbox is full: a caller that does not iterate for longer
than the service's client timeout is dropped, and the client reconnects when
it is iterated again -- nothing is lost either way.  With `read_on_caller`
(`csnd subscribe`) there is neither response thread nor inbox: the caller's
thread reads the stream itself inside next(), one hand-off a message fewer.

The client's parts, each in a module of its own: reaching the service and
its failures in words (csnd.consumers.connection), one Subscribe stream and
its threads (csnd.consumers.stream), what arrived handed out in order
(csnd.consumers.delivery), the lines themselves (csnd.consumers.lines).
`ChangefeedClient` was called `Changefeed`, as the gRPC service is: that
name stays importable for the programs that use it.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, cast

import grpc

from csnd.consumers.connection import (
    CHANNEL_OPTIONS,
    NOTHING_THERE,
    PROBE_TIMEOUT_S,
    call_metadata,
    open_channel,
    parse_target,
    permanent_error,
    rpc_code,
    rpc_text,
    wait_reachable,
    why_unreachable,
)
from csnd.consumers.delivery import Delivery
from csnd.consumers.lines import (
    SPOOL_MEMORY_BYTES,
    LargeLine,
    Piece,
    Record,
    RelationRecord,
    Relations,
    WholeLines,
)
from csnd.consumers.stream import Acks, Inbox, SubscribeStream
from csnd.core.backoff import Backoff
from csnd.core.errors import ChangefeedError, ChangefeedUnavailable
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc

log = logging.getLogger("csnd.consumers.client")

__all__ = [
    "BACKOFF_FIRST_S",
    "BACKOFF_MAX_S",
    "CHANNEL_OPTIONS",
    "CONNECT_TIMEOUT_S",
    "GIVE_UP_S",
    "NOTHING_THERE",
    "PROBE_TIMEOUT_S",
    "SPOOL_MEMORY_BYTES",
    "Changefeed",
    "ChangefeedClient",
    "LargeLine",
    "Record",
    "RelationRecord",
    "WholeLines",
    "fetch",
    "parse_target",
    "permanent_error",
    "wait_reachable",
    "why_unreachable",
]

# Nothing reachable for this long at the first connect is an error (a typo
# in the address should not look like a quiet service).
CONNECT_TIMEOUT_S: Final = 5.0
# After a lost connection, how long to keep trying before giving up.
# None: for ever (a consumer that should outlive a long service outage).
GIVE_UP_S: Final = 300.0
# Reconnect backoff (csnd.core.backoff): the first wait's ceiling, doubling up to
# the cap.  A short first wait finds a quickly restarted service at once; the cap
# bounds how long a consumer waits past the moment the service is back.  The
# ceiling is also how long each attempt waits for the service to answer.
BACKOFF_FIRST_S: Final = 0.1
BACKOFF_MAX_S: Final = 5.0
# Batches received but not yet handed out (each up to the server's batch bound).
INBOX_BATCHES: Final = 16
# A close() waits this long for the service to store the last acknowledgement.
CLOSE_TIMEOUT_S: Final = 5.0
# The longest the caller's thread blocks at once while waiting for transactions.
WAIT_SLICE_S: Final = 0.5
# A stream that has sent nothing for this long is taken for dead and opened
# again: the service sends a keepalive every 5 s, so this is three missed in a
# row.  A path that died without a reset (a black hole) is otherwise noticed
# only by gRPC's HTTP/2 pings, which such a path held up about 60 s.
SILENCE_S: Final = 15.0


@dataclass(frozen=True)
class Silent:
    """How a stream ended that sent nothing for longer than SILENCE_S (the client gave it up)."""

    seconds: float


class ChangefeedClient:
    """Iterate (csn, line) in CSN order; `ack(csn)` what you processed; `close()` when done.

    after_csn: deliver transactions with csn > after_csn (0: from the oldest
    retained).  None: for a named subscription, after its stored acknowledged
    CSN; otherwise from the oldest retained.  tables: `schema.table` filters
    (none, for a named subscription: the filter the name was last used with).
    schemas: also yield relation lines, as `RelationRecord`s.  format: "native"
    (the docs/design.md section 7 lines), "debezium" (each transaction's
    changes as Debezium change events, one per line of its `line`) or
    "debezium-adaptive" (the same, temporal values as Debezium's default
    `time.precision.mode=adaptive` writes them).  read_on_caller: read each
    stream on the caller's thread, in next() and next_spooled(), instead of in a
    response thread (csnd.consumers.callerread): one wake-up a live message
    fewer, but keepalives are answered only while the caller is in next(), so
    a caller that stays away longer than the service's client timeout (30 s
    by default) is dropped and reconnects -- for a caller that always waits
    for the next line, as `csnd subscribe` does.
    """

    def __init__(
        self,
        target: str,
        *,
        after_csn: int | None = None,
        name: str | None = None,
        tables: Sequence[str] = (),
        token: str | None = None,
        tls_ca: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        give_up: float | None = GIVE_UP_S,
        schemas: bool = False,
        format: str = "native",
        read_on_caller: bool = False,
    ) -> None:
        self.address = parse_target(target)
        self.read_on_caller = read_on_caller
        self.format = format
        self.name = name or ""
        self.tables = tuple(tables)
        self.schemas = schemas
        self.connect_timeout = connect_timeout
        self.give_up = give_up
        self._tls_ca = tls_ca
        self._md = call_metadata(token)
        # What arrived, handed out in order; its last_csn is also where the next stream
        # starts (None: the service decides).
        self._delivery = Delivery(self.address, after_csn)
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.ChangefeedStub | None = None
        self._inbox: Inbox = queue.Queue(INBOX_BATCHES)
        self._call: SubscribeStream | None = None
        self._ended: list[SubscribeStream] = []  # cancelled streams whose response threads may still run
        self._connected_once = False
        self._retry_at = 0.0
        # The reconnect schedule; its outage (`down_since`) is since when no stream has
        # worked, its give-up the connect timeout until the first stream, then `give_up`.
        self.backoff = Backoff(
            time.monotonic, first=BACKOFF_FIRST_S, cap=BACKOFF_MAX_S, give_up=connect_timeout
        )
        self._last_error = ""
        self._acks = Acks()
        self._closed = False
        self.reconnects = 0
        self._lost_at: float | None = None  # when the stream was lost, until one is open again

    @property
    def last_csn(self) -> int | None:
        """The last transaction handed out (before any: the start, once known)."""
        return self._delivery.last_csn

    # --- iteration ------------------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        while True:
            rec = self.next()
            assert rec is not None
            yield rec

    def connect(self) -> None:
        """Opens the first stream now instead of at the first next(); returns once the service answers.

        Raises as next() would: ChangefeedUnavailable when nothing answers
        within `connect_timeout`, ChangefeedUnauthenticated for a refused
        token.  For a caller that times its own waits (an idle timeout):
        time spent reaching nothing is not time spent idle.
        """
        if self._closed:
            raise ChangefeedError(f"the changefeed to {self.address} is closed")
        if self._call is None:
            self._connect(None)

    def next(self, timeout: float | None = None) -> Record | None:
        """The next transaction; None when none arrived within `timeout` seconds."""
        return cast("Record | None", self._next(timeout, spool=False))

    def next_spooled(self, timeout: float | None = None) -> tuple[int, bytes | LargeLine] | None:
        """As `next`, but a line that came in pieces comes as a LargeLine, spooled past SPOOL_MEMORY_BYTES.

        For a consumer that passes lines on (`csnd subscribe`): a gigabyte
        transaction then costs it a temporary file, not a gigabyte of memory.
        """
        return self._next(timeout, spool=True)

    def _next(self, timeout: float | None, spool: bool) -> tuple[int, bytes | LargeLine] | None:
        delivery = self._delivery
        delivery.close_handed()
        if delivery.pending:
            return delivery.hand_out()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise ChangefeedError(f"the changefeed to {self.address} is closed")
            if self._call is None and not self._connect(deadline):
                return None
            call = self._call
            assert call is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # In slices: a signal (Ctrl-C) delivered to one of gRPC's threads
            # does not wake a main thread blocked without a timeout.
            wait = WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S)
            if call.reader is not None:  # (read on this thread)
                got = call.receive(wait)
                owner, item = call, got
            else:
                try:
                    owner, item = self._inbox.get(timeout=wait)
                except queue.Empty:
                    got = None
                else:
                    got = item
            if got is None:
                silent = call.silent_for()
                if silent > SILENCE_S:
                    self._lost(call, Silent(silent))
                    continue
                if left is None or left > WAIT_SLICE_S:
                    continue
                return None
            if owner is not call:
                continue  # (left over from an abandoned stream)
            if isinstance(item, Relations):
                delivery.add_relations(item)
                if delivery.pending:
                    return delivery.hand_out()
            elif isinstance(item, Piece):
                if delivery.add_piece(item, spool):
                    self.backoff.flowing()
                    return delivery.hand_out()
            elif isinstance(item, list):
                delivery.pending.extend(item)
                self.backoff.flowing()
                if delivery.pending:
                    return delivery.hand_out()
            elif isinstance(item, pb.Subscribed):
                self._subscribed(item)
            else:
                self._lost(call, item)

    def _subscribed(self, item: pb.Subscribed) -> None:
        """A stream started: where, said in the log when it ends an outage or starts past the end."""
        if self._lost_at is not None:  # (an operator wants to see the outage end, not only begin)
            log.warning(
                "changefeed %s: reconnected after %.1f s, continuing after csn %d",
                self.address,
                time.monotonic() - self._lost_at,
                item.after_csn,
                extra={"csn": item.after_csn},
            )
            self._lost_at = None
        elif not self._connected_once and item.after_csn > item.newest_csn:  # (said once)
            log.warning(
                "changefeed %s: csn %d is past the newest csn %d: nothing comes until transactions "
                "after it are committed",
                self.address,
                item.after_csn,
                item.newest_csn,
            )
        self._connected_once = True
        self.backoff.give_up = self.give_up
        self.backoff.flowing()
        if self._delivery.last_csn is None or self._delivery.last_csn == 0:
            # "The service decides" and "the oldest retained" are resolved now, for
            # good: a reconnect continues from that start (retention may have moved
            # the oldest on meanwhile, past records this client never saw).
            self._delivery.last_csn = item.after_csn

    def take_ready(self, most: int) -> list[Record]:
        """The plain lines already received and next in order, up to `most`, without waiting.

        [] when none is: nothing has arrived, or what comes next is a relation
        line or a line that came in pieces (take those with `next_spooled`).
        For a consumer that passes a backlog on (`csnd subscribe`): a run of
        lines per call instead of one call per line.  Each is handed out as by
        `next`: in CSN order, checked.
        """
        return self._delivery.take_ready(most)

    # --- connecting -----------------------------------------------------------------

    def _connect(self, deadline: float | None) -> bool:
        """Opens a stream after the last transaction handed out; False if `deadline` passed first."""
        while True:
            now = time.monotonic()
            self.backoff.lost()  # (the outage starts with the first attempt, or began with the lost stream)
            if now < self._retry_at:  # (backing off after a failed stream)
                if deadline is not None and deadline <= self._retry_at:
                    time.sleep(max(0.0, deadline - now))
                    return False
                time.sleep(self._retry_at - now)
            if self._channel is None:
                self._channel = open_channel(self.address, self._tls_ca)
                self._stub = pb_grpc.ChangefeedStub(self._channel)
            wait = self.backoff.ceiling
            left = self.backoff.left()
            if left is not None:  # (do not wait past the point of giving up)
                wait = min(wait, left)
            if not self._reachable(max(wait, 0.05)):
                self._last_error = NOTHING_THERE
                self._failed()
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                continue
            start = pb.SubscribeStart(
                name=self.name, tables=self.tables, schemas=self.schemas, format=self.format
            )
            if self._delivery.last_csn is not None:
                start.after_csn = self._delivery.last_csn
            assert self._stub is not None
            self._call = SubscribeStream(
                self._stub, self._md, start, self._inbox, self._acks, on_caller=self.read_on_caller
            )
            self._acks.resend()  # (a new stream: the service has to hear the acknowledgement again)
            self._call.send_ack()
            return True

    def _reachable(self, wait: float) -> bool:
        """Whether the service answers a health check within `wait` seconds.

        A refusal a reconnect cannot fix, such as a wrong token, is raised.
        """
        assert self._channel is not None
        try:
            wait_reachable(self._channel, self._md, wait)
        except grpc.RpcError as e:
            err = permanent_error(e, self.address)
            unimplemented = bool(rpc_code(e) == grpc.StatusCode.UNIMPLEMENTED)
            if err is not None and not unimplemented:
                self.close()
                raise err from None
            # (UNIMPLEMENTED: a server without the health service; the stream will say more)
            return unimplemented
        return True

    def _failed(self) -> None:
        """A connection attempt or a stream failed: back off, or give up when it lasted too long."""
        limit = self.backoff.give_up
        wait = self.backoff.failed()
        if wait is None:
            self.close()
            if self._last_error == NOTHING_THERE:
                why = why_unreachable(self.address)
                if why != NOTHING_THERE:  # (something answers, and it is not the changefeed: say so)
                    raise ChangefeedUnavailable(why)
            what = "went away and did not come back" if self._connected_once else "does not answer"
            raise ChangefeedUnavailable(
                f"the changefeed service at {self.address} {what} within {limit:g} s "
                f"({self._last_error}); check the address and that csnd serve is running"
            )
        self._retry_at = time.monotonic() + wait

    def _lost(self, call: SubscribeStream, item: object) -> None:
        """The stream ended: raise if reconnecting cannot help, else reconnect at the next look."""
        call.cancel()
        self._ended = [c for c in self._ended if c.running()]
        self._ended.append(call)
        self._call = None
        self._delivery.drop_joining()  # (the next stream sends the line again, whole)
        if isinstance(item, grpc.RpcError):
            err = permanent_error(item, self.address)
            if err is not None:
                self.close()
                raise err
            self._last_error = rpc_text(item)
        elif isinstance(item, Silent):
            self._last_error = (
                f"nothing from the service for {item.seconds:.0f} s (it sends a keepalive every 5 s): "
                "the connection is taken for dead"
            )
        else:
            self._last_error = "the service ended the stream"
        self.reconnects += 1
        if self._lost_at is None:
            self._lost_at = time.monotonic()
        log.warning(
            "changefeed %s: %s; reconnecting after csn %s",
            self.address,
            self._last_error,
            self._delivery.last_csn,
        )
        self._channel_reset()
        self.backoff.lost()
        self._failed()

    def _channel_reset(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    # --- acknowledgements ---------------------------------------------------------------

    def ack(self, csn: int) -> None:
        """Everything through `csn` is processed (sent to the service within a moment)."""
        if self._acks.ask(csn):
            call = self._call
            if call is not None:
                call.send_ack()

    # --- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Sends the last acknowledgement, ends the stream and waits (briefly) for the service to store it."""
        if self._closed:
            return
        self._closed = True
        self._delivery.close()
        call = self._call
        self._call = None
        if call is not None:
            call.send_ack()
            call.end_requests()
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while call.running() and time.monotonic() < deadline:
                if call.reader is not None:
                    call.receive(0.05)  # (until the service ends the stream, having stored the ack)
                    continue
                with contextlib.suppress(queue.Empty):
                    self._inbox.get(timeout=0.05)  # (make room: the response thread may be blocked)
            call.cancel()
            self._ended.append(call)
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        # A response thread still inside gRPC when the interpreter exits is frozen
        # there holding its call's lock, and the call's finaliser then waits on
        # that lock for ever (`csnd subscribe --limit N` printed its lines and
        # never exited).  Cancelled, each ends within a moment: wait for them.
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for ended in self._ended:
            ended.join(max(0.0, deadline - time.monotonic()))
        self._ended = []

    def __enter__(self) -> ChangefeedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The client's name before `ChangefeedClient` (the gRPC service is the Changefeed): kept for the
# programs and examples that use it.
Changefeed = ChangefeedClient


def fetch(
    target: str,
    after_csn: int = 0,
    until_csn: int = 0,
    *,
    tables: Sequence[str] = (),
    token: str | None = None,
    tls_ca: str | None = None,
    timeout: float | None = None,
) -> Iterator[Record]:
    """The transactions in (after_csn, until_csn] durable now (until 0: the newest), in order."""
    address = parse_target(target)
    channel = open_channel(address, tls_ca)
    try:
        stub = pb_grpc.ChangefeedStub(channel)
        request = pb.FetchRequest(after_csn=after_csn, until_csn=until_csn, tables=tables)
        try:
            whole = WholeLines(f"the service at {address}")
            for msg in stub.Fetch(request, metadata=call_metadata(token), timeout=timeout):
                yield from whole.of(msg.batch)
        except grpc.RpcError as e:
            err = permanent_error(e, address)
            if err is not None:
                raise err from None
            raise ChangefeedUnavailable(f"fetch from {address} failed: {rpc_text(e)}") from None
    finally:
        channel.close()
