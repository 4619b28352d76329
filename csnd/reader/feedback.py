"""What a live source tells the server: its positions, in standby status updates.

The flush position we report is only ever what the pipeline has made
durable and handed to `confirm()` -- never further: early feedback loses
data, late feedback piles WAL up on the server.  We confirm END LSNs (the
server re-sends every transaction whose commit record starts at or after the
confirmed position).  The write position is what has been received, so the
server's pg_stat_replication shows how far the reader itself is.

`confirm` comes from whichever thread made output durable; everything else
from the thread reading the stream.  Only the confirmed position is shared,
so only it is behind a lock.
"""

from __future__ import annotations

import threading
import time
from typing import Final

from psycopg import pq

from csnd.core.errors import ConnectionLost
from csnd.core.ids import PG_EPOCH_UNIX_US, Lsn
from csnd.reader.pgoutput import encode_status_update

# How often we tell the server our positions when it does not ask.  Shorter
# confirms WAL sooner (less pile-up on the server); longer costs a few more
# packets.  Well under the server's wal_sender_timeout (60 s by default).
STATUS_INTERVAL_S: Final = 5.0
# A confirmation that moved, or a wait for `--until-lsn`'s end, is reported
# to the server at most this often.  Sent at every pause of the stream, as
# they were, a one-row load cost a status message, a flush and the server's
# reply each few transactions: a tenth of the service's CPU.  Longer: the
# slot's confirmed position (and the WAL it frees) trails by as much.
REPORT_GAP_S: Final = 0.05


def now_pg_us() -> int:
    """Now, in microseconds since 2000-01-01 UTC (PostgreSQL's epoch, as the protocol counts time)."""
    return int(time.time() * 1_000_000) - PG_EPOCH_UNIX_US


class Feedback:
    """A live source's three positions: received (`received`), confirmed (`confirmed`), reported (`reported`).

    `reported` is the flush position the server last heard, by a status
    update or by `pg_replication_slot_advance` (-1: nothing yet).
    """

    def __init__(self, node: str, start_lsn: Lsn) -> None:
        self.node = node
        self._confirmed = start_lsn
        self._lock = threading.Lock()
        self.received: Lsn = start_lsn
        self.reported: int = -1

    def confirm(self, lsn: Lsn) -> None:
        """Everything committed before `lsn` is durable downstream (any thread; never moves back)."""
        with self._lock:
            if lsn > self._confirmed:
                self._confirmed = lsn

    @property
    def confirmed(self) -> Lsn:
        with self._lock:
            return self._confirmed

    def receive(self, lsn: Lsn) -> None:
        """The server has sent WAL up to `lsn` (positions only go forward)."""
        if lsn > self.received:
            self.received = lsn

    def report_due(self) -> bool:
        """A confirmation moved since the last report: one should go out soon (`REPORT_GAP_S`)."""
        return self.confirmed > self.reported

    def send_status(self, pgconn: pq.abc.PGconn, reply: bool = False) -> None:
        """A standby status update with our positions; `reply` asks the server to answer at once."""
        flush = self.confirmed
        # write = what we have received; flush/apply = what is durable downstream
        msg = encode_status_update(max(self.received, flush), flush, flush, now_pg_us(), reply)
        if pgconn.put_copy_data(msg) != 1:
            raise ConnectionLost("cannot send standby status update", node=self.node, lsn=flush)
        pgconn.flush()
        self.reported = flush
