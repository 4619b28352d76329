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

from csnd.ids import lsn_to_str
from reader.live import LiveSource
from reader.pgoutput import Commit, Keepalive, StreamAbort, StreamCommit
from reader.streamfile import StreamHeader, StreamWriter

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
        try:
            for lsn, msg, payload in source.frames():
                writer.write_frame(payload)
                unsynced += len(payload)
                if isinstance(msg, (Commit, StreamCommit)):
                    txns += 1
                    durable_candidate = max(durable_candidate, msg.end_lsn)
                elif isinstance(msg, StreamAbort) and msg.xid == msg.subxid:
                    durable_candidate = max(durable_candidate, lsn)
                elif isinstance(msg, Keepalive) and source.filter.open_transactions == 0:
                    durable_candidate = max(durable_candidate, msg.wal_end)
                now = clock()
                # (a keepalive is an idle moment: sync what is waiting now, not at the next change)
                idle = unsynced and isinstance(msg, Keepalive)
                if idle or unsynced >= SYNC_BYTES or now - last_sync >= SYNC_INTERVAL_S:
                    make_durable()
                    last_sync, unsynced = now, 0
                if progress is not None and now - last_progress >= PROGRESS_INTERVAL_S:
                    progress.write(
                        f"record {source.node}: {writer.frames} frames, {txns} transactions, "
                        f"{writer.bytes_written / 1e6:.1f} MB, at {lsn_to_str(durable_candidate)}\n"
                    )
                    last_progress = now
        except BaseException:
            # This error is the one to report.  What the file already holds is
            # still made durable and confirmed if that works (best effort: a
            # failure here must not replace the error above); a failed file
            # was already reported and confirms nothing.
            if not writer.failed:
                with contextlib.suppress(Exception):
                    make_durable()
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
