"""The Changefeed gRPC service over a durable changelog (docs/design.md sections 5 and 7).

    client ── SubscribeStart ──►  Subscribe handler ── log.read(after) ─► TableFilter ─► BatchBuilder ─► batches
           ── acks, keepalives ─► request thread ─► ConsumerRegistry ─► SubscriptionStore (named marks)
                                                 (under the servicer's lock; Status reads it)

One handler thread per subscriber reads the changelog from the subscriber's
start, sends whole transactions in batches under a size bound, and when it
reaches the durable end waits for more (`wait_durable`).  The changelog is
the buffer: a slow subscriber only reads further behind, it never holds back
the writer or the sources.  gRPC's flow control blocks the handler while the
client does not read, so nothing piles up in memory.

Every `keepalive_s` the server sends a keepalive asking for a reply; a client
that sends nothing (no reply, no ack) for `client_timeout_s` is dropped with
UNAVAILABLE, so a vanished consumer does not keep a thread and a name
forever.  Acknowledgements of a named subscription are kept as a high-water
mark and written to the SubscriptionStore at most every `store_interval_s`
(each write is an fsync) and whenever a stream ends, so a consumer that acks
and closes finds its mark stored; a named stream's table filter is stored
with it, and one that names no tables gets the name's.

Operators manage the names (ListSubscriptions, ResetSubscription,
DeleteSubscription: `csnd subscriptions`).  A reset or delete is refused
while a stream holds the name, and is durable before it is answered; it
holds the store's lock throughout, so a periodic store of the old mark
cannot land after it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NoReturn, TypeVar, cast

import grpc

from csnd import __version__
from csnd.core.compiled import compiled_module
from csnd.core.errors import (
    AckError,
    ChangelogCorrupt,
    CsnOutOfRange,
    SnapshotError,
    SubscriptionBusy,
    SubscriptionNotFound,
)
from csnd.core.hostid import host_id
from csnd.proto import csnd_pb2 as pb
from csnd.proto import csnd_pb2_grpc as pb_grpc
from csnd.service.batching import MAX_BATCH_BYTES, BatchBuilder, Record
from csnd.service.debezium import FORMATS as DEBEZIUM_FORMATS
from csnd.service.debezium import ColumnTypesUnknown, DebeziumFormat, RelationTypes
from csnd.service.filtering import LineFilter, Reshaped, TableFilter
from csnd.service.knowntables import KnownTables
from csnd.service.registry import ConsumerRegistry
from csnd.service.status import NodeStatusSource

log = logging.getLogger("csnd.changefeed")

if TYPE_CHECKING:
    from csnd.changelog import Changelog, RecordPieces, RelationEntry, SubscriptionStore
    from csnd.core.auth import Credentials
    from csnd.service.arrow_rows import RowBlocks

# Longest wait on the changelog before a stream looks at its stop conditions
# again (server stopping, client gone or silent).  Smaller: a quicker stop;
# larger: fewer wake-ups of idle subscribers.
WAIT_S: Final = 0.5
# While a stream reads records it sends nothing for (filtered out), it looks
# at its stop conditions and keepalive clock every this many records.
CHECK_EVERY: Final = 1024
NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_Resp = TypeVar("_Resp", pb.SubscribeResponse, pb.FetchResponse)
# A changelog record as a stream reads it: whole, or one too large for a message, unread.
StoredRecord = tuple[int, "bytes | RecordPieces"]


@dataclass(frozen=True)
class FeedSettings:
    # Bound of one batch message (see csnd.service.batching).
    max_batch_bytes: int = MAX_BATCH_BYTES
    # Rows in one Arrow message of Fetch(format="arrow"), by their size
    # uncompressed (on the wire they take about a seventh).  Larger: fewer
    # record batches for Spark to take in; smaller: less memory per Fetch.
    arrow_message_bytes: int = 8 << 20
    # Where Fetch(format="arrow") readers on this host (client_host) find the
    # rows as files (csnd.service.arrow_rows): "" is <changelog>/arrow-files,
    # None writes none (every reader gets bytes).
    arrow_files_dir: str | None = ""
    # Disk those files may take (the least recently read dropped first); 0:
    # none.  (arrow_rows.FILES_BUDGET_BYTES: that module needs pyarrow.)
    arrow_files_bytes: int = 1 << 30
    # How often the server asks a subscriber for a sign of life.  Smaller:
    # a dead consumer is found sooner, at the cost of a message each way.
    keepalive_s: float = 5.0
    # Silence after which a subscriber is dropped: several keepalives, so a
    # consumer busy with one large batch is not dropped by accident.
    client_timeout_s: float = 30.0
    # How long a new stream may take to say where it starts.
    first_message_timeout_s: float = 10.0
    # Named marks are written (fsync) at most this often while streams run.
    store_interval_s: float = 1.0
    # Status counts a consumer's lag in transactions (Changelog.count_after)
    # up to this many, then says "at least".
    lag_count_cap: int = 10_000


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


class ChangefeedServicer(pb_grpc.ChangefeedServicer):  # type: ignore[misc]  # generated, untyped
    def __init__(
        self,
        log: Changelog,
        *,
        subscriptions: SubscriptionStore | None = None,
        status: NodeStatusSource | None = None,
        settings: FeedSettings | None = None,
        directory: str = "",
        credentials: Credentials | None = None,
        databases: Mapping[str, str] | None = None,
    ) -> None:
        self.log = log
        # Each node's database name, for the Debezium formats' `source.db` (nodes the service connects to)
        self.databases = dict(databases or {})
        # Who may hold which named subscription (None: anyone; the server checks the rest)
        self.credentials = credentials
        # The tables a filter may name: the changelog's relations, and the sources'
        # publications once the service tells them (`known_tables.published`)
        self.known_tables = KnownTables(getattr(log, "relations", None))
        self.subscriptions = subscriptions
        self.status_source = status
        self.settings = settings or FeedSettings()
        self.directory = directory or getattr(log, "directory", "")
        self.lock = threading.Lock()
        self.registry = ConsumerRegistry.from_store(
            subscriptions.all() if subscriptions else {}, subscriptions.tables() if subscriptions else {}
        )
        self._store_lock = threading.Lock()
        self._last_store = time.monotonic()
        self._calls: dict[int, grpc.ServicerContext] = {}  # consumer id -> its call (for the watchdog)
        self.stopping = threading.Event()
        # The service's incremental snapshots (csnd.snapshot.incremental.IncrementalSnapshots), if any
        self.snapshots: Any = None
        self._row_blocks: RowBlocks | None = None  # Fetch(format="arrow")'s rows, made on first use
        self._arrow_missing_logged = False
        threading.Thread(target=self._watchdog, name="csnd-feed-watchdog", daemon=True).start()
        if subscriptions is not None:  # (named marks hold the changelog's retention, up to its hold limits)
            log.add_retention_holder(self._retention_holds)

    # --- Subscribe ----------------------------------------------------------------

    def Subscribe(  # noqa: N802
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
            _abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, "no SubscribeStart message arrived in time")
        first = stream.first
        if first is None or not first.HasField("start"):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a SubscribeStart")
        start = first.start
        _table_filter(start.tables, context)  # (a malformed filter or format fails before anything else)
        convert = self._converter(start.format, context)
        self._refuse_unknown(start.tables, context)
        name = start.name
        if name and not NAME_RE.fullmatch(name):
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"subscription name {name!r} must be 1-128 letters, digits and _.:@- (starting with a "
                "letter or digit)",
            )
        if name and self.subscriptions is None:
            _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this service keeps no named subscriptions; subscribe without a name",
            )
        if name:
            self._may_hold(name, context)
        with self.lock:
            mark = self.registry.named.get(name) if name else None
            tables = self.registry.tables_for(name, start.tables)
        table_filter = _table_filter(tables, context)
        filt: LineFilter = (
            table_filter if convert is None else Reshaped(table_filter, convert.convert, convert.events)
        )
        if start.HasField("after_csn") and start.after_csn:
            after = start.after_csn
            records = self._open(after, context)
        elif mark is not None and not start.HasField("after_csn"):
            after = mark  # (its mark, 0 too, is checked like any start: never moved silently)
            records = self._open(after, context, name=name)
        else:
            after, records = self._open_oldest(context)
        with self.lock:
            consumer = self.registry.connect(context.peer(), name, tables, after, time.monotonic())
        stream.cid = consumer.id
        stream.registered.set()
        with self.lock:
            self._calls[consumer.id] = context
        if name and mark is None:
            # A new name's mark is where its stream starts, durable before the stream answers:
            # a reconnect before its first acknowledgement resumes exactly there.
            self._store_marks()
        try:
            log = self.log
            yield pb.SubscribeResponse(
                subscribed=pb.Subscribed(
                    after_csn=after, oldest_csn=log.oldest_csn, newest_csn=log.visible_csn
                )
            )
            yield from self._stream(consumer.id, after, records, filt, stream, context, start.schemas)
        finally:
            with self.lock:
                self.registry.disconnect(consumer.id)
                self._calls.pop(consumer.id, None)
            self._store_marks()

    def _converter(self, fmt: str, context: grpc.ServicerContext) -> DebeziumFormat | None:
        """What a stream's `format` does to each line it sends (None: nothing, the native lines)."""
        if fmt in ("", "native"):
            return None
        if fmt == "debezium":
            return DebeziumFormat(self.databases)
        if fmt == "debezium-adaptive":
            store = getattr(self.log, "relations", None)
            return DebeziumFormat(self.databases, RelationTypes(store) if store is not None else _no_types)
        _abort(
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
            _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"credential {who.name if who else '?'!r} may not hold subscription {name!r} (it may hold: "
                f"{held}); the service's --credentials-file lists what each credential may hold",
            )

    def _refuse_unknown(self, specs: Any, context: grpc.ServicerContext) -> None:
        """INVALID_ARGUMENT naming the filter's tables that no source publishes (a typo must not read nothing)."""
        unknown = self.known_tables.unknown(specs)
        if unknown:
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"no published table is named {', '.join(unknown)}: the service knows no such table (its "
                "sources' publications and the changelog's tables); check the spelling (SCHEMA.TABLE, "
                "SCHEMA.*), or add it to the publication first",
            )

    def _read_requests(self, requests: Iterator[pb.SubscribeRequest], stream: _Stream) -> None:
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
                with self.lock:
                    self.registry.heard(cid, time.monotonic())
                    if msg.HasField("ack"):
                        try:
                            self.registry.ack(cid, msg.ack.csn)
                        except AckError as e:
                            stream.error = str(e)
                            return
        except Exception:  # noqa: BLE001, S110 - the call broke: the client is gone
            pass
        finally:
            stream.got_first.set()
            stream.closed.set()
            self.log.wake_waiters()

    def _open(self, after: int, context: grpc.ServicerContext, name: str = "") -> Iterator[StoredRecord]:
        """`log.read(after)` with its first record already read, so a start out of range fails here.

        csn 0 is csn 0 here, not "the oldest retained" (`_open_oldest`):
        `name`'s mark at 0 with records after 0 dropped is a gap, OUT_OF_RANGE.
        """
        try:
            records = self._read_from(after)
            first = next(records, None)
        except CsnOutOfRange as e:
            _out_of_range(context, after, e, name)
        except ChangelogCorrupt as e:
            _damaged(context, e)
        if first is None:
            return iter(())
        return _chain(first, records)

    def _open_oldest(self, context: grpc.ServicerContext) -> tuple[int, Iterator[StoredRecord]]:
        """A start at the oldest retained: where that is (the csn before it), and the records after it."""
        for attempt in (0, 1):
            after = self.log.oldest_after_csn
            try:
                records = self._read_from(after)
                first = next(records, None)
            except CsnOutOfRange as e:
                if attempt:  # (retention ran between the look and the read, twice)
                    _out_of_range(context, after, e)
                continue
            except ChangelogCorrupt as e:
                _damaged(context, e)
            return after, iter(()) if first is None else _chain(first, records)
        raise AssertionError("unreachable: the second attempt returns or aborts")

    def _read_from(self, after: int) -> Iterator[StoredRecord]:
        return self.log.read_pieced(after, whole_up_to=self.settings.max_batch_bytes, strict=True)

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
                yield _relations_response(first)
        while True:
            seen = 0
            try:
                if records is None:
                    records = self._read_from(pos)
                for csn, line in records:
                    if relations is not None and relations.has_between(pos, csn):
                        fresh = relations.between(pos, csn, filt.matches)
                        if fresh:
                            batch = builder.flush()
                            if batch:
                                self._sent(cid, batch[-1][0], len(batch))
                                yield _batch_response(batch)
                            yield _relations_response(fresh)
                    pos = csn
                    if not isinstance(line, bytes):
                        # Too large for one message: sent in pieces, each in a batch of its own.
                        pieces = _pieces_kept(csn, line, filt, s.max_batch_bytes, context)
                        if pieces is not None:
                            batch = builder.flush()
                            if batch:
                                self._sent(cid, batch[-1][0], len(batch))
                                yield _batch_response(batch)
                            # Marked sent before its pieces go, as a batch is before it is
                            # yielded: the client may acknowledge the line as soon as the last
                            # piece arrives, before this generator runs again.
                            self._sent(cid, csn, 1)
                            for piece in _piece_responses(csn, pieces, pb.SubscribeResponse):
                                yield piece
                                if self._ended(cid, stream, context):
                                    return
                                if time.monotonic() >= next_keepalive:
                                    # (a client acknowledges only whole lines: without a keepalive to
                                    # answer it would be silent for as long as a large line takes, and
                                    # dropped part-way for it, to start the same line again)
                                    next_keepalive = time.monotonic() + s.keepalive_s
                                    yield _keepalive()
                        seen += 1
                        continue
                    try:
                        kept = filt.keep(line)
                    except ValueError as e:
                        _bad_line(context, csn, e)
                    if kept is not None and (batch := builder.add(csn, kept)) is not None:
                        self._sent(cid, batch[-1][0], len(batch))
                        yield _batch_response(batch)
                        if self._ended(cid, stream, context):
                            return
                    seen += 1
                    if seen % CHECK_EVERY == 0:
                        if self._ended(cid, stream, context):
                            return
                        if time.monotonic() >= next_keepalive:
                            next_keepalive = time.monotonic() + s.keepalive_s
                            yield _keepalive()
            except CsnOutOfRange as e:  # (retention removed what this slow reader still needed)
                name, mark = self._mark_of(cid)
                _out_of_range(context, mark if name else pos, e, name)
            except ChangelogCorrupt as e:
                _damaged(context, e)
            batch = builder.flush()
            self._sent(cid, pos, len(batch or ()))
            if batch:
                yield _batch_response(batch)
            if self._ended(cid, stream, context):
                return
            now = time.monotonic()
            if now >= next_keepalive:
                next_keepalive = now + s.keepalive_s
                yield _keepalive()
            if now - self._last_store >= s.store_interval_s:
                self._store_marks()
            # (a client that half-closes, as an acknowledgement does, ends the wait at once:
            # it waits for the end of the stream, which stores its mark)
            log.wait_durable(
                pos, min(WAIT_S, max(0.0, next_keepalive - time.monotonic())), stream.closed.is_set
            )
            records = None

    def _mark_of(self, cid: int) -> tuple[str, int]:
        """A consumer's name ("" if anonymous) and acknowledged csn."""
        with self.lock:
            c = self.registry.consumers.get(cid)
            return (c.name, c.acked) if c is not None else ("", 0)

    def _sent(self, cid: int, csn: int, transactions: int) -> None:
        with self.lock:
            self.registry.sent(cid, csn, transactions)

    def _ended(self, cid: int, stream: _Stream, context: grpc.ServicerContext) -> bool:
        """True when the stream should end quietly; aborts when it must end with an error."""
        if self.stopping.is_set() or stream.closed.is_set() or not context.is_active():
            if stream.error is not None:
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, stream.error)
            return True
        with self.lock:
            consumer = self.registry.consumers.get(cid)
            silent = (
                consumer is not None
                and time.monotonic() - consumer.last_heard > self.settings.client_timeout_s
            )
        if consumer is None:
            _abort(
                context,
                grpc.StatusCode.ABORTED,
                "another connection took this subscription name over; this one ends",
            )
        if silent:
            _abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"no reply to keepalives for {self.settings.client_timeout_s:g} s: the consumer was dropped; "
                "reconnect to continue",
            )
        return False

    def _watchdog(self) -> None:
        """Cancels the calls of consumers silent for well past the timeout.

        A stream's handler drops a silent client itself (with a message), but
        only when it gets to look: a client that stopped reading altogether
        leaves the handler blocked in gRPC's flow control, and only a cancel
        from outside frees the thread and the name.
        """
        s = self.settings
        grace = s.client_timeout_s + 2 * max(WAIT_S, s.keepalive_s)
        while not self.stopping.wait(min(s.keepalive_s, s.client_timeout_s)):
            with self.lock:
                stuck = [
                    self._calls[c] for c in self.registry.silent(time.monotonic(), grace) if c in self._calls
                ]
            for context in stuck:
                context.cancel()

    def _store_marks(self) -> None:
        """Writes the named marks and filters that changed (one fsync each) to the SubscriptionStore."""
        if self.subscriptions is None:
            return
        with self._store_lock:
            self._last_store = time.monotonic()
            with self.lock:
                todo = self.registry.unstored()
            for name, (csn, tables) in sorted(todo.items()):
                self.subscriptions.set(name, csn, tables)
                with self.lock:
                    self.registry.stored(name, csn, tables)

    # --- incremental snapshots ------------------------------------------------------------

    def StartSnapshot(  # noqa: N802
        self, request: pb.StartSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.SnapshotStatus:
        jobs = self.snapshots
        if jobs is None:
            _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this service takes no incremental snapshots: it reads no live PostgreSQL source itself",
            )
        try:
            jobs.submit(list(request.tables), request.node or None, request.chunk_rows)
        except ValueError as e:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except RuntimeError as e:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except SnapshotError as e:  # (a node the service cannot read now: its error names it)
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return incremental_status(jobs)

    # --- managing named subscriptions ----------------------------------------------------

    def ListSubscriptions(  # noqa: N802
        self, request: pb.ListSubscriptionsRequest, context: grpc.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        self._store_or_abort(context)
        with self.lock:
            names = sorted(self.registry.named)
        infos = [info for name in names if (info := self._info(name)) is not None]
        return pb.ListSubscriptionsResponse(subscriptions=infos)

    def ResetSubscription(  # noqa: N802
        self, request: pb.ResetSubscriptionRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionInfo:
        store = self._store_or_abort(context)
        name, csn = request.name, request.csn or self.log.oldest_after_csn  # (0: the oldest retained)
        newest = self.log.durable_csn
        if csn > newest:
            _abort(
                context,
                grpc.StatusCode.OUT_OF_RANGE,
                f"cannot reset subscription {name!r} to csn {csn}: the newest durable csn is {newest}",
            )
        self._open(csn, context)  # (a start that retention dropped is refused here, OUT_OF_RANGE)
        with self._store_lock:
            with self.lock:
                try:
                    before = self.registry.reset(name, csn)
                except (SubscriptionNotFound, SubscriptionBusy) as e:
                    _refuse(context, e)
                tables = self.registry.filters.get(name, ())
            store.set(name, csn, tables)
            with self.lock:
                self.registry.stored(name, csn, tables)
        info = self._info(name) or pb.SubscriptionInfo(name=name, acknowledged_csn=csn, tables=tables)
        info.previous_csn = before
        return info

    def DeleteSubscription(  # noqa: N802
        self, request: pb.DeleteSubscriptionRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionInfo:
        store = self._store_or_abort(context)
        name = request.name
        info = self._info(name)
        with self._store_lock:
            with self.lock:
                try:
                    csn, tables = self.registry.delete(name)
                except (SubscriptionNotFound, SubscriptionBusy) as e:
                    _refuse(context, e)
            store.delete(name)
        return info or pb.SubscriptionInfo(name=name, acknowledged_csn=csn, tables=tables)

    def _store_or_abort(self, context: grpc.ServicerContext) -> SubscriptionStore:
        if self.subscriptions is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "this service keeps no named subscriptions")
        return self.subscriptions

    def _info(self, name: str) -> pb.SubscriptionInfo | None:
        """A named subscription as it is now (None: no such name)."""
        with self.lock:
            acked = self.registry.named.get(name)
            if acked is None:
                return None
            tables = self.registry.filters.get(name, ())
            holder = self.registry.holder(name)
            peer = holder.peer if holder is not None else ""
        lag, at_least = self._lag(acked)
        return pb.SubscriptionInfo(
            name=name,
            acknowledged_csn=acked,
            tables=tables,
            connected=holder is not None,
            peer=peer,
            lag_transactions=lag,
            lag_at_least=at_least,
        )

    # --- Fetch ----------------------------------------------------------------------

    def Fetch(
        self, request: pb.FetchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchResponse | bytes]:  # noqa: N802
        filt = _table_filter(request.tables, context)
        self._refuse_unknown(request.tables, context)
        after, until = request.after_csn, request.until_csn
        if until and until < after:
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"until_csn {until} is before after_csn {after}: the range is empty",
            )
        if request.format not in ("", "lines", "arrow"):
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown fetch format {request.format!r}: csnd sends lines or arrow",
            )
        until = until or self.log.visible_csn
        if until == 0:
            return
        if request.format == "arrow" and (blocks := self._arrow_rows()) is not None:
            files = bool(request.client_host) and request.client_host == host_id()
            yield from self._fetch_arrow(blocks, after, until, filt, files, context)
            return
        builder = BatchBuilder(self.settings.max_batch_bytes)
        try:
            max_bytes = self.settings.max_batch_bytes
            for csn, line in self.log.read_pieced(after, until, whole_up_to=max_bytes):
                if not isinstance(line, bytes):
                    pieces = _pieces_kept(csn, line, filt, max_bytes, context)
                    if pieces is not None:
                        batch = builder.flush()
                        if batch:
                            yield _fetch_response(batch)
                        yield from _piece_responses(csn, pieces, pb.FetchResponse)
                    continue
                try:
                    kept = filt.keep(line)
                except ValueError as e:
                    _bad_line(context, csn, e)
                if kept is not None and (batch := builder.add(csn, kept)) is not None:
                    yield _fetch_response(batch)
                    if self.stopping.is_set():
                        _abort(context, grpc.StatusCode.UNAVAILABLE, "the service is stopping; fetch again")
        except CsnOutOfRange as e:
            _out_of_range(context, after, e)
        except ChangelogCorrupt as e:
            _damaged(context, e)
        batch = builder.flush()
        if batch:
            yield _fetch_response(batch)

    def _arrow_rows(self) -> RowBlocks | None:
        """The rows Fetch(format="arrow") sends, made on first use; None without pyarrow (lines instead)."""
        with self.lock:
            if self._row_blocks is None:
                try:
                    from csnd.service import arrow_rows
                except ImportError as e:  # (the `spark` extra is not installed here)
                    if not self._arrow_missing_logged:
                        log.warning("changefeed: Arrow fetches are answered with lines: %s", e)
                        self._arrow_missing_logged = True
                    return None
                s = self.settings
                files_dir = s.arrow_files_dir if s.arrow_files_bytes > 0 else None
                if files_dir == "":
                    files_dir = os.path.join(self.directory, "arrow-files") if self.directory else None
                try:
                    self._row_blocks = arrow_rows.RowBlocks(
                        self.log,
                        s.arrow_message_bytes,
                        files_dir=files_dir,
                        files_budget_bytes=s.arrow_files_bytes,
                    )
                except OSError as e:  # (the directory cannot be made: every reader gets bytes)
                    log.warning("changefeed: Arrow rows are sent as bytes only: %s: %s", files_dir, e)
                    self._row_blocks = arrow_rows.RowBlocks(self.log, s.arrow_message_bytes)
            return self._row_blocks

    def _fetch_arrow(
        self,
        blocks: RowBlocks,
        after: int,
        until: int,
        filt: TableFilter,
        files: bool,
        context: grpc.ServicerContext,
    ) -> Iterator[pb.FetchResponse | bytes]:
        from csnd.service.arrow_rows import RecordTooLarge

        try:
            for i, message in enumerate(blocks.messages(after, until, filt, files=files)):
                if isinstance(message, bytes):
                    yield pb.FetchResponse(arrow=message)
                else:
                    yield pb.FetchResponse(arrow_file=pb.ArrowFile(**message._asdict()))
                if i % 16 == 15 and self.stopping.is_set():
                    _abort(context, grpc.StatusCode.UNAVAILABLE, "the service is stopping; fetch again")
        except CsnOutOfRange as e:
            _out_of_range(context, after, e)
        except ChangelogCorrupt as e:
            _damaged(context, e)
        except RecordTooLarge as e:
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except (ValueError, TypeError) as e:
            _abort(
                context,
                grpc.StatusCode.DATA_LOSS,
                f"the changelog's transactions in csn range ({after}, {until}] cannot be made rows ({e}): "
                "check the changelog (csnd changelog DIR) and report this",
            )

    # --- Status ---------------------------------------------------------------------

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:  # noqa: N802
        return self.snapshot()

    def snapshot(self) -> pb.StatusResponse:
        """Nodes, changelog and consumers now (the gRPC Status answer and /api/status)."""
        log = self.log
        nodes = [n.to_pb() for n in self.status_source()] if self.status_source is not None else []
        wall, mono = time.time(), time.monotonic()
        with self.lock:
            live = [
                (c.peer, c.name, c.acked, c.sent, c.tables, c.transactions_sent, c.connected_since)
                for c in self.registry.consumers.values()
            ]
            idle = {
                n: (csn, self.registry.filters.get(n, ())) for n, csn in self.registry.idle_names().items()
            }
        consumers = []
        for peer, name, acked, sent, tables, count, since in live:
            lag, at_least = self._lag(acked)
            consumers.append(
                pb.ConsumerStatus(
                    peer=peer,
                    name=name,
                    acknowledged_csn=acked,
                    sent_csn=sent,
                    lag_transactions=lag,
                    lag_at_least=at_least,
                    connected=True,
                    tables=tables,
                    transactions_sent=count,
                    connected_since_us=int((wall - (mono - since)) * 1e6),
                )
            )
        for name, (acked, tables) in sorted(idle.items()):
            lag, at_least = self._lag(acked)
            consumers.append(
                pb.ConsumerStatus(
                    name=name,
                    acknowledged_csn=acked,
                    lag_transactions=lag,
                    lag_at_least=at_least,
                    tables=tables,
                )
            )
        # What readers may read: while an initial snapshot is taken none of it is
        # (Changelog.hold_readers), and a consumer that plans by these figures (the
        # Spark source's offsets) must not step over it.
        visible = log.visible_csn
        return pb.StatusResponse(
            time_us=int(wall * 1e6),
            nodes=nodes,
            changelog=pb.ChangelogStatus(
                oldest_csn=log.oldest_csn if visible else 0,
                newest_csn=visible,
                bytes=log.size_bytes,
                segments=log.segment_count,
                directory=self.directory,
                fsyncs=log.fsyncs,
                fsync_seconds_total=log.fsync_seconds_total,
                last_fsync_seconds=log.last_fsync_seconds,
                holds=[
                    pb.RetentionHold(holder=h, held_bytes=n) for h, n in sorted(log.retention_held.items())
                ],
            ),
            consumers=consumers,
            version=__version__,
            incremental=incremental_status(self.snapshots),
        )

    def _lag(self, acked: int) -> tuple[int, bool]:
        """Durable transactions after `acked`, counted up to the cap; (count, count is a lower bound)."""
        return self.log.count_after(acked, self.settings.lag_count_cap)

    def stop(self) -> None:
        """Ends every stream at its next look (within WAIT_S) and stores the named marks."""
        self.stopping.set()
        self._store_marks()
        if self.subscriptions is not None:
            self.log.remove_retention_holder(self._retention_holds)

    def _retention_holds(self) -> dict[str, int]:
        """Every named subscription's mark: retention keeps the records after it (Changelog.apply_retention)."""
        with self.lock:
            return {f"subscription {n!r}": csn for n, csn in self.registry.named.items()}


