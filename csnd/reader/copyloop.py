"""The receive loop of one replication connection: CopyData in, `(lsn, message, payload)` items out.

Between START_REPLICATION and the end of the copy this is the whole of a
live source's work, and on a busy node its hottest loop, so it keeps the
state it needs in locals and reads the frames the quickest way each allows:

* whole one-piece transactions between transactions go to the compiled loop
  (`reader.txnscan.take_whole_txns`) and come out as one `TxnRun`;
* a run of row changes outside stream blocks is read with only the checks a
  change frame needs and handed on as one `ChangeFrames` (`runs`), so neither
  this thread nor the resume filter builds an object per change;
* everything else takes the general parse, which reports every error.

Keepalive and feedback.  Status updates go out every `status_interval_s`,
whenever the server asks, and at most every `REPORT_GAP_S` while a
confirmation moved or `--until-lsn`'s end is awaited (`reader.feedback`).

Silence.  Nothing received for `receive_timeout_s` is a lost connection
(`RECEIVE_TIMEOUT_S`); half way through, a status update asks the server to
answer, so an idle but healthy connection is never silent that long.

Pauses.  When everything received has been yielded and nothing more came for
`DRAINED_WAIT_S`, the stream's `PauseListener` lets a batch gathered downstream go on; when
a poll interval passes with nothing at all, `on_idle` (csnd record syncs then).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Final

from psycopg import pq

from csnd.core.errors import ConnectionLost, ProtocolError, SourceError
from csnd.core.ids import Lsn, lsn_to_str
from csnd.reader.events import PauseListener
from csnd.reader.feedback import REPORT_GAP_S, Feedback
from csnd.reader.pgoutput import (
    CHANGE_FRAME_MIN,
    CHANGE_TAGS,
    RUN_FRAME_LENGTH,
    XLOGDATA_HEADER_SIZE,
    XLOGDATA_START,
    Begin,
    ChangeFrames,
    Commit,
    FrameError,
    Keepalive,
    Message,
    PgOutputParser,
    TxnRun,
    XLogData,
    parse_frame,
    parse_hot_frame,
    scanned_txn,
)
from csnd.reader.reconnect import Backoff, classify, one_line, server_hint
from csnd.reader.replconn import POLL_S, Closed, ReplicationConnection
from csnd.reader.resume import Item, ResumeFilter
from csnd.reader.shutdown import ShutdownProbe
from csnd.reader.txnscan import NO_STOP, CopyData, copy_reader, take_whole_txns

if TYPE_CHECKING:
    from csnd.reader.live import LiveOptions

# When nothing more has come for this long after data, the stream has paused:
# the stream's `PauseListener` is told, so that a batch being gathered downstream goes on.
DRAINED_WAIT_S: Final = 0.002
# Silence on the replication connection longer than this is a lost
# connection: reconnect (from the confirmed position, as after any loss).
# A path that drops packets without a reset (a black hole) sends no error
# and no end of stream, so without a bound the reader waited forever.  Half
# way through the silence a status update asks the server for a reply, which
# a live walsender sends at once, so an idle but healthy connection is never
# silent that long.  60 s is the default of PostgreSQL's own
# wal_receiver_timeout, which bounds the same wait for its replicas; shorter
# gains little, since the server frees the slot for the new connection only
# once its walsender sees the old one gone (its wal_sender_timeout, 60 s by
# default), and risks reconnecting from a server that is merely slow to answer.
RECEIVE_TIMEOUT_S: Final = 60.0
# A run of row-change frames handed on as one `ChangeFrames` ends at this many
# frames (or at the next other frame, or when the socket is drained).
RUN_FRAMES: Final = 512
# At most this many frames are read by one `take_whole_txns` (then `close()` is checked).
SCAN_FRAMES: Final = 256


class CopyLoop:
    """One connection's stream, from COPY_BOTH until `--until-lsn`'s end, `close()` or a failure.

    Its collaborators are the source's own: the connection, its positions
    (`Feedback`), the resume filter every item passes through, the backoff
    told when data flowed, and the probe of a server that is shutting down;
    and whoever reads the stream: `pauses`, told when it pauses.
    """

    def __init__(
        self,
        node: str,
        options: LiveOptions,
        link: ReplicationConnection,
        feedback: Feedback,
        resume: ResumeFilter,
        backoff: Backoff,
        shutdown: ShutdownProbe,
        *,
        pauses: PauseListener | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.node = node
        self.options = options
        self.link = link
        self.feedback = feedback
        self.filter = resume
        self.backoff = backoff
        self.shutdown = shutdown
        self.pauses = pauses
        self.on_idle = on_idle

    def run(self, pgconn: pq.abc.PGconn, runs: bool = False) -> Generator[Item, None, bool]:
        """Yield the stream's items; return True once `--until-lsn` is reached (the copy is then to be ended)."""
        fb, link, slot = self.feedback, self.link, self.options.slot
        parser = PgOutputParser()
        filt = self.filter.feed
        flowed = False
        last_status = time.monotonic()
        interval = self.options.status_interval_s
        closed = link.closed.is_set
        undrained = False  # items yielded since `pauses` was last told
        # Since when the server has sent nothing (None: bytes came since the last look),
        # and whether a reply was asked for in this silence (see RECEIVE_TIMEOUT_S).
        receive_timeout = self.options.receive_timeout_s
        quiet_since: float | None = None
        pinged = False
        # The open run of row-change frames (`runs`): framed payloads and dataStarts.
        run_parts: list[bytes] = []
        run_lsns: list[Lsn] = []
        frame_length, data_start = RUN_FRAME_LENGTH.pack, XLOGDATA_START.unpack_from

        # A Begin held back (`runs`) while its transaction may still come whole:
        # its changes and Commit next, with nothing else between (a `TxnRun` of one).
        held: tuple[Lsn, Begin, bytes] | None = None

        def take_run() -> ChangeFrames | None:
            nonlocal run_parts, run_lsns
            if not run_lsns:
                return None
            run = ChangeFrames(b"".join(run_parts), False, None, run_lsns)
            run_parts, run_lsns = [], []
            return run

        def held_items() -> list[Item]:
            """What is held back goes on as it came: the Begin, then the run."""
            nonlocal held
            out: list[Item] = []
            if held is not None:
                out += filt(held)
                held = None
            run = take_run()
            if run is not None:
                out += filt((run.lsns[0], run, run.blob))
            return out

        def at_end() -> bool:
            """`--until-lsn` is reached with nothing open or held: the stream ends here."""
            until = self.options.until_lsn
            return (
                until is not None
                and fb.received >= until
                and self.filter.open_transactions == 0
                and held is None
                and not run_lsns
            )

        get_copy_data = copy_reader(pgconn)  # (libpq's own call when it can: see txnscan)
        # Frames read ahead and not yet handled: by the run loop below, or
        # handed back by `take_whole_txns`.
        ahead: deque[CopyData] = deque()
        stop_at = NO_STOP if self.options.until_lsn is None else self.options.until_lsn
        between = self.filter.between_transactions
        while True:
            if closed():  # (also while data keeps coming: a busy node is stopped as fast)
                raise Closed
            if ahead:
                nbytes, data = ahead.popleft()
            elif (
                runs
                and held is None
                and not run_lsns
                and not parser.in_stream
                and between()
                and fb.received < stop_at
            ):
                # Between transactions: whole one-piece ones, read by the compiled loop.  (Once
                # `--until-lsn` is reached, frame by frame: the stream ends where it always has.
                # Its run limit is RUN_FRAMES - 1: a transaction of RUN_FRAMES changes or more
                # goes on as Begin, runs, Commit, as below.)
                txns, handed, received = take_whole_txns(get_copy_data, SCAN_FRAMES, RUN_FRAMES - 1, stop_at)
                if link.refusal is not None:  # (a notice parsed with these frames: see replconn)
                    raise link.refusal.where(lsn=fb.received)
                ahead.extend(handed)
                if not txns:
                    continue
                undrained = True
                quiet_since = None  # (bytes came: whatever the last look saw of silence is over)
                if not flowed:
                    flowed = True
                    self.backoff.flowing()
                if received > fb.received:
                    fb.received = received
                yield from filt((txns[0][0], TxnRun(txns), b""))
                if at_end():
                    return True
                continue
            else:
                nbytes, data = get_copy_data(1)
                if link.refusal is not None:  # (a notice parsed with this frame: see replconn)
                    raise link.refusal.where(lsn=fb.received)
            if (run_lsns or held is not None) and nbytes <= 0:  # (drained, or the stream ends)
                yield from held_items()
            if nbytes == 0:
                now = time.monotonic()
                # Silence is timed from the first moment everything received was handled
                # (here, never per frame: the busy paths stay as they are) to the next byte.
                if quiet_since is None:
                    quiet_since, pinged = now, False
                quiet = now - quiet_since
                if quiet >= receive_timeout:
                    if link.wait(pgconn, read=True, timeout=0.0):  # (it came while we were held up)
                        quiet_since = None
                        link.consume(pgconn, fb.received)
                        continue
                    raise link.silent(quiet, slot, fb.received, fb.confirmed)
                until = self.options.until_lsn
                waiting_for_end = until is not None and fb.received < until
                since = now - last_status
                ping = not pinged and quiet >= receive_timeout / 2
                if (
                    ping
                    or since >= interval
                    or (since >= REPORT_GAP_S and (fb.confirmed > fb.reported or waiting_for_end))
                ):
                    # with --until-lsn pending, ask for a keepalive so an idle
                    # server tells us its WAL end instead of waiting 30 s; and
                    # half way to the receive timeout, so a healthy one speaks
                    fb.send_status(pgconn, reply=waiting_for_end or ping)
                    last_status = now
                    pinged = pinged or ping
                if undrained and self.pauses is not None:
                    # A short wait first: data that follows at once belongs to the same burst.
                    if link.wait(pgconn, read=True, timeout=DRAINED_WAIT_S):
                        quiet_since = None
                        link.consume(pgconn, fb.received)
                        continue
                    undrained = False
                    self.pauses.drained()
                wait = min(POLL_S, interval, max(0.0, quiet_since + receive_timeout - time.monotonic()))
                if fb.confirmed > fb.reported or waiting_for_end:  # (a report is due soon)
                    wait = min(wait, max(0.0, REPORT_GAP_S - (time.monotonic() - last_status)))
                if link.wait(pgconn, read=True, timeout=wait):
                    quiet_since = None
                    link.consume(pgconn, fb.received)
                elif self.on_idle is not None:
                    self.on_idle()
                if self.shutdown.stopping.is_set():
                    raise ConnectionLost(
                        "the server is shutting down and waits for a confirmation that must wait for "
                        f"durable output (confirmed {lsn_to_str(fb.confirmed)}); hanging up so it can stop",
                        node=self.node,
                        lsn=fb.received,
                    )
                continue
            if nbytes < 0:
                res = pgconn.get_result()
                detail = ""
                if res is not None and res.status == pq.ExecStatus.FATAL_ERROR:
                    if lost := link.lost_slot(res, slot, fb.confirmed):
                        raise lost
                    detail = one_line((res.error_message or b"").decode(errors="replace"))
                    state = (res.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode() or None
                    if classify(state, detail, connecting=False):  # e.g. the publication was dropped
                        hint = server_hint(state, detail)
                        raise SourceError(
                            f"the server ended the replication stream: {detail}{'; ' + hint if hint else ''}",
                            node=self.node,
                            lsn=fb.received,
                        )
                raise ConnectionLost(
                    f"replication stream ended by the server{': ' + detail if detail else ''}",
                    node=self.node,
                    lsn=fb.received,
                )
            payload = bytes(data)
            undrained = True
            quiet_since = None  # (bytes came: whatever the last look saw of silence is over)
            if (
                runs
                and len(payload) > CHANGE_FRAME_MIN
                and payload[XLOGDATA_HEADER_SIZE] in CHANGE_TAGS
                and payload[0] == 0x77
                and not parser.in_stream
            ):
                start = data_start(payload, 1)[0]
                run_parts.append(frame_length(len(payload)))
                run_parts.append(payload)
                run_lsns.append(start)
                # The frames that follow at once are most likely more of the run:
                # read them here, with only the checks a change frame needs.
                # (what was read ahead comes first: it was read before anything the socket holds)
                while len(run_lsns) < RUN_FRAMES:
                    nbytes, data = ahead.popleft() if ahead else get_copy_data(1)
                    if nbytes <= 0:
                        ahead.appendleft((nbytes, data))
                        break
                    payload = bytes(data)
                    if not (
                        len(payload) > CHANGE_FRAME_MIN
                        and payload[XLOGDATA_HEADER_SIZE] in CHANGE_TAGS
                        and payload[0] == 0x77
                    ):
                        ahead.appendleft((nbytes, data))
                        break
                    start = data_start(payload, 1)[0]
                    run_parts.append(frame_length(len(payload)))
                    run_parts.append(payload)
                    run_lsns.append(start)
                if start > fb.received:  # (positions only go forward in a run)
                    fb.received = start
                if len(run_lsns) >= RUN_FRAMES:  # (a big transaction: it goes on as it comes)
                    yield from held_items()
                continue
            # Row changes, Begins and Commits -- nearly every frame of a busy
            # node -- skip the XLogData object and the general parse (as a
            # recorded file's reader does); the rest, and whatever those
            # paths refuse, go the general way, which reports every error.
            data_msg: tuple[Lsn, Message] | None = parse_hot_frame(payload, parser.in_stream)
            if data_msg is None:
                frame = parse_frame(payload)
                if isinstance(frame, Keepalive):
                    if held is not None or run_lsns:  # (it comes after them)
                        yield from held_items()
                    fb.received = max(fb.received, frame.wal_end)
                    if frame.reply_requested:
                        fb.send_status(pgconn, reply=False)
                        last_status = time.monotonic()
                        # Holding the slot back: is a shutdown waiting on us?
                        if fb.confirmed < fb.received:
                            self.shutdown.maybe_probe()
                    yield frame.wal_end, frame, payload
                else:
                    assert isinstance(frame, XLogData)
                    data_msg = frame.data_start, _parse_message(parser, frame, self.node)
            if data_msg is not None:
                if not flowed:
                    flowed = True
                    self.backoff.flowing()
                start, msg = data_msg
                if start > fb.received:
                    fb.received = start
                if not runs:
                    yield from filt((start, msg, payload))
                elif type(msg) is Commit and held is not None:  # the transaction came whole
                    begin_at, begin, _ = held
                    held = None
                    blob, lsns = (b"".join(run_parts), run_lsns) if run_lsns else (None, None)
                    run_parts, run_lsns = [], []
                    whole = scanned_txn(begin_at, begin, blob, lsns, start, msg)
                    yield from filt((begin_at, TxnRun([whole]), b""))
                else:
                    if held is not None or run_lsns:  # (anything else ends it: it goes on first)
                        yield from held_items()
                    if type(msg) is Begin and not parser.in_stream:
                        held = (start, msg, payload)
                        continue
                    yield from filt((start, msg, payload))
            if at_end():
                return True


def _parse_message(parser: PgOutputParser, frame: XLogData, node: str) -> Message:
    try:
        return parser.parse(frame.payload)
    except FrameError as e:
        raise ProtocolError(e.message, node=node, lsn=frame.data_start or None) from None
