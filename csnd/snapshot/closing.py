"""Closing a snapshot connection from another thread: a query in progress is cancelled first.

A planner or a chunk reader may be blocked in a query (behind a table's
lock) when the snapshot is stopped, and the cancel ends it at once.  A
cancel request is a connection of its own to the server, 6-10 ms here, so
a connection with no query in progress is closed without one: at the end
of every snapshot its planner is idle, and the cancel was most of the
reader's close (3.6 ms of a one-row table's 25 ms snapshot).
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import psycopg
from psycopg import pq

# How long a cancel request may take to be sent and answered.
CANCEL_TIMEOUT_S: Final = 2.0


def close_cancelling(conn: psycopg.Connection[Any]) -> None:
    """Close `conn`, cancelling the query it runs, if any; errors are dropped (it is being let go)."""
    if conn.info.transaction_status == pq.TransactionStatus.ACTIVE:
        with contextlib.suppress(Exception):
            conn.cancel_safe(timeout=CANCEL_TIMEOUT_S)
    with contextlib.suppress(Exception):
        conn.close()
