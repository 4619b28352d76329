"""The Spark source's calls to the changefeed service (the I/O edge of csnd.consumers.spark).

    driver:    newest()    Status: the changelog's oldest and newest durable csn
               csns_after  Fetch (after, until], counting up to a limit (csns only are kept)
               acknowledge Subscribe(name, after=csn) + ack(csn) + half-close: the service
                           stores the name's mark durably when the stream ends
    executors: read_rows   Fetch (lo, hi] as Arrow rows the service built (docs/design.md section 8),
                           mapped from the service's files when on its host (MappedSpans)
               read_range  Fetch (lo, hi]: whole transactions' lines, in CSN order

Every failure becomes one CsndError line that says which service, what
happened and what to do; Spark wraps it, but the line stays findable.

What the service lacks for this: a call that returns only csns (counting for a limit now carries
the lines of up to `maxTransactionsPerTrigger` transactions to the driver),
and a unary acknowledgement for a named subscription (the Subscribe stream
used instead may carry one batch we do not read).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Final

import grpc
import pyarrow as pa

from csnd.consumers.connection import CHANNEL_OPTIONS, permanent_error, wait_reachable
from csnd.consumers.lines import WholeLines
from csnd.consumers.spark.columns import keep_tables, not_source_rows, source_rows, with_source_flags
from csnd.consumers.spark.options import SourceOptions
from csnd.core.errors import ChangefeedError, ChangefeedUnavailable, ConfigError
from csnd.core.hostid import host_id
from csnd.core.tablespec import parse_table
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc

log = logging.getLogger("csnd.consumers.spark")

# How long commit() waits for the service to confirm it stored the mark
# (the stream ends once it has).  A timeout is logged by Spark as a failed
# commit; the next commit acknowledges a later csn, which covers this one.
ACK_TIMEOUT_S: Final = 30.0


def read_token(opts: SourceOptions) -> str | None:
    if opts.token_file is None:
        return None
    try:
        with open(opts.token_file, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ConfigError(
            f"csnd source: cannot read tokenFile {opts.token_file}: {e.strerror or e}"
        ) from None
    if not token:
        raise ConfigError(f"csnd source: tokenFile {opts.token_file} is empty")
    return token


def _metadata(opts: SourceOptions) -> tuple[tuple[str, str], ...]:
    token = read_token(opts)
    return () if token is None else (("authorization", f"Bearer {token}"),)


def _channel(opts: SourceOptions) -> grpc.Channel:
    if opts.tls_ca_file is None:
        return grpc.insecure_channel(opts.target, options=CHANNEL_OPTIONS)
    try:
        with open(opts.tls_ca_file, "rb") as f:
            ca = f.read()
    except OSError as e:
        raise ConfigError(
            f"csnd source: cannot read tlsCaFile {opts.tls_ca_file}: {e.strerror or e}"
        ) from None
    creds = grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.secure_channel(opts.target, creds, CHANNEL_OPTIONS)


def _failed(opts: SourceOptions, what: str, e: grpc.RpcError) -> Exception:
    err = permanent_error(e, opts.target)
    if err is not None:
        return type(err)(f"csnd source: {what}: {err}")
    details = e.details() if isinstance(e, grpc.Call) else str(e)
    return ChangefeedUnavailable(
        f"csnd source: {what} at {opts.target} failed ({details}); check that csnd serve is running there"
    )


def _connected(opts: SourceOptions) -> grpc.Channel:
    """A channel that reached the service, or ChangefeedUnavailable after the connect timeout.

    One health check (`client.wait_reachable`): it returns as soon as the
    connection is up.
    """
    channel = _channel(opts)
    try:
        wait_reachable(channel, _metadata(opts), opts.connect_timeout)
    except grpc.RpcError as e:
        channel.close()
        if e.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
            raise ChangefeedUnavailable(
                f"csnd source: nothing answers at target {opts.target} within {opts.connect_timeout:g} s; "
                "check the address and that csnd serve is running"
            ) from None
        raise _failed(opts, "connecting", e) from None
    return channel


def newest(opts: SourceOptions) -> tuple[int, int]:
    """(oldest, newest) durable csn of the service's changelog now (0, 0 when it is empty)."""
    channel = _connected(opts)
    try:
        stub = pb_grpc.ChangefeedStub(channel)
        try:
            status = stub.Status(
                pb.StatusRequest(), metadata=_metadata(opts), timeout=opts.connect_timeout * 3
            )
        except grpc.RpcError as e:
            raise _failed(opts, "asking for the changelog's status", e) from None
        return int(status.changelog.oldest_csn), int(status.changelog.newest_csn)
    finally:
        channel.close()


