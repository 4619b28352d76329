"""The dashboard's slot monitor reads its node's slot over one kept connection."""

from __future__ import annotations

import time
from collections.abc import Callable

from csnd.service.nodes import SlotMonitor
from tests.fixtures.pg import PgDatabase

CEILING_S = 60.0  # a bound on waiting for the server's view, never a timing assertion


def _backends(pg: PgDatabase, app: str) -> set[int]:
    rows = pg.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (app,))
    return {int(str(r[0])) for r in rows}


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CEILING_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_slot_monitor_keeps_its_connection_between_readings(pg: PgDatabase) -> None:
    """A new connection a reading cost 35 ms of CPU (most of it Python holding the GIL) every 5 s:
    one is kept, and one the server drops is replaced within the same reading."""
    slot = f"mon_{pg.name}"
    app = f"csnd-test-monitor-{pg.name}"[:63]
    pg.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))
    monitor = SlotMonitor(f"{pg.dsn} application_name={app}", slot)
    try:
        first = monitor.read_kept()
        assert first.error == "" and first.wal_status == "reserved", first
        kept = _backends(pg, app)
        assert len(kept) == 1
        assert monitor.read_kept().error == ""
        assert _backends(pg, app) == kept  # (the same backend: no new connection)
        pg.execute("SELECT pg_terminate_backend(%s)", (next(iter(kept)),))
        _until(lambda: not _backends(pg, app), "the terminated backend never went away")
        again = monitor.read_kept()
        assert again.error == "" and again.wal_status == "reserved", again
        assert len(_backends(pg, app)) == 1
    finally:
        monitor.close()
        pg.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    _until(lambda: not _backends(pg, app), "the monitor's connection stayed open after close()")


def test_the_slot_monitor_names_a_server_it_cannot_reach(pg: PgDatabase) -> None:
    monitor = SlotMonitor(f"{pg.dsn} port=1 connect_timeout=2", "nope")
    try:
        reading = monitor.read_kept()
    finally:
        monitor.close()
    assert reading.error and "1" in reading.error, reading
