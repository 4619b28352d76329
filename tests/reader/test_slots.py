"""The slots a run creates are reported; csnd slot list|drop."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from csnd.reader.slots import report_created, shown_url
from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase
from tests.reader.test_live import _record_cli
from tests.reader.test_live_errors import _hold_slot

CSND = [sys.executable, "-m", "csnd.cli"]


def _csnd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, *args], capture_output=True, text=True, timeout=120)


def test_a_created_slot_is_reported_listed_and_dropped(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    proc = _record_cli(pg, tmp_path / "x.pgstream", pg.current_lsn(), "--create-slot")
    assert proc.returncode == 0, proc.stderr
    restart = pg.execute("SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")[0][0]
    assert (
        f"csnd: slot csnd on dn1 holds WAL from {restart}; drop it with csnd slot drop csnd {pg.url} when done"
        in proc.stderr
    )
    listed = _csnd("slot", "list", pg.url)
    assert listed.returncode == 0, listed.stderr
    assert any(
        line.startswith("csnd\tlogical pgoutput\t") and "inactive" in line
        for line in listed.stdout.splitlines()
    )
    dropped = _csnd("slot", "drop", "csnd", pg.url)
    assert dropped.returncode == 0, dropped.stderr
    assert pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'csnd'") == []
    again = _csnd("slot", "drop", "csnd", pg.url)
    assert again.returncode == 1 and "there is no replication slot csnd" in again.stderr


def test_an_existing_slot_is_not_reported(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    proc = _record_cli(pg, tmp_path / "x.pgstream", pg.current_lsn(), "--create-slot")
    assert proc.returncode == 0 and "drop it with" not in proc.stderr


def test_an_active_slot_is_not_dropped(pg: PgDatabase) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    holder = _hold_slot(pg, "csnd")
    try:
        proc = _csnd("slot", "drop", "csnd", pg.url)
    finally:
        holder.close()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (
        "replication slot csnd on" in proc.stderr
        and "is active" in proc.stderr
        and "stop the reader" in proc.stderr
    )
    assert pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'csnd'") == [(1,)]


def test_slot_usage_errors() -> None:
    proc = _csnd("slot", "drop", "only_a_name")
    assert proc.returncode == 2 and "usage: csnd slot drop [-h] [-v] NAME URL" in proc.stderr


def test_a_drop_hint_with_libpq_parameters_pastes_into_a_shell(pg: PgDatabase) -> None:
    """A URL with `?...&...` in the hint is quoted, so the command line works pasted as it is."""
    pg.execute("SELECT pg_create_logical_replication_slot('csnd_q', 'pgoutput')")
    url = f"{pg.url}?sslmode=disable&connect_timeout=5"
    out = io.StringIO()
    report_created([("dn1", "csnd_q", url)], out)
    hint = out.getvalue().strip()
    command = hint.split("drop it with ", 1)[1].removesuffix(" when done")
    # (as bash reads it: an unquoted & would end the command there)
    words = ["slot", "drop", "csnd_q", shown_url(url)]
    shell = subprocess.run(
        ["bash", "-c", "csnd() { printf '%s\\n' \"$@\"; wait; }; " + command],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.stdout.splitlines() == words, hint
