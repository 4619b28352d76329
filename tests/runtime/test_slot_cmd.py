"""`csnd slot list|drop` as a user runs it: its own usage lines, a checked URL, one line per failure."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from csnd.testing.pgserver import free_port
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]


def _csnd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, *args], capture_output=True, text=True, timeout=120)


def _usage_error(proc: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """(usage line, error line) of an argparse usage error."""
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    return lines[0], lines[-1]


def _error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_each_action_has_its_own_usage() -> None:
    assert _usage_error(_csnd("slot", "drop", "s1", "not-a-url")) == (
        "usage: csnd slot drop [-h] [-v] NAME URL",
        "csnd slot drop: error: argument URL: expected a postgresql:// or postgres:// URL or a key=value "
        "conninfo, got 'not-a-url'",
    )
    assert _usage_error(_csnd("slot", "drop", "only_a_name")) == (
        "usage: csnd slot drop [-h] [-v] NAME URL",
        "csnd slot drop: error: the following arguments are required: URL",
    )
    assert _usage_error(_csnd("slot", "list")) == (
        "usage: csnd slot list [-h] [-v] URL",
        "csnd slot list: error: the following arguments are required: URL",
    )
    usage, line = _usage_error(_csnd("slot"))
    assert usage.startswith("usage: csnd slot [-h] [-v]") and "{list,drop}" in usage and "required" in line
    usage, line = _usage_error(_csnd("slot", "create", "s1", "postgresql://h/db"))
    assert "invalid choice: 'create'" in line
    _, line = _usage_error(_csnd("slot", "drop", "Bad-Name", "postgresql://h/db"))
    assert line.startswith("csnd slot drop: error: argument NAME: expected a slot name")
    _, line = _usage_error(_csnd("slot", "list", "postgres://u:secret@%zz/db"))
    assert "is not a valid conninfo: invalid percent-encoded token" in line and "secret" not in line
    assert "NAME URL" in _csnd("slot", "drop", "--help").stdout


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@127.0.0.1:{port}/db",
        "postgresql://u@127.0.0.1:{port}/db?password=secret",
        "host=127.0.0.1 port={port} user=u password=secret dbname=db",
        "host=127.0.0.1 port={port} password='sec ret' dbname=db",
    ],
)
def test_a_node_that_fails_is_one_line_without_the_password(url: str) -> None:
    """`csnd slot drop s1 not-a-url` was "internal error: ProgrammingError"; a conninfo's password was printed."""
    url = url.format(port=free_port())
    line = _error(_csnd("slot", "drop", "s1", url))
    assert line.startswith("csnd slot: error: cannot drop replication slot s1: cannot connect to "), line
    assert "***" in line and "secret" not in line and "sec ret" not in line
    line = _error(_csnd("slot", "list", url))
    assert line.startswith("csnd slot: error: cannot connect to ") and "secret" not in line


@pytest.fixture
def unprivileged(pg: PgDatabase) -> Iterator[str]:
    """A URL (with a password) of a role that may connect but not read the slots or the WAL position."""
    role = f"nopriv_{pg.name}"
    pg.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'secret'")
    pg.execute("REVOKE SELECT ON pg_replication_slots FROM PUBLIC")
    pg.execute("REVOKE EXECUTE ON FUNCTION pg_current_wal_lsn() FROM PUBLIC")
    try:
        yield f"postgresql://{role}:secret@127.0.0.1:{pg.server.port}/{pg.name}"
    finally:
        pg.execute(f"DROP OWNED BY {role}")
        pg.execute(f"DROP ROLE {role}")


def test_a_server_error_names_the_node_and_the_slot(pg: PgDatabase, unprivileged: str) -> None:
    shown = unprivileged.replace(":secret@", ":***@")
    assert _error(_csnd("slot", "drop", "s1", unprivileged)) == (
        f"csnd slot: error: cannot drop replication slot s1 on {shown}: permission denied for view "
        "pg_replication_slots"
    )
    line = _error(_csnd("slot", "list", unprivileged))
    assert line.startswith(
        f"csnd slot: error: cannot list the replication slots on {shown}: permission denied"
    )