def _fetch(
    opts: SourceOptions, lo: int, hi: int, fmt: str, client_host: str = ""
) -> Iterator[pb.FetchResponse]:
    """Fetch (lo, hi] in `fmt`, message by message.

    Waits up to the connect timeout for the connection (a busy executor's
    first handshake can be slow; a task that fails fast fails the query).
    """
    channel = _connected(opts)
    try:
        stub = pb_grpc.ChangefeedStub(channel)
        request = pb.FetchRequest(
            after_csn=lo, until_csn=hi, tables=opts.tables, format=fmt, client_host=client_host
        )
        try:
            yield from stub.Fetch(request, metadata=_metadata(opts), wait_for_ready=True)
        except grpc.RpcError as e:
            raise _failed(opts, f"reading csn range ({lo}, {hi}]", e) from None
    finally:
        channel.close()


def read_range(opts: SourceOptions, lo: int, hi: int) -> Iterator[tuple[int, bytes]]:
    """The transactions in (lo, hi] (of our tables), in CSN order."""
    whole = WholeLines(f"csnd source: {opts.target}")
    for msg in _fetch(opts, lo, hi, "lines"):
        yield from whole.of(msg.batch)


def read_rows(opts: SourceOptions, lo: int, hi: int) -> Iterator[pa.RecordBatch | tuple[int, bytes]]:
    """The rows of (lo, hi] as the service built them (Arrow record batches of ARROW_SCHEMA).

    A service that predates Arrow fetches answers with lines: those come as
    (csn, line) pairs, for the caller to build rows from.

    With localFiles, the request names this host (`hostid`): a service on
    the same host may say where rows lie in its files instead of sending
    them (every table's: the `tables` option is applied here).  A span that
    cannot be read here (another mount or user, a file the service dropped
    meanwhile) ends that fetch, and the rest of the range is fetched again
    as bytes from the span's start.
    """
    whole = WholeLines(f"csnd source: {opts.target}")
    spans = MappedSpans(opts) if opts.local_files and host_id() else None
    parsed = [parse_table(t) for t in opts.tables]  # (checked when the query started)
    schemas = frozenset(s for s, t in parsed if t is None)
    tables = frozenset((s, t) for s, t in parsed if t is not None)
    pos = lo
    while True:
        resume_at = None
        messages = _fetch(opts, pos, hi, "arrow", client_host=host_id() if spans is not None else "")
        try:
            for msg in messages:
                if msg.HasField("arrow_file"):
                    batch = spans.batch(msg.arrow_file) if spans is not None else None
                    if batch is None:
                        resume_at = max(pos, msg.arrow_file.after_csn)
                        break
                    # (a file holds every table's rows, whole transactions: ours are kept here)
                    batch = keep_tables(batch, schemas, tables)
                    if batch.num_rows:
                        yield batch
                elif msg.arrow:
                    yield _ipc_batch(opts, pos, hi, msg.arrow)
                yield from whole.of(msg.batch)
        finally:
            messages.close()  # type: ignore[attr-defined]  # (a generator: closes the channel)
            if spans is not None:
                spans.close()
        if resume_at is None:
            return
        spans, pos = None, resume_at


