"""The changefeed's response messages: batches, a large line's pieces, relation lines, keepalives.

Subscribe and Fetch send the same batches (docs/design.md section 8): whole
transactions under a size bound, or one transaction too large for a message
in pieces, `more` on all but the last.  A batch is serialized directly by
the compiled `_feedwire` when it is built (bytes the server passes through,
`server.add_changefeed`); without it, the message objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar, cast

import grpc

from csnd.core.compiled import compiled_module
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.batching import Record
from csnd.service.feed_aborts import bad_line
from csnd.service.filtering import LineFilter

if TYPE_CHECKING:
    from csnd.changelog import RecordPieces, RelationEntry

_Resp = TypeVar("_Resp", pb.SubscribeResponse, pb.FetchResponse)
_T = TypeVar("_T")


def chain(first: _T, rest: Iterator[_T]) -> Iterator[_T]:
    """`first`, then `rest`: an iterator whose first item was read ahead (to fail early, or to see it is there)."""
    yield first
    yield from rest


def pieces_kept(
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
    return chain(first, pieces)


def _or_data_loss(pieces: Iterator[bytes], csn: int, context: grpc.ServicerContext) -> Iterator[bytes]:
    try:
        yield from pieces
    except ValueError as e:
        bad_line(context, csn, e)


def piece_responses(csn: int, pieces: Iterator[bytes], make: Callable[[], _Resp]) -> Iterator[_Resp]:
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


def batch_of(records: list[Record], make: Callable[[], _Resp]) -> _Resp:
    resp = make()
    add = resp.batch.transactions.add
    for csn, line in records:
        add(csn=csn, line=line)
    return resp


# A batch's message, serialized directly (`_feedwire.c`): the servers' Subscribe and Fetch
# pass bytes through as they are (`server.add_changefeed`).  Without it, the message objects.
_feedwire = compiled_module("csnd.service._feedwire")


def batch_response(records: list[Record]) -> pb.SubscribeResponse | bytes:
    if _feedwire is not None:
        return cast(bytes, _feedwire.batch_message(records))
    return batch_of(records, pb.SubscribeResponse)


def fetch_response(records: list[Record]) -> pb.FetchResponse | bytes:
    if _feedwire is not None:  # (FetchResponse carries the batch as field 1 too)
        return cast(bytes, _feedwire.batch_message(records))
    return batch_of(records, pb.FetchResponse)


def relations_response(entries: list[RelationEntry]) -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        relations=pb.RelationBatch(
            relations=[pb.RelationLine(csn=e.csn, line=e.line.encode("utf-8")) for e in entries]
        )
    )


def keepalive() -> pb.SubscribeResponse:
    return pb.SubscribeResponse(
        keepalive=pb.FeedKeepalive(send_time_us=int(time.time() * 1e6), reply_requested=True)
    )