def _chain(first: StoredRecord, rest: Iterator[StoredRecord]) -> Iterator[StoredRecord]:
    yield first
    yield from rest


def _refuse(context: grpc.ServicerContext, e: SubscriptionNotFound | SubscriptionBusy) -> NoReturn:
    code = (
        grpc.StatusCode.NOT_FOUND
        if isinstance(e, SubscriptionNotFound)
        else grpc.StatusCode.FAILED_PRECONDITION
    )
    _abort(context, code, str(e))


def _table_filter(specs: Any, context: grpc.ServicerContext) -> TableFilter:
    try:
        return TableFilter(specs)
    except ValueError as e:
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))


def _pieces_kept(
    csn: int, line: RecordPieces, filt: LineFilter, max_bytes: int, context: grpc.ServicerContext
) -> Iterator[bytes] | None:
    """A large transaction's line (after the subscriber's table filter) in pieces of `max_bytes`; None: no change kept.

    A stored record goes from the file to the wire a piece at a time, so a
    gigabyte transaction costs the service a piece of memory per stream.
    A table filter or a conversion reads it a change at a time
    (`keep_pieces`): about one change and a piece, never the whole line.
    """
    if not filt:
        return line.pieces(max_bytes)
    pieces = _or_data_loss(filt.keep_pieces(line.pieces(max_bytes), max_bytes), csn, context)
    first = next(pieces, None)  # (scans up to the first kept change: None when none is)
    if first is None:
        return None
    return _chain_pieces(first, pieces)


