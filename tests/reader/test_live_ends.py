"""Where a live run ends: an `--until-lsn` before a new slot's start is an empty run, not an error."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]
CEILING_S = 180


def test_until_lsn_before_a_new_slot_s_start_is_an_empty_successful_replay(pg: PgDatabase) -> None:
    """The slot is made at the server's current position, past the end asked for: nothing to stream.

    It failed with "cannot advance replication slot to 0/1" (the final
    confirmation moved the new slot backwards).
    """
    workload.setup(pg.dsn)
    workload.run(pg.dsn, rounds=1, seed=1)
    end = pg.current_lsn()  # (WAL the new slot will start after)
    workload.run(pg.dsn, rounds=1, seed=2)
    for until in ("0/1", end):
        slot = "early" if until == "0/1" else "before_start"
        proc = subprocess.run(
            [
                *CSND,
                "replay",
                f"dn1={pg.url}",
                "--slot",
                slot,
                "--publication",
                "csnd_pub",
                "--create-slot",
                "--until-lsn",
                until,
            ],
            capture_output=True,
            text=True,
            timeout=CEILING_S,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "", proc.stdout
        assert "cannot advance" not in proc.stderr and "error" not in proc.stderr.lower(), proc.stderr
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (end, slot),
            ).fetchone()
        assert row == (True,), f"slot {slot} moved back or was not made: {row}"
