"""A Python client of the changefeed: transactions in CSN order, acknowledgements, reconnects.

    feed = Changefeed("host:7000", name="billing", tables=["public.acct"], token=...)
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
it is iterated again -- nothing is lost either way.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import queue
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import IO, Final, NamedTuple, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from csnd.core.backoff import Backoff
from csnd.core.errors import (
    ChangefeedError,
    ChangefeedRejected,
    ChangefeedUnauthenticated,
    ChangefeedUnavailable,
    ConfigError,
    CsnOutOfRange,
)
from csnd.core.tls import channel_credentials
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc

log = logging.getLogger("csnd.consumers.client")

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
CHANNEL_OPTIONS: Final = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    # grpc's own reconnect backoff grows to 2 minutes; ours decides instead.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

# How long the look at what answers at an unreachable address may take.
PROBE_TIMEOUT_S: Final = 2.0
NOTHING_THERE: Final = "nothing accepts connections there"
_HTTP1_PROBE: Final = b"HEAD / HTTP/1.0\r\n\r\n"

Record = tuple[int, bytes]
# Pieces of a large line are joined in memory up to this size; past it (in
# `next_spooled`) they go on in a temporary file.
SPOOL_MEMORY_BYTES: Final = 8 << 20


class _Piece(NamedTuple):
    """A piece of a line too large for one message (docs/design.md section 8, `more`)."""

    csn: int
    data: bytes
    more: bool


class _Joining:
    """The pieces of one large line received so far: in memory, or spooled to a temporary file."""

    def __init__(self, csn: int, spool: bool) -> None:
        self.csn = csn
        self.size = 0
        self.parts: list[bytes] | None = None if spool else []
        self.file = tempfile.SpooledTemporaryFile(SPOOL_MEMORY_BYTES) if spool else None  # noqa: SIM115

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.parts is not None:
            self.parts.append(data)
        else:
            assert self.file is not None
            self.file.write(data)

    def line(self) -> bytes | LargeLine:
        if self.parts is not None:
            return b"".join(self.parts)
        assert self.file is not None
        self.file.seek(0)
        return LargeLine(self.file, self.size)

    def drop(self) -> None:
        if self.file is not None:
            self.file.close()


class LargeLine:
    """A line that came in pieces, spooled (`Changefeed.next_spooled`): read it as a binary file.

    It is read once, before the next call to the changefeed, which closes it.
    """

    def __init__(self, file: IO[bytes], size: int) -> None:
        self.file = file
        self.size = size

    def read(self, n: int = -1) -> bytes:
        return self.file.read(n)

    def close(self) -> None:
        self.file.close()


class RelationRecord(NamedTuple):
    """A relation line (not a transaction): the version of a table in force from the transaction at `csn` on."""

    csn: int
    line: bytes


class _Relations(list[RelationRecord]):
    """(inbox item: a batch of relation lines)"""


_ACK: Final = object()  # (request queue marker: send the newest acknowledgement)
_CLOSE: Final = object()


def parse_target(target: str) -> str:
    """HOST:PORT (or grpc://HOST:PORT) -> HOST:PORT; ConfigError otherwise."""
    scheme, sep, _ = target.partition("://")
    if sep and scheme != "grpc":
        tls = " (for TLS add --tls-ca)" if scheme == "https" else ""
        raise ConfigError(
            f"target {target!r}: csnd does not take {scheme}:// here; give HOST:PORT or grpc://HOST:PORT, "
            f"the --listen address of csnd serve{tls}"
        )
    address = target.removeprefix("grpc://").rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"target {target!r} is not HOST:PORT (for example 127.0.0.1:7000)")
    return address