def _or_data_loss(pieces: Iterator[bytes], csn: int, context: grpc.ServicerContext) -> Iterator[bytes]:
    try:
        yield from pieces
    except ValueError as e:
        _bad_line(context, csn, e)


def _chain_pieces(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


def _piece_responses(csn: int, pieces: Iterator[bytes], make: Callable[[], _Resp]) -> Iterator[_Resp]:
    """One message per piece, `more` on all but the last (docs/design.md section 8)."""
    held = next(pieces, b"")
    for piece in pieces:
        resp = make()
        resp.batch.transactions.add(csn=csn, line=held, more=True)
        yield resp
        held = piece
    resp = make()
    resp.batch.transactions.add(csn=csn, line=held)
    yield resp


# A batch is built inside its response message, a Transaction at a time: a
# Transaction made apart and then put in a list, the list in a
# TransactionBatch and that in the response copied each one twice more, 6 us
# a one-row transaction against 2 here, most of the stream's CPU.


def _batch_of(records: list[Record], make: Callable[[], _Resp]) -> _Resp:
    resp = make()
    add = resp.batch.transactions.add
    for csn, line in records:
        add(csn=csn, line=line)
    return resp


# A batch's message, serialized directly (`_feedwire.c`): the servers' Subscribe and Fetch
# pass bytes through as they are (`server.add_changefeed`).  Without it, the message objects.
_feedwire = compiled_module("csnd.service._feedwire")


def _batch_response(records: list[Record]) -> pb.SubscribeResponse | bytes:
    if _feedwire is not None:
        return cast(bytes, _feedwire.batch_message(records))
    return _batch_of(records, pb.SubscribeResponse)


def _fetch_response(records: list[Record]) -> pb.FetchResponse | bytes:
    if _feedwire is not None:  # (FetchResponse carries the batch as field 1 too)
        return cast(bytes, _feedwire.batch_message(records))
    return _batch_of(records, pb.FetchResponse)


def _relations_response(entries: list[RelationEntry]) -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        relations=pb.RelationBatch(
            relations=[pb.RelationLine(csn=e.csn, line=e.line.encode("utf-8")) for e in entries]
        )
    )


