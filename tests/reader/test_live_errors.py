"""Live sources that cannot work: one clear line and exit 1 at once, never a retry loop."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from csnd.core.errors import SourceError
from csnd.reader.events import PauseListener, QuietListener
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.record_cmd import record
from csnd.reader.resume import Item
from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]
# A generous ceiling: each case fails in well under a second; the old code retried forever.
CEILING_S = 120


def _record(
    url: str, out: Path, *extra: str, slot: str = "csnd", pub: str = "csnd_pub"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CSND, "record", f"dn1={url}", "--slot", slot, "--publication", pub, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=CEILING_S,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "retrying" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("csnd record: error: node dn1: ")
    return lines[0]


def test_unreachable_first_connection_fails_at_once(tmp_path: Path) -> None:
    opts = LiveOptions("postgresql://postgres@127.0.0.1:1/x", "s", "p")  # (give-up: the default 300 s)
    with pytest.raises(SourceError, match=r"node dn9: cannot connect: .*check the host and port"):
        record(LiveSource("dn9", opts), str(tmp_path / "y.pgstream"), progress=None)
    line = _one_error_line(_record("postgresql://postgres@127.0.0.1:1/x", tmp_path / "z.pgstream", "--text"))
    assert "Connection refused" in line and "check the host and port" in line


def test_missing_database(pg: PgDatabase, tmp_path: Path) -> None:
    url = pg.url.rsplit("/", 1)[0] + "/no_such_db"
    line = _one_error_line(_record(url, tmp_path / "x.pgstream"))
    assert '"no_such_db" does not exist' in line and "check the database name" in line


def test_role_without_replication(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    role = f"norepl_{pg.name}"
    pg.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        url = pg.url.replace("postgres@", f"{role}@")
        line = _one_error_line(_record(url, tmp_path / "x.pgstream", "--text"))
        # (15 says "must be superuser or replication role", 16+ "permission denied to start WAL sender")
        assert "REPLICATION attribute" in line and "ALTER ROLE" in line
    finally:
        pg.execute(f'DROP ROLE "{role}"')


def test_slot_of_another_plugin(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'test_decoding')")
    line = _one_error_line(_record(pg.url, tmp_path / "x.pgstream"))
    assert "slot csnd uses the output plugin test_decoding" in line and "pgoutput" in line


def test_missing_slot_says_to_pass_create_slot(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    line = _one_error_line(_record(pg.url, tmp_path / "x.pgstream"))
    assert "replication slot csnd does not exist; pass --create-slot" in line


def test_misspelled_publication_fails_at_once(pg: PgDatabase, tmp_path: Path) -> None:
    """It used to reconnect every 0.2 s forever, the file growing."""
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    workload.run(pg.dsn, rounds=1)
    line = _one_error_line(_record(pg.url, tmp_path / "x.pgstream", pub="csnd_pbu"))
    assert "publication csnd_pbu does not exist" in line and "CREATE PUBLICATION" in line


def test_publication_dropped_under_a_flowing_stream_is_permanent(pg: PgDatabase, tmp_path: Path) -> None:
    """Met after the stream flowed: still one error at once, not a reconnect loop."""
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    workload.run(pg.dsn, rounds=1, seed=1)
    flowed = threading.Event()

    class Watched(LiveSource):
        def frames(
            self, runs: bool = False, pauses: PauseListener | None = None, quiet: QuietListener | None = None
        ) -> Iterator[Item]:
            for item in super().frames(runs, pauses, quiet):
                yield item
                flowed.set()

    src = Watched("dn1", LiveOptions(pg.url, "csnd", "csnd_pub", binary=False))
    result: dict[str, Any] = {}

    def capture() -> None:
        try:
            record(src, str(tmp_path / "p.pgstream"), progress=None)
        except BaseException as e:  # (checked below)
            result["error"] = e

    t = threading.Thread(target=capture)
    t.start()
    try:
        assert flowed.wait(CEILING_S)
        pg.execute("DROP PUBLICATION csnd_pub")
        workload.run(pg.dsn, rounds=1, seed=2)
        t.join(CEILING_S)
    finally:
        src.close()
        t.join(CEILING_S)
    err = result.get("error")
    assert isinstance(err, SourceError), err
    assert 'publication "csnd_pub" does not exist' in str(err) and "CREATE PUBLICATION" in str(err)
    assert src.reconnects == 0


def test_slot_in_use_by_another_reader_is_reported(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    holder = _hold_slot(pg, "csnd")
    try:
        # (waited for a few seconds first: the walsender of a run that just ended may still hold it)
        proc = _record(pg.url, tmp_path / "x.pgstream")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        line = proc.stderr.strip().splitlines()[-1]
        assert line.startswith("csnd record: error: node dn1: ")
        assert 'replication slot "csnd" is active' in line and "stop it, or name another --slot" in line
    finally:
        holder.close()


def _hold_slot(pg: PgDatabase, slot: str) -> psycopg.Connection[Any]:
    """A replication connection streaming from `slot`, so that the slot is active."""
    conn = psycopg.connect(pg.dsn, replication="database", autocommit=True)
    pgconn = conn.pgconn
    pgconn.send_query(
        f"START_REPLICATION SLOT {slot} LOGICAL 0/0 (proto_version '2', publication_names 'csnd_pub')".encode()
    )
    res = pgconn.get_result()
    assert res is not None and res.status == psycopg.pq.ExecStatus.COPY_BOTH
    return conn
