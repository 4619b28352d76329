"""START_REPLICATION: what a live source asks of pgoutput, and the wait for the stream to begin.

The options are pgoutput's (protocol version, publication, binary,
streaming of large in-progress transactions, logical messages), then
whatever the source's `extra` adds; the server answers with COPY_BOTH, or
with an error that is a slot lost, a mistake to fix or something a retry
may cure (`ReplicationConnection.result_error`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from psycopg import pq

from csnd.core.errors import ConnectionLost
from csnd.core.ids import Lsn, lsn_to_str
from csnd.reader.replconn import ReplicationConnection, quote_ident, quote_literal

if TYPE_CHECKING:
    from csnd.reader.live import LiveOptions


# The pgoutput protocol version asked of every server, 15 to 18.  Version 2
# brought streaming of large in-progress transactions (`streaming 'on'`),
# which csnd needs; 3 adds two-phase commit messages, which csnd does not ask
# for; 4 (PostgreSQL 16+) allows `streaming 'parallel'`, made for a subscriber
# that applies streamed transactions in parallel before they commit.
# Measured on PostgreSQL 18 (bench/protocol_bench.py: 12 transactions of
# 20,000 rows from two sessions at once, one in three rolled back,
# logical_decoding_work_mem 1MB): the server streams the same chunks at the
# same points under both, interleaved alike between the concurrent
# transactions (54 changes of xid between chunks either way), in the same
# 184,357 frames; v4 adds only the abort's LSN and time to each Stream Abort
# (128 bytes in 42 MB), which csnd, dropping an aborted transaction whole, has
# no use for.  A bare drain was 12% quicker with v4 (best of 6: 0.65 s
# against 0.74 s), the reader's CPU no lower (0.16 s against 0.13 s); that
# drain runs at 250,000 frames/s, several times what csnd's decoders take, so
# the walsender's side is not what bounds csnd.  v4 would also change every
# recording's `proto_version` (2, docs/design.md section 7) and the Stream
# Abort parse, and 15 would still need 2: it does not pay.  2 on every version.
PROTO_VERSION: Final = "2"


def start_options(options: LiveOptions) -> dict[str, str]:
    """pgoutput's options for this source, in the order they are sent."""
    return {
        "proto_version": PROTO_VERSION,
        "publication_names": quote_ident(options.publication),
        "binary": "true" if options.binary else "false",
        "streaming": "on" if options.streaming else "off",
        "messages": "true" if options.messages else "false",
        **options.extra,
    }


def start_replication(
    link: ReplicationConnection, pgconn: pq.abc.PGconn, options: LiveOptions, start: Lsn, received: Lsn
) -> None:
    """Send START_REPLICATION from `start` and wait for COPY_BOTH; no answer at all is silence, as in the stream."""
    opt_sql = ", ".join(f"{k} {quote_literal(v)}" for k, v in start_options(options).items())
    sql = f"START_REPLICATION SLOT {quote_ident(options.slot)} LOGICAL {lsn_to_str(start)} ({opt_sql})"
    pgconn.send_query(sql.encode())
    silent_until = time.monotonic() + options.receive_timeout_s
    while True:
        if link.wait(pgconn, read=True):
            silent_until = time.monotonic() + options.receive_timeout_s
        elif time.monotonic() >= silent_until:
            raise link.silent(options.receive_timeout_s, options.slot, received, start)
        pgconn.consume_input()
        if not pgconn.is_busy():
            break
    res = pgconn.get_result()
    if res is None or res.status != pq.ExecStatus.COPY_BOTH:
        if res is None:
            raise ConnectionLost("START_REPLICATION returned no result", node=link.node)
        raise link.lost_slot(res, options.slot, start) or link.result_error(
            res, ["START_REPLICATION", f"slot {options.slot}"]
        )