def _keepalive() -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        keepalive=pb.FeedKeepalive(send_time_us=int(time.time() * 1e6), reply_requested=True)
    )


def _out_of_range(context: grpc.ServicerContext, after: int, e: CsnOutOfRange, name: str = "") -> NoReturn:
    """OUT_OF_RANGE; for a named subscription, naming it, where it is and what the operator can do."""
    if not name:
        _abort(context, grpc.StatusCode.OUT_OF_RANGE, str(e))
    oldest = e.oldest_csn
    _abort(
        context,
        grpc.StatusCode.OUT_OF_RANGE,
        f"subscription {name!r} is at csn {after}, but retention dropped the records after it "
        f"(it held them only up to retention_hold_bytes/retention_hold_hours): the oldest retained csn is "
        f"{oldest}, so its consumer would miss the ones in between; to go on from the oldest retained, "
        f"reset it: csnd subscriptions reset HOST:PORT {name} --csn {max((oldest or 1) - 1, 0)}",
    )


def _damaged(context: grpc.ServicerContext, e: ChangelogCorrupt) -> NoReturn:
    """DATA_LOSS with the line `csnd changelog --check` gives: the consumer stops, it does not retry.

    Logged once here as a line, not a traceback: the damage is the
    operator's to repair (the message says how), and nothing after it is served.
    """
    log.error("changefeed: %s; the consumer %s was told DATA_LOSS", e, context.peer())
    _abort(context, grpc.StatusCode.DATA_LOSS, str(e))


def _no_types(node: str, schema: str, table: str, csn: int) -> None:
    """A changelog without relation versions knows no column types."""
    return None


def _bad_line(context: grpc.ServicerContext, csn: int, e: ValueError) -> NoReturn:
    if isinstance(e, ColumnTypesUnknown):  # (the line is fine: the format cannot be made of it)
        _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
    _abort(
        context,
        grpc.StatusCode.DATA_LOSS,
        f"the changelog's record of csn {csn} is not a transaction line ({e}); it cannot be filtered: "
        "check the changelog (csnd changelog DIR) and report this",
    )


def incremental_status(jobs: Any) -> pb.SnapshotStatus:
    """The latest incremental snapshot of `jobs` (an `IncrementalSnapshots`) as Status shows it."""
    job = jobs.latest() if jobs is not None else None
    if job is None:
        return pb.SnapshotStatus()
    return pb.SnapshotStatus(
        state=job.state,
        job=job.id,
        error=job.error,
        tables=[pb.SnapshotTableStatus(**dataclasses.asdict(t)) for t in jobs.progress.tables()],
    )


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("unreachable: context.abort raises")  # (for the type checker)
