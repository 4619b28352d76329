"""A slot the server invalidated: one error naming node, slot and the server's reason, at once.

PostgreSQL invalidates a slot whose WAL exceeded `max_slot_wal_keep_size`
(reason `wal_removed`) and, from 18, one left inactive longer than
`idle_replication_slot_timeout` (`idle_timeout`).  Either way the changes
after its confirmed position are gone: csnd must say so and stop, never
retry, and never blame the wrong setting.  These run on a PostgreSQL 18
server of their own (the settings change the whole server).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from csnd.core.errors import SlotLost
from csnd.service.nodes import check_slots_kept
from csnd.testing.pgserver import PgServer, start_server

CSND = [sys.executable, "-m", "csnd.cli"]
CEILING_S = 120


@pytest.fixture()
def server18() -> Iterator[PgServer]:
    server = start_server(version=18)
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


def _invalidate(conn: psycopg.Connection[tuple[object, ...]], slot: str, force: str) -> str:
    """CHECKPOINT (with `force` run before each) until the server invalidates `slot`; its reason."""
    deadline = time.monotonic() + CEILING_S
    while True:
        conn.execute(force)
        conn.execute("CHECKPOINT")
        row = conn.execute(
            "SELECT invalidation_reason FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        assert row is not None
        if row[0] is not None:
            return str(row[0])
        assert time.monotonic() < deadline, f"slot {slot} never invalidated"


def _replay(url: str, slot: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CSND, "replay", f"dn7={url}", "--slot", slot, "--publication", "p"],
        capture_output=True,
        text=True,
        timeout=CEILING_S,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "retrying" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_a_slot_invalidated_as_idle_is_one_error_naming_node_slot_and_reason(server18: PgServer) -> None:
    url = server18.url()
    with psycopg.connect(server18.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('idle', 'pgoutput')")
        conn.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '1s'")
        conn.execute("SELECT pg_reload_conf()")
        # (a checkpoint invalidates a slot inactive past the timeout; WAL is written so one is not skipped)
        assert (
            _invalidate(conn, "idle", "INSERT INTO t SELECT coalesce(max(id), 0) + 1 FROM t")
            == "idle_timeout"
        )
    line = _one_error_line(_replay(url, "idle"))
    assert "node dn7" in line and "replication slot idle" in line, line
    assert "idle_replication_slot_timeout" in line, line
    assert "max_slot_wal_keep_size" not in line, line


def test_a_slot_whose_wal_was_removed_names_max_slot_wal_keep_size(server18: PgServer) -> None:
    url = server18.url()
    with psycopg.connect(server18.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION p FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('behind', 'pgoutput')")
        conn.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
        conn.execute("SELECT pg_reload_conf()")
        # (each switch ends a WAL segment: the slot falls behind by more than 1 MB at once)
        reason = _invalidate(
            conn, "behind", "INSERT INTO t SELECT coalesce(max(id), 0) + 1 FROM t; SELECT pg_switch_wal()"
        )
        assert reason == "wal_removed"
    line = _one_error_line(_replay(url, "behind"))
    assert "node dn7" in line and "replication slot behind" in line, line
    assert "max_slot_wal_keep_size" in line and "wal_removed" in line, line


def test_serves_pre_start_check_names_the_servers_reason_for_an_idle_slot(server18: PgServer) -> None:
    """`csnd serve` checks its slots before it starts: an idle-invalidated one is not blamed on WAL size."""
    with psycopg.connect(server18.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot('idle2', 'pgoutput')")
        conn.execute("ALTER SYSTEM SET idle_replication_slot_timeout = '1s'")
        conn.execute("SELECT pg_reload_conf()")
        confirmed = conn.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'idle2'"
        ).fetchone()
        assert confirmed is not None
        assert (
            _invalidate(conn, "idle2", "INSERT INTO t SELECT coalesce(max(id), 0) + 1 FROM t")
            == "idle_timeout"
        )
    with pytest.raises(SlotLost) as lost:
        check_slots_kept([("dn7", server18.dsn(), "idle2")], "/var/lib/csnd", newest_csn=42)
    line = str(lost.value)
    assert "node dn7" in line and "replication slot idle2" in line, line
    assert "idle_replication_slot_timeout" in line and "idle_timeout" in line, line
    assert "max_slot_wal_keep_size" not in line, line
    assert f"after {confirmed[0]}" in line, line
