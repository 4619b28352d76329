"""A snapshot's connection closed from another thread: its query cancelled, an idle one just closed."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from csnd.snapshot.closing import close_cancelling
from tests.fixtures.pg import PgDatabase

CEILING_S = 60.0  # a bound on waiting for a state, never a timing assertion


class _CountingCancels(psycopg.Connection[Any]):
    cancels = 0

    def cancel_safe(self, *, timeout: float = 30.0) -> None:
        type(self).cancels += 1
        super().cancel_safe(timeout=timeout)


def test_a_query_in_progress_is_cancelled_before_the_close(pg: PgDatabase) -> None:
    conn = _CountingCancels.connect(pg.dsn)
    errors: list[BaseException] = []
    started = threading.Event()

    def blocked() -> None:
        try:
            started.set()
            conn.execute("SELECT pg_sleep(600)")
        except BaseException as e:
            errors.append(e)

    query = threading.Thread(target=blocked, daemon=True)
    query.start()
    assert started.wait(CEILING_S)
    with pg.connect() as watcher:
        for _ in range(int(CEILING_S * 20)):
            running = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(600)' AND state = 'active'"
            ).fetchone()
            if running and running[0]:
                break
            threading.Event().wait(0.05)
    before = _CountingCancels.cancels
    close_cancelling(conn)
    query.join(CEILING_S)
    assert not query.is_alive(), "the query went on after the close"
    assert _CountingCancels.cancels == before + 1
    assert errors and isinstance(errors[0], psycopg.Error)
    assert conn.closed


@pytest.mark.parametrize("in_transaction", [False, True])
def test_an_idle_connection_is_closed_without_a_cancel(pg: PgDatabase, in_transaction: bool) -> None:
    conn = _CountingCancels.connect(pg.dsn, autocommit=not in_transaction)
    conn.execute("SELECT 1")  # (inside a transaction when not in autocommit: a planner's state)
    before = _CountingCancels.cancels
    close_cancelling(conn)
    assert _CountingCancels.cancels == before
    assert conn.closed
