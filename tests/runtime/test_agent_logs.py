"""What `csnd -v node` tells an operator: where its node resumes, and its connection's name."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.fixtures.pg import PgDatabase
from tests.service.servekit import wait_for

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def test_a_node_agent_says_where_it_resumes_and_names_its_connection(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("INSERT INTO item VALUES (1)")
    (row,) = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")
    cmd = [sys.executable, "-m", "csnd.cli", "-v", "node", f"dn1={pg.url}", "--slot", "csnd"]
    cmd += ["--publication", "csnd_pub", "--listen", "127.0.0.1:0", "--decoders", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(2)]
        assert lines[0].startswith("csnd node dn1: listening on 127.0.0.1:"), lines  # (still first)
        assert re.fullmatch(TIME + rf" csnd: node dn1 resumes from slot csnd at lsn {row[0]}\n", lines[1]), (
            lines
        )

        def walsender() -> str | None:
            got = pg.execute(
                "SELECT r.application_name FROM pg_replication_slots AS s JOIN pg_stat_replication AS r "
                "ON r.pid = s.active_pid WHERE s.slot_name = 'csnd'"
            )
            return str(got[0][0]) if got else None

        assert wait_for(walsender, "the agent streaming its slot") == "csnd node dn1"
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
