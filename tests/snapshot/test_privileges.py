"""An initial snapshot by a role that may not read the tables: refused before its slot is made.

The quick start's role replicates but had no SELECT on the tables: `csnd
serve --snapshot initial` made the slot, failed in the copy with
`permission denied for table ...` and left the slot behind, holding WAL.
Now the privileges are checked first (one query over the publication's
tables), and the error names the node, the role, the tables and the GRANT.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd.core.errors import SnapshotError
from csnd.snapshot.privileges import check_snapshot_privileges
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]


@pytest.fixture
def reader_role(pg: PgDatabase) -> Iterator[str]:
    """A role that may replicate and read `public.granted`, but not `public.acct` nor `odd."Mixed Case"`."""
    role = f"reader_{pg.name}"
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY, owner text)")
    pg.execute("CREATE TABLE granted (id int PRIMARY KEY)")
    pg.execute('CREATE SCHEMA odd; CREATE TABLE odd."Mixed Case" (id int PRIMARY KEY)')
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute(f'CREATE ROLE "{role}" LOGIN REPLICATION')
    pg.execute(f'GRANT SELECT ON granted TO "{role}"; GRANT USAGE ON SCHEMA odd TO "{role}"')
    try:
        yield role
    finally:
        pg.execute(f'DROP OWNED BY "{role}"')
        pg.execute(f'DROP ROLE "{role}"')


def test_serve_refuses_before_making_the_slot(pg: PgDatabase, reader_role: str, tmp_path: Path) -> None:
    url = pg.url.replace("postgres@", f"{reader_role}@")
    proc = subprocess.run(
        [
            *CSND,
            "serve",
            f"dn1={url}?slot=csnd&publication=csnd_pub&snapshot=initial",
            "--changelog",
            str(tmp_path / "log"),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "psycopg.Copy" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line == (
        f"csnd serve: error: node dn1: role {reader_role} may not read 2 tables of publication csnd_pub, "
        f'which an initial snapshot copies: odd."Mixed Case", public.acct; grant it: '
        f'GRANT SELECT ON odd."Mixed Case", public.acct TO {reader_role}'
    ), proc.stderr
    assert pg.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()") == []


def test_a_role_that_may_read_every_table_passes(pg: PgDatabase, reader_role: str) -> None:
    dsn = pg.dsn.replace("user=postgres", f"user={reader_role}")
    with pytest.raises(SnapshotError, match="may not read 2 tables"):
        check_snapshot_privileges("dn1", dsn, "csnd_pub")
    pg.execute(f'GRANT SELECT ON acct, odd."Mixed Case" TO "{reader_role}"')
    check_snapshot_privileges("dn1", dsn, "csnd_pub")
    check_snapshot_privileges("dn1", dsn, "no_such_pub")  # (no tables: the slot's own check names it)
