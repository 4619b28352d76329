"""From frames to positioned messages: what every source hands downstream.

`iter_events` turns a stream of CopyData payloads into `(lsn, message)` pairs,
where `lsn` is the XLogData frame's dataStart (0/0 for Relation frames, see
docs/design.md section 9) or, for a keepalive, its walEnd.  Errors gain the node, the
position and -- for recorded files -- the path and byte offset.

An `Event` is what every source hands the resume filter and the decoder pool,
one of four shapes: a parsed pgoutput `Message`, a `Keepalive`, and the two
batches of the hot path (docs/design.md section 1) -- a `ChangeFrames` run of
row-change frames of one (sub)transaction, and a `TxnRun` of whole one-piece
transactions (`ScannedTxn` each), which a live reader hands on for one whole
transaction as well as for the many its compiled loop read.

Why four shapes and not one batch.  Each is what one reading path has in
hand at no cost: a control message parsed because its fields steer the
stream (Begin, Commit, Relation, stream control, logical messages); a
keepalive, which is a position and nothing else; the frames of a run of row
changes as one slice of the buffer they were read into (a recorded file, and
a live transaction that is streamed or cut by a batch); and the fields of
whole transactions as the compiled loop builds them.  A single batch type
would have to hold the four alongside each other, and its consumers -- the
resume filter, the decoder pool's feed, the sender -- would dispatch on its
contents just as they dispatch on `type(item)` now, after one allocation
more per event on the recorded path, where every Begin and Commit is an
event of its own.  The seam's one named type is `Event`; `EventStream` is
what a source hands on.

Measured (a recording of 100,000 one-row transactions, 300,001 events, the
reader thread's CPU time, best of 7 on the shared 2-core machine at load
22): reading an event costs 1.70-1.93 us and the decoder pool's feed 0.40
more; a `__slots__` batch object around each event adds 0.08 us alone and
0.13-0.17 us through the stream that would hand it on, 4-8% of that
thread's 2.1-2.3 us an event, on the thread a replay runs in series.  A
live node would hardly see it (its compiled loop hands many whole
transactions on as one `TxnRun`); a replay would, so the shapes stay.  What
each consumer does with them: the resume filter and the pool's feed
dispatch on `type(msg)` (a run or whole transactions pass through whole, a
control message steers the stream or a batch's skeleton); a recording
reads `LiveSource.frames` one parsed frame at a time and writes each one's
payload bytes, looking at the message only for its position.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from csnd.core.errors import StreamFormatError
from csnd.core.ids import Lsn
from csnd.reader.pgoutput import (
    ChangeFrames,
    FrameError,
    Keepalive,
    Message,
    PgOutputParser,
    TxnRun,
    parse_frame,
    parse_hot_frame,
)

Event = tuple[Lsn, Message | Keepalive | ChangeFrames | TxnRun]


class EventStream(Protocol):
    """What a source's `events()` hands on: its events, and `close()` to end the stream early.

    A source's generator is one.  The decoder pool reads it in a thread of
    its own and, when it stops before the end, closes it in that thread: the
    source's own clean-up then runs where it read (a live source says where
    it got and hangs up) instead of holding its replication connection, and
    the server its slot, until the process exits.
    """

    def __iter__(self) -> Iterator[Event]: ...

    def __next__(self) -> Event: ...

    def close(self) -> None:
        """End the stream where it is and let go of what it holds; idempotent."""


class PauseListener(Protocol):
    """Told when a live stream has paused; given to the source with the stream (`LiveSource.events`).

    A batch gathered downstream (the decoder pool's) would otherwise wait
    for more events to fill it while the server has nothing more to send.
    The source calls `drained` in the thread iterating its stream, between
    two of its events, once everything received has been yielded and
    nothing more came for a moment (`reader.copyloop.DRAINED_WAIT_S`); so a
    listener may act on what that thread gathers without a lock.
    """

    def drained(self) -> None:
        """The stream has paused: hand on what was gathered from it."""


class QuietListener(Protocol):
    """Told of a live stream's quiet moments and of its end; given with the stream (`LiveSource.frames`).

    `csnd record` syncs its file and confirms what it holds then: after a
    lull, instead of leaving the last transactions in its write buffer until
    the next change or the server's next keepalive (about 20 s), and at the
    end, so the final status update reports what the file holds.
    """

    def idle(self) -> None:
        """The server has sent nothing for a poll interval (called in the thread iterating the stream)."""

    def finishing(self) -> None:
        """The stream ends: called just before its final status update (a failure here reports nothing)."""


def iter_events(
    frames: Iterable[tuple[int, bytes | ChangeFrames]],
    node: str,
    path: str | None = None,
    parser: PgOutputParser | None = None,
) -> Iterator[Event]:
    """`frames` yields `(offset, payload)`; offset is a file byte offset or a frame counter.

    A `ChangeFrames` run among them (`StreamFileReader.scan`) passes through
    as `(its first dataStart, run)`; such a reader must follow `parser`'s
    stream state, so the caller then passes the parser it gave the reader.
    """
    parser = parser or PgOutputParser()
    parse = parser.parse
    last_lsn = Lsn(0)
    for offset, payload in frames:
        if type(payload) is ChangeFrames:
            last_lsn = payload.lsns[-1]
            yield payload.lsns[0], payload
            continue
        assert isinstance(payload, bytes)
        fast = parse_hot_frame(payload, parser.in_stream)
        if fast is not None:
            if fast[0]:
                last_lsn = fast[0]
            yield fast
            continue
        try:
            frame = parse_frame(payload)
            if isinstance(frame, Keepalive):
                last_lsn = max(last_lsn, frame.wal_end)
                yield frame.wal_end, frame
                continue
            if frame.data_start:
                last_lsn = frame.data_start
            yield frame.data_start, parse(frame.payload)
        except FrameError as e:
            if path is not None:
                raise StreamFormatError(
                    e.message, path=path, offset=offset, node=node, lsn=last_lsn
                ) from None
            raise FrameError(e.message, node=node, lsn=last_lsn) from None
