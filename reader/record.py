"""`csnd record`: capture a live node's stream into a recorded stream file.

The file is the durable sink, so the slot is confirmed only to what has been
fsynced to it: after each sync we confirm the END LSN of the last transaction
the file holds complete (or an idle keepalive's WAL end when no transaction is
open).  A second recording on the same slot therefore starts exactly after
the last transaction of the first, with nothing repeated or lost.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TextIO

from csnd.core.ids import lsn_to_str
from csnd.reader.live import LiveSource
from csnd.reader.pgoutput import Commit, Keepalive, StreamAbort, StreamCommit
from csnd.reader.streamfile import StreamHeader, StreamWriter

# fsync (and then confirm) at least this often.  Shorter bounds the WAL the
# server keeps for us and what a crash makes us fetch again; longer saves
# fsyncs on a busy stream.
SYNC_INTERVAL_S: Final = 1.0
SYNC_BYTES: Final = 8 << 20
PROGRESS_INTERVAL_S: Final = 2.0


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
) -> RecordSummary:
    header = StreamHeader(node=source.node, binary=source.binary, mode=source.mode)
    if source.binary:
        header.extra["enums"] = [list(e) for e in source.enum_types()]
    txns = 0
    durable_candidate = source.confirmed_lsn
    with StreamWriter(path, header) as writer:

        def make_durable() -> None:
            writer.sync()
            source.confirm(durable_candidate)

        source.before_finish = make_durable
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

        source.on_idle = on_idle
        try:
            for lsn, msg, payload in source.frames():
                writer.write_frame(payload)
                unsynced += len(payload)
                if type(msg) is not Keepalive:
                    changed = True
                if isinstance(msg, (Commit, StreamCommit)):
                    txns += 1
                    durable_candidate = max(durable_candidate, msg.end_lsn)
                elif isinstance(msg, StreamAbort) and msg.xid == msg.subxid:
                    durable_candidate = max(durable_candidate, lsn)
                elif isinstance(msg, Keepalive) and source.filter.open_transactions == 0:
                    durable_candidate = max(durable_candidate, msg.wal_end)
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
                finish = getattr(source, "finish", None)
                if finish is not None and not writer.failed:
                    with contextlib.suppress(Exception):
                        finish()
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