def why_unreachable(address: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """Why gRPC got no answer at `address`, in words: an unknown host, nothing listens there, or something else does.

    gRPC itself only says "failed to connect" whatever answered, so this
    opens a plain connection and asks `HEAD /` in HTTP/1.0 (which a gRPC
    server, HTTP/2 only, does not answer so).  A reply that starts `HTTP/`
    is an HTTP/1 server, most likely csnd serve's own dashboard (`--http`)
    given instead of its changefeed (`--listen`).
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as s:
            s.sendall(_HTTP1_PROBE)
            head = s.recv(16)
    except socket.gaierror as e:  # (not a closed port: a name that means nothing here)
        return f"the host {host} is not known ({e.strerror}); check the address"
    except OSError:
        return NOTHING_THERE
    if head.startswith(b"HTTP/"):
        return (
            f"{address} answers HTTP, not csnd's changefeed "
            "(is this the dashboard port? the changefeed is on the --listen port)"
        )
    return (
        f"something at {address} accepts connections but does not answer as csnd's changefeed "
        "(a service with TLS? then give its CA certificate)"
    )


def _channel(address: str, tls_ca: str | None) -> grpc.Channel:
    if tls_ca is None:
        return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
    # (the one builder of the project's TLS credentials, which reads and checks the PEM file)
    return grpc.secure_channel(address, channel_credentials(ca=tls_ca), CHANNEL_OPTIONS)


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return () if token is None else (("authorization", f"Bearer {token}"),)


def wait_reachable(channel: grpc.Channel, metadata: Sequence[tuple[str, str]], timeout: float) -> None:
    """Returns once the service at `channel` answers a health check; grpc.RpcError otherwise.

    (Not grpc.channel_ready_future: it polls the channel's state every 0.2 s,
    so every connection took at least that long.)  DEADLINE_EXCEEDED or
    UNAVAILABLE: nothing answered within `timeout`; any other code is the
    service's answer (a wrong token: UNAUTHENTICATED).
    """
    health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(), metadata=metadata, timeout=timeout, wait_for_ready=True
    )


def _rpc_text(e: grpc.RpcError) -> str:
    details = e.details() if hasattr(e, "details") else None
    return str(details or e).strip()


def permanent_error(e: grpc.RpcError, address: str) -> Exception | None:
    """The error to raise for a status a reconnect cannot fix; None for a transient one."""
    code = e.code() if hasattr(e, "code") else None
    text = _rpc_text(e)
    if code == grpc.StatusCode.UNAUTHENTICATED or code == grpc.StatusCode.PERMISSION_DENIED:
        return ChangefeedUnauthenticated(f"{address} refused us: {text}")
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return CsnOutOfRange(f"{address}: {text}")
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNIMPLEMENTED,
    ):
        return ChangefeedRejected(f"{address} rejected the request: {text}")
    if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.DATA_LOSS):
        return ChangefeedError(f"{address}: {text}")
    return None


class _Call:
    """One Subscribe stream: its request queue, its response thread, its results in the inbox."""

    def __init__(self, feed: Changefeed, start: pb.SubscribeStart) -> None:
        self.feed = feed
        self.requests: queue.Queue[object] = queue.Queue()
        self.done = threading.Event()
        self.subscribed: pb.Subscribed | None = None
        self.piecing = False  # a large line's pieces are arriving
        assert feed._stub is not None
        self.call = feed._stub.Subscribe(self._request_iter(start), metadata=feed._md)
        self.thread = threading.Thread(target=self._read, name="csnd-feed-responses", daemon=True)
        self.thread.start()

    def _request_iter(self, start: pb.SubscribeStart) -> Iterator[pb.SubscribeRequest]:
        yield pb.SubscribeRequest(start=start)
        while True:
            item = self.requests.get()
            if item is _CLOSE:
                return
            if item is _ACK:
                csn = self.feed._take_ack()
                if csn is not None:
                    yield pb.SubscribeRequest(ack=pb.SubscribeAck(csn=csn))
            else:
                assert isinstance(item, pb.SubscribeRequest)
                yield item

    def _put(self, item: object) -> bool:
        """Into the inbox, unless this call was abandoned meanwhile."""
        while not self.done.is_set():
            try:
                self.feed._inbox.put((self, item), timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        ended: object = None
        try:
            for msg in self.call:
                kind = msg.WhichOneof("body")
                if kind == "batch":
                    txns = msg.batch.transactions
                    if len(txns) == 1 and (txns[0].more or self.piecing):
                        # A piece of a large line (alone in its batch; the last one has no `more`).
                        self.piecing = txns[0].more
                        if not self._put(_Piece(txns[0].csn, txns[0].line, txns[0].more)):
                            return
                    elif not self._put([(t.csn, t.line) for t in txns]):
                        return
                elif kind == "relations":
                    if not self._put(
                        _Relations(RelationRecord(r.csn, r.line) for r in msg.relations.relations)
                    ):
                        return
                elif kind == "keepalive":
                    if msg.keepalive.reply_requested:
                        reply = pb.FeedKeepalive(send_time_us=int(time.time() * 1e6))
                        self.requests.put(pb.SubscribeRequest(keepalive=reply))
                elif kind == "subscribed":
                    self.subscribed = msg.subscribed
                    if not self._put(msg.subscribed):
                        return
        except grpc.RpcError as e:
            ended = e
        self._put(ended if ended is not None else _CLOSE)  # (_CLOSE: the service ended the stream)

    def cancel(self) -> None:
        self.done.set()
        self.requests.put(_CLOSE)
        self.call.cancel()


class Changefeed:
    """Iterate (csn, line) in CSN order; `ack(csn)` what you processed; `close()` when done.

    after_csn: deliver transactions with csn > after_csn (0: from the oldest
    retained).  None: for a named subscription, after its stored acknowledged
    CSN; otherwise from the oldest retained.  tables: `schema.table` filters
    (none, for a named subscription: the filter the name was last used with).
    schemas: also yield relation lines, as `RelationRecord`s.  format: "native"
    (the docs/design.md section 7 lines), "debezium" (each transaction's
    changes as Debezium change events, one per line of its `line`) or
    "debezium-adaptive" (the same, temporal values as Debezium's default
    `time.precision.mode=adaptive` writes them).
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
    ) -> None:
        self.address = parse_target(target)
        self.format = format
        self.name = name or ""
        self.tables = tuple(tables)
        self.schemas = schemas
        self._relation_lines: set[bytes] = set()  # handed out (a reconnect sends those in force again)
        self.connect_timeout = connect_timeout
        self.give_up = give_up
        self._tls_ca = tls_ca
        self._md = _metadata(token)
        self._after = after_csn  # where the next stream starts (None: the service decides)
        self._channel: grpc.Channel | None = None
        self._stub: pb_grpc.ChangefeedStub | None = None
        self._inbox: queue.Queue[tuple[_Call, object]] = queue.Queue(INBOX_BATCHES)
        self._call: _Call | None = None
        self._ended: list[_Call] = []  # cancelled streams whose response threads may still run
        self._pending: deque[tuple[int, bytes | LargeLine]] = deque()
        self._joining: _Joining | None = None  # the pieces of a large line so far
        self._handed_large: LargeLine | None = None  # closed at the next call
        self._connected_once = False
        self._retry_at = 0.0
        # The reconnect schedule; its outage (`down_since`) is since when no stream has
        # worked, its give-up the connect timeout until the first stream, then `give_up`.
        self.backoff = Backoff(
            time.monotonic, first=BACKOFF_FIRST_S, cap=BACKOFF_MAX_S, give_up=connect_timeout
        )
        self._last_error = ""
        self._ack_lock = threading.Lock()
        self._acked = 0  # the newest acknowledgement asked for
        self._ack_sent = 0  # the newest one handed to a stream
        self._closed = False
        self.last_csn: int | None = after_csn  # the last transaction handed out
        self.reconnects = 0
        self._lost_at: float | None = None  # when the stream was lost, until one is open again

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
        if self._handed_large is not None:
            self._handed_large.close()
            self._handed_large = None
        if self._pending:
            return self._hand_out()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise ChangefeedError(f"the changefeed to {self.address} is closed")
            if self._call is None and not self._connect(deadline):
                return None
            call = self._call
            assert call is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                # In slices: a signal (Ctrl-C) delivered to one of gRPC's threads
                # does not wake a main thread blocked without a timeout.
                owner, item = self._inbox.get(
                    timeout=WAIT_SLICE_S if left is None else min(left, WAIT_SLICE_S)
                )
            except queue.Empty:
                if left is None or left > WAIT_SLICE_S:
                    continue
                return None
            if owner is not call:
                continue  # (left over from an abandoned stream)
            if isinstance(item, _Relations):
                seen = self._relation_lines
                for r in item:
                    if r.line not in seen:
                        seen.add(r.line)
                        self._pending.append(r)
                if self._pending:
                    return self._hand_out()
            elif isinstance(item, _Piece):
                joining = self._joining
                if joining is None:
                    joining = self._joining = _Joining(item.csn, spool)
                elif item.csn != joining.csn:
                    self._drop_joining()
                    raise ChangefeedError(
                        f"{self.address} sent a piece of csn {item.csn} inside the line of csn {joining.csn}; "
                        "reconnect to recover"
                    )
                joining.add(item.data)
                if not item.more:
                    self._joining = None
                    line = joining.line()
                    if isinstance(line, LargeLine):
                        self._handed_large = line
                    self._pending.append((item.csn, line))
                    self.backoff.flowing()
                    return self._hand_out()
            elif isinstance(item, list):
                self._pending.extend(item)
                self.backoff.flowing()
                if self._pending:
                    return self._hand_out()
            elif isinstance(item, pb.Subscribed):
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
                if self.last_csn is None:
                    self.last_csn = item.after_csn
                if self._after is None or (self._after == 0 and self.last_csn == 0):
                    # "The service decides" and "the oldest retained" are resolved now, for
                    # good: a reconnect continues from that start (retention may have moved
                    # the oldest on meanwhile, past records this client never saw).
                    self._after = self.last_csn = item.after_csn
            else:
                self._lost(call, item)

    def _drop_joining(self) -> None:
        joining = self._joining
        if joining is not None:
            log.info(
                "changefeed %s: dropped %d bytes of the line of csn %d, cut short; it comes again whole",
                self.address,
                joining.size,
                joining.csn,
            )
            joining.drop()
            self._joining = None

    def take_ready(self, most: int) -> list[tuple[int, bytes]]:
        """The plain lines already received and next in order, up to `most`, without waiting.

        [] when none is: nothing has arrived, or what comes next is a relation
        line or a line that came in pieces (take those with `next_spooled`).
        For a consumer that passes a backlog on (`csnd subscribe`): a run of
        lines per call instead of one call per line.  Each is handed out as by
        `next`: in CSN order, checked.
        """
        if self._handed_large is not None:
            self._handed_large.close()
            self._handed_large = None
        pending = self._pending
        run: list[tuple[int, bytes]] = []
        take, keep = pending.popleft, run.append
        while pending and len(run) < most:
            rec = pending[0]
            if type(rec) is RelationRecord or type(rec[1]) is not bytes:
                break
            keep(take())  # type: ignore[arg-type]  # (its line is bytes: tested just above)
        if run:
            csns = [csn for csn, _ in run]
            last = self.last_csn
            if (last is not None and csns[0] <= last) or not all(map(operator.lt, csns, csns[1:])):
                for csn in csns:  # (the first out of place, named as `_hand_out` names it)
                    self._check_follows(csn, last)
                    last = csn
            self.last_csn = self._after = csns[-1]
        return run

    def _hand_out(self) -> tuple[int, bytes | LargeLine]:
        rec = self._pending.popleft()
        if type(rec) is RelationRecord:
            return rec
        csn, line = rec
        self._check_follows(csn, self.last_csn)
        self.last_csn = csn
        self._after = csn
        return csn, line

    def _check_follows(self, csn: int, last: int | None) -> None:
        """Refuse `csn` unless it comes after `last`, the CSN handed out before it.

        The service sends each transaction once, in order; a repeat here would
        be a bug on one side, and handing it out a duplicate.
        """
        if last is not None and csn <= last:
            raise ChangefeedError(f"{self.address} sent csn {csn} after csn {last}; reconnect to recover")

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
                self._channel = _channel(self.address, self._tls_ca)
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
            if self._after is not None:
                start.after_csn = self._after
            self._call = _Call(self, start)
            with self._ack_lock:
                self._ack_sent = 0  # (a new stream: the service has to hear the acknowledgement again)
            self._request_ack()
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
            if err is not None and e.code() != grpc.StatusCode.UNIMPLEMENTED:
                self.close()
                raise err from None
            # (UNIMPLEMENTED: a server without the health service; the stream will say more)
            return bool(e.code() == grpc.StatusCode.UNIMPLEMENTED)
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

    def _lost(self, call: _Call, item: object) -> None:
        """The stream ended: raise if reconnecting cannot help, else reconnect at the next look."""
        call.cancel()
        self._ended = [c for c in self._ended if c.thread.is_alive()]
        self._ended.append(call)
        self._call = None
        self._drop_joining()  # (the next stream sends the line again, whole)
        if isinstance(item, grpc.RpcError):
            err = permanent_error(item, self.address)
            if err is not None:
                self.close()
                raise err
            self._last_error = _rpc_text(item)
        else:
            self._last_error = "the service ended the stream"
        self.reconnects += 1
        if self._lost_at is None:
            self._lost_at = time.monotonic()
        log.warning(
            "changefeed %s: %s; reconnecting after csn %s", self.address, self._last_error, self._after
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
        with self._ack_lock:
            if csn <= self._acked:
                return
            self._acked = csn
        self._request_ack()

    def _request_ack(self) -> None:
        call = self._call
        if call is not None:
            call.requests.put(_ACK)

    def _take_ack(self) -> int | None:
        """For the request stream: the acknowledgement to send now, if any is new."""
        with self._ack_lock:
            if self._acked <= self._ack_sent:
                return None
            self._ack_sent = self._acked
            return self._acked

    # --- the end ----------------------------------------------------------------------------

    def close(self) -> None:
        """Sends the last acknowledgement, ends the stream and waits (briefly) for the service to store it."""
        if self._closed:
            return
        self._closed = True
        self._drop_joining()
        if self._handed_large is not None:
            self._handed_large.close()
        call = self._call
        self._call = None
        if call is not None:
            call.requests.put(_ACK)
            call.requests.put(_CLOSE)
            deadline = time.monotonic() + CLOSE_TIMEOUT_S
            while call.thread.is_alive() and time.monotonic() < deadline:
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
            ended.thread.join(max(0.0, deadline - time.monotonic()))
        self._ended = []

    def __enter__(self) -> Changefeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WholeLines:
    """The lines of Fetch's batches, a line sent in pieces (`more`, docs/design.md section 8) once it is whole.

    A piece of another csn before a line's last piece is a ChangefeedError
    naming `sender` (the service, as the caller calls it).
    """

    def __init__(self, sender: str) -> None:
        self.sender = sender
        self.csn: int | None = None  # the line whose pieces are being joined
        self.pieces: list[bytes] = []

    def of(self, batch: pb.TransactionBatch) -> Iterator[Record]:
        for t in batch.transactions:
            if self.csn is None and not t.more:
                yield t.csn, t.line
                continue
            if self.csn is not None and t.csn != self.csn:
                raise ChangefeedError(
                    f"{self.sender} sent csn {t.csn} before the last piece of csn {self.csn}"
                )
            self.csn = t.csn
            self.pieces.append(t.line)
            if not t.more:
                line = b"".join(self.pieces)
                self.csn, self.pieces = None, []
                yield t.csn, line


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
    channel = _channel(address, tls_ca)
    try:
        stub = pb_grpc.ChangefeedStub(channel)
        request = pb.FetchRequest(after_csn=after_csn, until_csn=until_csn, tables=tables)
        try:
            whole = WholeLines(f"the service at {address}")
            for msg in stub.Fetch(request, metadata=_metadata(token), timeout=timeout):
                yield from whole.of(msg.batch)
        except grpc.RpcError as e:
            err = permanent_error(e, address)
            if err is not None:
                raise err from None
            raise ChangefeedUnavailable(f"fetch from {address} failed: {_rpc_text(e)}") from None
    finally:
        channel.close()
