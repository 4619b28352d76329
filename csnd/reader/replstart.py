"""START_REPLICATION: what a live source asks of pgoutput, and the wait for the stream to begin.

The options are pgoutput's (protocol version, publication, binary,
streaming of large in-progress transactions, logical messages), then
whatever the source's `extra` adds; the server answers with COPY_BOTH, or
with an error that is a slot lost, a mistake to fix or something a retry
may cure (`ReplicationConnection.result_error`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from psycopg import pq

from csnd.core.errors import ConnectionLost
from csnd.core.ids import Lsn, lsn_to_str
from csnd.reader.replconn import ReplicationConnection, quote_ident, quote_literal

if TYPE_CHECKING:
    from csnd.reader.live import LiveOptions


def start_options(options: LiveOptions) -> dict[str, str]:
    """pgoutput's options for this source, in the order they are sent."""
    return {
        "proto_version": "2",
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
