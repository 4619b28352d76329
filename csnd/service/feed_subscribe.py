"""Subscribe: one stream per subscriber, whole transactions from its start, then waiting for more.

    client ── SubscribeStart ──►  handler ── open_at / open_oldest ─► TableFilter (─► format) ─► BatchBuilder ─► batches
           ── acks, keepalives ─► request thread ─► FeedConsumers (acks) ─► MarkKeeper (named marks, stored)

One handler thread per subscriber reads the changelog from the subscriber's
start, sends whole transactions in batches under a size bound, and when it
reaches the durable end waits for more (`wait_durable`).  The changelog is
the buffer: a slow subscriber only reads further behind, it never holds back
the writer or the sources.  gRPC's flow control blocks the handler while the
client does not read, so nothing piles up in memory.

Every `keepalive_s` the server sends a keepalive asking for a reply; a client
that sends nothing (no reply, no ack) for `client_timeout_s` is dropped with
UNAVAILABLE, so a vanished consumer does not keep a thread and a name
forever (one that stopped reading altogether: csnd.service.feed_watchdog).
A named stream's table filter is stored with its mark, and one that names no
tables gets the name's.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Final

import grpc

from csnd.core.errors import AckError, ChangelogCorrupt, CsnOutOfRange, OutputError
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.batching import BatchBuilder, Record
from csnd.service.debezium import FORMATS as DEBEZIUM_FORMATS
from csnd.service.debezium import DebeziumFormat, RelationTypes
from csnd.service.feed_aborts import abort, bad_line, damaged, out_of_range, refuse_unknown, table_filter
from csnd.service.feed_consumers import FeedConsumers
from csnd.service.feed_ending import Ending
from csnd.service.feed_marks import MarkKeeper
from csnd.service.feed_messages import (
    batch_response,
    keepalive,
    piece_responses,
    pieces_kept,
    relations_response,
)
from csnd.service.feed_ports import StoredRecord, StreamLog
from csnd.service.feed_reading import open_at, open_oldest, read_from
from csnd.service.filtering import LineFilter, Reshaped
from csnd.service.knowntables import KnownTables
from csnd.service.latency import COMMIT_TO_SENT

_log = logging.getLogger("csnd.changefeed")

if TYPE_CHECKING:
    from csnd.core.auth import Credentials
    from csnd.service.changefeed import FeedSettings

# Longest wait on the changelog before a stream looks at its stop conditions
# again (server stopping, client gone or silent).  Smaller: a quicker stop;
# larger: fewer wake-ups of idle subscribers.
WAIT_S: Final = 0.5
# While a stream reads records it sends nothing for (filtered out), it looks
# at its stop conditions and keepalive clock every this many records.
CHECK_EVERY: Final = 1024
NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")


class _Stream:
    """What a Subscribe handler and its request thread share."""

    __slots__ = ("first", "got_first", "cid", "registered", "closed", "error")

    def __init__(self) -> None:
        self.first: pb.SubscribeRequest | None = None
        self.got_first = threading.Event()
        self.cid: int | None = None  # set once the consumer is registered
        self.registered = threading.Event()  # (also set when the call ends)
        self.closed = threading.Event()  # the client half-closed, or the call ended
        self.error: str | None = None  # a bad message from the client


class SubscribeStreams:
    """The Subscribe RPC: each call's start checked, its consumer registered, its stream sent."""

    def __init__(
        self,
        log: StreamLog,
        consumers: FeedConsumers,
        marks: MarkKeeper,
        settings: FeedSettings,
        known_tables: KnownTables,
        stopping: threading.Event,
        *,
        credentials: Credentials | None,
        databases: Mapping[str, str],
        ending: Ending | None = None,
    ) -> None:
        self.log = log
        self.consumers = consumers
        self.marks = marks
        self.settings = settings
        self.known_tables = known_tables
        self.stopping = stopping
        # Who may hold which named subscription (None: anyone; the server checks the rest)
        self.credentials = credentials
        # Each node's database name, for the Debezium formats' `source.db`
        self.databases = databases
        # The failure the streams end with when the service ends on one (csnd.service.feed_ending)
        self.ending = ending or Ending()

    def subscribe(
        self, request_iterator: Iterator[pb.SubscribeRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.SubscribeResponse | bytes]:
        s = self.settings
        stream = _Stream()
        context.add_callback(stream.registered.set)
        threading.Thread(
            target=self._read_requests,
            args=(request_iterator, stream),
            name="csnd-feed-requests",
            daemon=True,
        ).start()
        if not stream.got_first.wait(s.first_message_timeout_s):
            abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, "no SubscribeStart message arrived in time")
        first = stream.first
        if first is None or not first.HasField("start"):
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a SubscribeStart")
        start = first.start
        table_filter(start.tables, context)  # (a malformed filter or format fails before anything else)
        convert = self._converter(start.format, context)
        refuse_unknown(self.known_tables, start.tables, context)
        name = start.name
        if name and not NAME_RE.fullmatch(name):
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"subscription name {name!r} must be 1-128 letters, digits and _.:@- (starting with a "
                "letter or digit)",
            )
        if name and self.marks.store is None:
            abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this service keeps no named subscriptions; subscribe without a name",
            )
        if name:
            self._may_hold(name, context)
        mark, tables = self.consumers.start_of(name, start.tables)
        filt_tables = table_filter(tables, context)
        filt: LineFilter = (
            filt_tables if convert is None else Reshaped(filt_tables, convert.convert, convert.events)
        )
        max_bytes = s.max_batch_bytes
        if start.HasField("after_csn") and start.after_csn:
            after = start.after_csn
            records = open_at(self.log, after, max_bytes, context)
        elif mark is not None and not start.HasField("after_csn"):
            after = mark  # (its mark, 0 too, is checked like any start: never moved silently)
            records = open_at(self.log, after, max_bytes, context, name=name)
        else:
            after, records = open_oldest(self.log, max_bytes, context)
        cid = self.consumers.connect(context.peer(), name, tables, after, context)
        stream.cid = cid
        stream.registered.set()
        try:
            if name and mark is None:
                # A new name's mark is where its stream starts, durable before the stream answers:
                # a reconnect before its first acknowledgement resumes exactly there.
                self._store_marks(context)
            log = self.log
            yield pb.SubscribeResponse(
                subscribed=pb.Subscribed(
                    after_csn=after, oldest_csn=log.oldest_csn, newest_csn=log.visible_csn
                )
            )
            yield from self._stream(cid, after, records, filt, stream, context, start.schemas)
        finally:
            self.consumers.disconnect(cid)
            try:
                self.marks.store_marks()
            except OutputError as e:  # (the stream ends anyway: said once, as the line it is)
                _log.warning("%s", e)

    def _store_marks(self, context: grpc.ServicerContext, now: float | None = None) -> None:
        """Store the named marks (when due, given `now`); a store that fails (a full disk) ends the
        stream UNAVAILABLE with the store's one line, never a traceback per stream."""
        try:
            if now is None:
                self.marks.store_marks()
            else:
                self.marks.store_if_due(now)
        except OutputError as e:
            abort(context, grpc.StatusCode.UNAVAILABLE, str(e))

    def _converter(self, fmt: str, context: grpc.ServicerContext) -> DebeziumFormat | None:
        """What a stream's `format` does to each line it sends (None: nothing, the native lines)."""
        if fmt in ("", "native"):
            return None
        if fmt == "debezium":
            return DebeziumFormat(self.databases)
        if fmt == "debezium-adaptive":
            return DebeziumFormat(self.databases, RelationTypes(self.log.relations))
        abort(
            context,
            grpc.StatusCode.INVALID_ARGUMENT,
            f"unknown format {fmt!r}: csnd sends native, {' or '.join(DEBEZIUM_FORMATS)}",
        )

    def _may_hold(self, name: str, context: grpc.ServicerContext) -> None:
        """PERMISSION_DENIED unless the call's credential may hold the named subscription."""
        if self.credentials is None:
            return
        who = self.credentials.identify(context.invocation_metadata())
        if who is None or not who.may_hold(name):
            held = ", ".join(who.subscriptions) if who is not None and who.subscriptions else "none"
            abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"credential {who.name if who else '?'!r} may not hold subscription {name!r} (it may hold: "
                f"{held}); the service's --credentials-file lists what each credential may hold",
            )

    def _read_requests(self, requests: Iterator[pb.SubscribeRequest], stream: _Stream) -> None:
        """The request thread: the start, then every message is a sign of life, and an ack moves the mark."""
        try:
            stream.first = next(requests, None)
            stream.got_first.set()
            if stream.first is None:
                return
            stream.registered.wait()
            cid = stream.cid
            if cid is None:
                return  # (the handler refused the start, or the call ended)
            for msg in requests:
                try:
                    self.consumers.heard(cid, msg.ack.csn if msg.HasField("ack") else None)
                except AckError as e:
                    stream.error = str(e)
                    return
        except Exception:  # (the call broke: the client is gone)
            pass
        finally:
            stream.got_first.set()
            stream.closed.set()
            self.log.wake_waiters()

    def _stream(
        self,
        cid: int,
        after: int,
        records: Iterator[StoredRecord] | None,
        filt: LineFilter,
        stream: _Stream,
        context: grpc.ServicerContext,
        schemas: bool = False,
    ) -> Iterator[pb.SubscribeResponse | bytes]:
        s = self.settings
        log = self.log
        noted = self.consumers.sent

        def sent(cid: int, csn: int, n: int, batch: list[Record] | None = None) -> None:
            noted(cid, csn, n)
            if batch:
                COMMIT_TO_SENT.observe_lines([line for _, line in batch])

        builder = BatchBuilder(s.max_batch_bytes)
        pos = after
        next_keepalive = time.monotonic() + s.keepalive_s
        # Relation lines: the versions in force after the start, then each new one
        # before the first transaction it is in force with (in its own message: a
        # batch that holds transactions before it goes first).
        relations = log.relations if schemas else None
        if relations is not None:
            first = relations.between(0, after, filt.matches)
            if first:
                yield relations_response(first)
        while True:
            seen = 0
            try:
                if records is None:
                    records = read_from(log, pos, s.max_batch_bytes)
                for csn, line in records:
                    if relations is not None and relations.has_between(pos, csn):
                        fresh = relations.between(pos, csn, filt.matches)
                        if fresh:
                            batch = builder.flush()
                            if batch:
                                sent(cid, batch[-1][0], len(batch), batch)
                                yield batch_response(batch)
                            yield relations_response(fresh)
                    pos = csn
                    if not isinstance(line, bytes):
                        # Too large for one message: sent in pieces, each in a batch of its own.
                        pieces = pieces_kept(csn, line, filt, s.max_batch_bytes, context)
                        if pieces is not None:
                            batch = builder.flush()
                            if batch:
                                sent(cid, batch[-1][0], len(batch), batch)
                                yield batch_response(batch)
                            # Marked sent before its pieces go, as a batch is before it is
                            # yielded: the client may acknowledge the line as soon as the last
                            # piece arrives, before this generator runs again.
                            sent(cid, csn, 1)
                            for piece in piece_responses(csn, pieces, pb.SubscribeResponse):
                                yield piece
                                if self._ended(cid, stream, context, pos):
                                    return
                                if time.monotonic() >= next_keepalive:
                                    # (a client acknowledges only whole lines: without a keepalive to
                                    # answer it would be silent for as long as a large line takes, and
                                    # dropped part-way for it, to start the same line again)
                                    next_keepalive = time.monotonic() + s.keepalive_s
                                    yield keepalive()
                        seen += 1
                        continue
                    try:
                        kept = filt.keep(line)
                    except ValueError as e:
                        bad_line(context, csn, e)
                    if kept is not None and (batch := builder.add(csn, kept)) is not None:
                        sent(cid, batch[-1][0], len(batch), batch)
                        yield batch_response(batch)
                        if self._ended(cid, stream, context, pos):
                            return
                    seen += 1
                    if seen % CHECK_EVERY == 0:
                        if self._ended(cid, stream, context, pos):
                            return
                        if time.monotonic() >= next_keepalive:
                            next_keepalive = time.monotonic() + s.keepalive_s
                            yield keepalive()
            except CsnOutOfRange as e:  # (retention removed what this slow reader still needed)
                name, mark = self.consumers.mark_of(cid)
                out_of_range(context, mark if name else pos, e, name)
            except ChangelogCorrupt as e:
                damaged(context, e)
            batch = builder.flush()
            sent(cid, pos, len(batch or ()), batch)
            if batch:
                yield batch_response(batch)
            if self._ended(cid, stream, context, pos):
                return
            now = time.monotonic()
            if now >= next_keepalive:
                next_keepalive = now + s.keepalive_s
                yield keepalive()
            self._store_marks(context, now)
            # (a client that half-closes, as an acknowledgement does, ends the wait at once:
            # it waits for the end of the stream, which stores its mark)
            log.wait_durable(
                pos, min(WAIT_S, max(0.0, next_keepalive - time.monotonic())), stream.closed.is_set
            )
            records = None

    def _ended(self, cid: int, stream: _Stream, context: grpc.ServicerContext, pos: int) -> bool:
        """True when the stream should end quietly; aborts when it must end with an error.

        `pos`: the csn the stream has sent through (a service ending on a failure
        first sends what its changelog holds, for a bounded time)."""
        if self.ending.failure is not None and not stream.closed.is_set() and context.is_active():
            failure = self.ending.due(pos)
            if failure is not None:
                abort(context, failure.code, failure.details)
        elif self.stopping.is_set() or stream.closed.is_set() or not context.is_active():
            if stream.error is not None:
                abort(context, grpc.StatusCode.INVALID_ARGUMENT, stream.error)
            return True
        last_heard = self.consumers.last_heard(cid)
        if last_heard is None:
            abort(
                context,
                grpc.StatusCode.ABORTED,
                "another connection took this subscription name over; this one ends",
            )
        if time.monotonic() - last_heard > self.settings.client_timeout_s:
            abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"no reply to keepalives for {self.settings.client_timeout_s:g} s: the consumer was dropped; "
                "reconnect to continue",
            )
        return False
