"""`csnd serve --slot-wait-timeout`: a slot that waits past it is given up with one line, no slot left.

An initial snapshot makes its slot at start-up; a transaction left open on
the server (here one prepared and forgotten) holds the slot short of its
consistent point for as long as it stays open.  With the bound set, serve
ends with exit 1 and one line naming the node, the slot and that
transaction, and pg_replication_slots holds no slot of that name.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.fixtures.pg import PgDatabase
from tests.service.servekit import CSND


def test_serve_gives_up_a_slot_past_its_wait_bound_naming_what_held_it(
    pg: PgDatabase, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    with pg.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO item VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'forgotten_gid'")
    try:
        proc = subprocess.run(
            [*CSND, "serve", f"dn1={pg.url}?slot=snap&publication=csnd_pub&snapshot=initial",
             "--changelog", str(tmp_path / "log"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--decoders", "1", "--slot-wait-timeout", "1"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        left = pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'snap'")
    finally:
        pg.execute("ROLLBACK PREPARED 'forgotten_gid'")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("csnd serve: error: node dn1: cannot create replication slot snap"), line
    assert "slot_wait_timeout 1 s" in line and "'forgotten_gid'" in line and "COMMIT PREPARED" in line, line
    assert "no slot was left" in line, line
    assert not left


def test_a_node_agent_gives_up_its_slot_past_the_bound_too(pg: PgDatabase) -> None:
    """`csnd node --create-slot --slot-wait-timeout`: the same line, naming a session held open."""
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    with pg.connect(autocommit=False) as held:
        held.execute("INSERT INTO item VALUES (1)")  # an xid, open: the slot waits for it
        pid = held.info.backend_pid
        proc = subprocess.run(
            [*CSND, "node", f"dn1={pg.url}", "--slot", "agent", "--publication", "csnd_pub",
             "--create-slot", "--listen", "127.0.0.1:0", "--decoders", "1", "--slot-wait-timeout", "1"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        left = pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'agent'")
        held.rollback()
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "node dn1: cannot create replication slot agent" in line, line
    assert f"pid {pid}" in line and "INSERT INTO item" in line and "no slot was left" in line, line
    assert not left