class MappedSpans:
    """The service's files, mapped into this process: a FileSpan's batch without a copy.

    One file is open at a time (a block's spans come one after another):
    the batches handed on keep their pages mapped by themselves, after the
    file is closed and after the service removes it.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._path = ""
        self._map: pa.MemoryMappedFile | None = None

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map, self._path = None, ""

    def batch(self, span: pb.ArrowFile) -> pa.RecordBatch | None:
        """The span's rows, in place; None (and why, logged) when they cannot be read here."""
        try:
            if span.path != self._path or self._map is None:
                self.close()
                self._map, self._path = pa.memory_map(span.path), span.path
            self._map.seek(span.offset)
            data = self._map.read_buffer(span.length)
            found = pa.ipc.open_stream(data, options=_ONE_THREAD).read_next_batch()
        except (OSError, pa.ArrowInvalid, StopIteration) as e:  # (pyarrow's IOError is an OSError)
            log.info(
                "csnd source: %s: the rows after csn %d are received instead of read from %s (%s); "
                "localFiles=false receives them always",
                self.opts.target,
                span.after_csn,
                span.path,
                e,
            )
            return None
        batch = source_rows(found)
        if (
            batch is None
            or len(data) != span.length
            or batch.num_rows != span.rows
            or (batch.num_rows and batch.column(0)[0].as_py() <= span.after_csn)
        ):
            log.warning(
                "csnd source: %s named %d rows after csn %d in %d bytes at offset %d of %s, and those "
                "bytes hold something else (%d bytes, %d rows, %s); the rows are received instead",
                self.opts.target,
                span.rows,
                span.after_csn,
                span.length,
                span.offset,
                span.path,
                len(data),
                found.num_rows,
                "the source's columns" if batch is not None else "not the source's columns",
            )
            return None
        return batch


# Opening a message undoes its compression buffer by buffer: on one thread,
# as a Spark task is one thread of its own (a pool cost 20% more CPU here).
_ONE_THREAD: Final = pa.ipc.IpcReadOptions(use_threads=False)


def _ipc_batch(opts: SourceOptions, lo: int, hi: int, data: bytes) -> pa.RecordBatch:
    try:
        reader = pa.ipc.open_stream(data, options=_ONE_THREAD)
        batch = reader.read_next_batch()
    except (pa.ArrowInvalid, StopIteration) as e:
        raise ChangefeedError(
            f"csnd source: {opts.target} sent rows of csn range ({lo}, {hi}] that are not an Arrow IPC "
            f"stream ({e or 'no record batch'})"
        ) from None
    fault = not_source_rows(batch)
    if fault is not None:
        raise ChangefeedError(
            f"csnd source: {opts.target} sent rows of csn range ({lo}, {hi}] that are not the source's "
            f"columns ({fault}); are the service and the source the same csnd version?"
        )
    return with_source_flags(batch)


def csns_after(opts: SourceOptions, start: int, until: int, limit: int) -> list[int]:
    """The csns of the first `limit` transactions in (start, until] (all, if fewer)."""
    out: list[int] = []
    if until <= start:
        return out
    records = read_range(opts, start, until)
    try:
        for csn, _ in records:
            out.append(csn)
            if len(out) >= limit:
                break
    finally:
        records.close()  # type: ignore[attr-defined]  # (a generator: closes the channel)
    return out


def acknowledge(opts: SourceOptions, name: str, csn: int) -> None:
    """Stores `csn` as the named subscription's acknowledged mark (durably, when this returns)."""
    channel = _connected(opts)
    requests: queue.Queue[pb.SubscribeRequest | None] = queue.Queue()
    requests.put(pb.SubscribeRequest(start=pb.SubscribeStart(after_csn=csn, name=name, tables=opts.tables)))

    def request_iter() -> Iterator[pb.SubscribeRequest]:
        while (msg := requests.get()) is not None:
            yield msg

    try:
        stub = pb_grpc.ChangefeedStub(channel)
        call = stub.Subscribe(request_iter(), metadata=_metadata(opts), timeout=ACK_TIMEOUT_S)
        done = threading.Event()
        try:
            for msg in call:
                if msg.WhichOneof("body") == "subscribed" and not done.is_set():
                    # The service resolved our start: the ack is within what it
                    # "sent" (after_csn), so it is accepted; then we end our side.
                    requests.put(pb.SubscribeRequest(ack=pb.SubscribeAck(csn=csn)))
                    requests.put(None)
                    done.set()
                # (any batch after `csn` is not ours to read: the next micro-batch fetches it)
        except grpc.RpcError as e:
            raise _failed(opts, f"acknowledging csn {csn} as subscription {name!r}", e) from None
        finally:
            requests.put(None)
        if not done.is_set():
            raise ChangefeedUnavailable(
                f"csnd source: acknowledging csn {csn} as subscription {name!r}: the service ended the "
                "stream before it started; the next commit acknowledges again"
            )
    finally:
        channel.close()
