"""`csnd record`: capture a live node's stream into a recorded stream file.

The file is the durable sink, so the slot is confirmed only to what has been
fsynced to it: after each sync we confirm the END LSN of the last transaction
the file holds complete (or an idle keepalive's WAL end when no transaction is
open).  A second recording on the same slot therefore starts exactly after
the last transaction of the first, with nothing repeated or lost.

That holds only if the second recording goes to a new file or continues the
first: an existing FILE is refused unless the caller says `append` or
`replace`.  To append, the file is read first (`scan_recording`): its header
must match the source, a torn last frame is cut, the position it holds must
not be behind where the slot resumes (the server will not send what lies in
between again), and every frame it holds goes through a `ResumeFilter` that
then drops whatever the server sends again, exactly as after a reconnect.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TextIO

from csnd.core.errors import ConfigError, CsndError, StreamFormatError, TruncatedFrame
from csnd.core.ids import Lsn, lsn_to_str
from csnd.reader.live import LiveSource
from csnd.reader.pgoutput import (
    ChangeFrames,
    Commit,
    Keepalive,
    Message,
    PgOutputParser,
    StreamAbort,
    StreamCommit,
    TxnRun,
    parse_frame,
)
from csnd.reader.resume import Item, ResumeFilter
from csnd.reader.streamfile import (
    StreamFileReader,
    StreamHeader,
    StreamWriter,
    check_new_recording,
    is_regular,
)

# fsync (and then confirm) at least this often.  Shorter bounds the WAL the
# server keeps for us and what a crash makes us fetch again; longer saves
# fsyncs on a busy stream.
SYNC_INTERVAL_S: Final = 1.0
SYNC_BYTES: Final = 8 << 20
PROGRESS_INTERVAL_S: Final = 2.0
# The most a torn last frame may leave behind to be cut when appending.  A
# write cut short leaves part of one frame; more than this after the last
# whole frame is more likely a corrupt length in the middle of the file,
# and cutting there would throw away good frames: refused instead.
TORN_TAIL_MAX_BYTES: Final = 64 << 20
# While an appended-to file is read, the filter forgets delivered
# transactions the slot will not send again every this many frames.
_PRUNE_FRAMES: Final = 10_000


def durable_after(
    lsn: int, msg: Message | Keepalive | ChangeFrames | TxnRun, open_txns: int, current: int
) -> int:
    """The position a file holding everything up to `msg` may confirm (END LSNs; see the module docstring)."""
    if isinstance(msg, (Commit, StreamCommit)):
        return max(current, msg.end_lsn)
    if isinstance(msg, TxnRun):
        return max(current, msg.txns[-1].end_lsn)
    if isinstance(msg, StreamAbort) and msg.xid == msg.subxid:
        return max(current, lsn)
    if isinstance(msg, Keepalive) and open_txns == 0:
        return max(current, msg.wal_end)
    return current


@dataclass
class Continuation:
    """What `scan_recording` found: where to append, what the file holds, the filter it primed."""

    end: int  # byte offset after the last complete frame
    durable: int  # the position the file holds (what a recording confirms)
    filter: ResumeFilter
    frames: int
    cut: int  # bytes of a torn last frame cut off (0: none)
    version: int  # the file's format, which appended frames keep
    crc: int  # its last whole frame's CRC (format 2), which the next frame's continues


def scan_recording(path: str, header: StreamHeader, slot_lsn: Lsn) -> Continuation:
    """Read an existing recording to continue it; see the module docstring."""
    try:
        reader = StreamFileReader(path)
    except StreamFormatError as e:
        raise ConfigError(f"cannot continue {path}: {e.message}; move it away or pass --replace") from None
    with reader:
        old = reader.header
        for what, mine, theirs in (
            ("node", header.node, old.node),
            ("binary", header.binary, old.binary),
            ("mode", header.mode, old.mode),
        ):
            if mine != theirs:
                raise ConfigError(
                    f"cannot append to {path}: its header says {what} {theirs!r}, this recording "
                    f"would be {mine!r}; record to another file"
                )
        filt = ResumeFilter()
        parser = PgOutputParser()
        end = reader.bytes_read
        durable = frames = cut = 0
        try:
            for offset, payload in reader:
                frame = parse_frame(payload)
                if isinstance(frame, Keepalive):
                    item: Item = (frame.wal_end, frame, payload)
                else:
                    item = (frame.data_start, parser.parse(frame.payload), payload)
                filt.feed(item)
                durable = durable_after(item[0], item[1], filt.open_transactions, durable)
                end = offset + reader.frame_head + len(payload)
                frames += 1
                if frames % _PRUNE_FRAMES == 0:
                    filt.confirmed(slot_lsn)
        except TruncatedFrame:
            cut = os.path.getsize(path) - end
            if cut > TORN_TAIL_MAX_BYTES:
                raise ConfigError(
                    f"cannot continue {path}: {cut} bytes after its last complete frame (byte offset "
                    f"{end}) are more than a torn write leaves; check the file, or pass --replace"
                ) from None
        except (CsndError, ValueError) as e:
            raise ConfigError(f"cannot continue {path}: {e}; move it away or pass --replace") from None
    if frames and slot_lsn > durable:
        raise ConfigError(
            f"cannot append to {path}: it holds the stream up to {lsn_to_str(durable)}, but the slot "
            f"resumes at {lsn_to_str(slot_lsn)}; the transactions in between are not in the file and "
            "will not be sent again: record to a new file"
        )
    filt.confirmed(slot_lsn)
    return Continuation(end, durable, filt, frames, cut, reader.version, reader.crc)


@dataclass(frozen=True)
class _Lulls:
    """The recording's `QuietListener`: a sync after a lull, and one before the stream's last word."""

    on_idle: Callable[[], None]
    on_finish: Callable[[], None]

    def idle(self) -> None:
        self.on_idle()

    def finishing(self) -> None:
        self.on_finish()


@dataclass
class RecordSummary:
    path: str
    frames: int
    transactions: int
    bytes: int
    confirmed_lsn: int
    reconnects: int


def record(
    source: LiveSource,
    path: str,
    progress: TextIO | None = sys.stderr,
    clock: Callable[[], float] = time.monotonic,
    how: str = "replace",
) -> RecordSummary:
    """Record `source` to `path`; `how`: `create` (refuse an existing file), `append` or `replace`."""
    check_new_recording(path, how)  # before connecting: a refused file costs nothing
    header = StreamHeader(node=source.node, binary=source.binary, mode=source.mode)
    if source.binary:
        header.extra["enums"] = [list(e) for e in source.enum_types()]
    header.extra["types"] = [list(t) for t in source.user_types()]
    txns = 0
    durable_candidate: int = source.confirmed_lsn
    append_at = 0
    chain: dict[str, int] = {}  # (appending: the file's format and CRC chain)
    first: list[Item] = []
    if how == "append" and is_regular(path) and os.path.exists(path):
        slot_lsn = source.slot_position()
        cont = scan_recording(path, header, slot_lsn)
        if cont.cut and progress is not None:
            progress.write(
                f"record {source.node}: cut a torn last frame ({cont.cut} bytes at byte offset "
                f"{cont.end}) from {path}\n"
            )
        append_at, durable_candidate = cont.end, max(durable_candidate, cont.durable)
        chain = {"version": cont.version, "crc": cont.crc}
        source.filter = cont.filter
        first = cont.filter.reconnected(slot_lsn)  # (a Stream Stop the file needs first)
    with StreamWriter(path, header, how, append_at, **chain) as writer:
        for _lsn, _msg, payload in first:
            writer.write_frame(payload)

        def make_durable() -> None:
            writer.sync()
            source.confirm(Lsn(durable_candidate))

        last_sync = last_progress = clock()
        unsynced = 0
        changed = False  # frames other than keepalives written since the last sync

        def sync_now() -> None:
            nonlocal last_sync, unsynced, changed
            make_durable()
            last_sync, unsynced, changed = clock(), 0, False

        def on_idle() -> None:
            # The server has been quiet for a poll interval: sync and confirm
            # what was written, instead of leaving the last transactions
            # before the lull in the write buffer until the next change or
            # the server's next keepalive (~20 s).  Never under load.
            if changed:
                sync_now()

        try:
            for lsn, msg, payload in source.frames(quiet=_Lulls(on_idle, make_durable)):
                writer.write_frame(payload)
                unsynced += len(payload)
                if type(msg) is not Keepalive:
                    changed = True
                if isinstance(msg, (Commit, StreamCommit)):
                    txns += 1
                durable_candidate = durable_after(
                    lsn, msg, source.filter.open_transactions, durable_candidate
                )
                now = clock()
                if unsynced >= SYNC_BYTES or now - last_sync >= SYNC_INTERVAL_S:
                    sync_now()
                if progress is not None and now - last_progress >= PROGRESS_INTERVAL_S:
                    progress.write(
                        f"record {source.node}: {writer.frames} frames, {txns} transactions, "
                        f"{writer.bytes_written / 1e6:.1f} MB, at {lsn_to_str(durable_candidate)}\n"
                    )
                    last_progress = now
        except BaseException:
            # This error is the one to report.  What the file already holds is
            # still made durable and confirmed -- to the server too, while the
            # connection lasts -- if that works (best effort: a failure here
            # must not replace the error above); a failed file was already
            # reported and confirms nothing.
            if not writer.failed:
                with contextlib.suppress(Exception):
                    make_durable()
                if not writer.failed:
                    with contextlib.suppress(Exception):
                        source.finish()
            raise
        else:
            make_durable()
        finally:
            source.close()
    return RecordSummary(
        path=path,
        frames=writer.frames,
        transactions=txns,
        bytes=writer.bytes_written,
        confirmed_lsn=durable_candidate,
        reconnects=source.reconnects,
    )
