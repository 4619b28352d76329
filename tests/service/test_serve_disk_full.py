"""`csnd serve` when a disk it writes fills up: the changelog's, and the spill directory's.

Each directory is a small tmpfs of its own (we run as root; unmounted in
teardown).  The service must end with one line naming what it could not
write and ENOSPC, must not have confirmed its slot past what the changelog
holds, and, restarted once there is space, must give a consumer every
committed transaction exactly once.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Iterator

import psycopg
import pytest

from csnd.core.ids import lsn_from_str
from tests.fixtures.disks import fill, grow, tmpfs
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import CSND, Served, start_serve, subscribe, wait_for

SLOT = "csnd"


@pytest.fixture
def small_disk() -> Iterator[str]:
    """An 8 MiB tmpfs: `mount -o remount,size=...` gives it more."""
    with tmpfs("8m") as mnt:
        yield mnt


def _setup(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE big (id int PRIMARY KEY, v text)")
    pg.execute("ALTER TABLE big ALTER v SET STORAGE EXTERNAL")  # (sent whole: ~64 kB a line)
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")


def _source(pg: PgDatabase) -> str:
    return f"dn1={pg.url}?slot={SLOT}&publication=csnd_pub"


class Writer(threading.Thread):
    """One-row transactions of ~64 kB until told to stop; records each commit's end (an upper bound)."""

    def __init__(self, pg: PgDatabase, limit: int) -> None:
        super().__init__(daemon=True)
        self.pg = pg
        self.limit = limit
        self.ends: list[int] = []  # pg_current_wal_insert_lsn() right after commit i: >= its end LSN
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            while not self.stop.is_set() and len(self.ends) < self.limit:
                i = len(self.ends)
                c.execute("INSERT INTO big VALUES (%s, repeat(md5(%s::text), 2000))", (i, str(i)))
                (end,) = c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone() or ("0/0",)
                self.ends.append(lsn_from_str(str(end)))


def _ids(lines: list[str]) -> list[int]:
    """The ids of every change of every line, in order."""
    return [int(ch["new"]["id"]) for line in lines for ch in json.loads(line)["changes"]]


def _changelog_ids(changelog: str) -> list[int]:
    out = subprocess.run(
        [*CSND, "changelog", changelog], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    return _ids(out.splitlines())


def _confirmed(pg: PgDatabase) -> int:
    row = pg.execute(f"SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = '{SLOT}'")
    return lsn_from_str(str(row[0][0]))


def _ended(served: Served, seconds: float = 120) -> tuple[int, list[str]]:
    try:
        served.proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        served.kill()
        raise AssertionError("csnd serve still runs with its disk full") from None
    _out, err = served.proc.communicate(timeout=30)
    return served.proc.returncode, [ln for ln in err.splitlines() if ln.startswith("csnd serve: error:")]


def _all_once(served: Served, transactions: int, rows: int) -> None:
    """A consumer from the start gets `transactions` lines with ids 0..rows-1, each once, in commit order."""
    got = subscribe(served.address, "--from-csn", "0", "--limit", str(transactions), "--idle-timeout", "60")
    assert got.returncode == 0, got.stderr
    assert len(got.stdout.splitlines()) == transactions
    assert _ids(got.stdout.splitlines()) == list(range(rows))


def test_changelog_disk_full_ends_with_one_line_and_loses_nothing(pg: PgDatabase, small_disk: str) -> None:
    _setup(pg)
    changelog = os.path.join(small_disk, "changelog")
    served = start_serve([_source(pg)], changelog)
    writer = Writer(pg, 300)  # (19 MB of lines for an 8 MiB disk)
    writer.start()
    try:
        status, errors = _ended(served)
    finally:
        served.kill()
        writer.stop.set()
        writer.join(timeout=60)
    assert status == 1
    assert len(errors) == 1, errors
    line = errors[0]
    assert f"changelog {changelog}: cannot write {changelog}/" in line, line
    assert "No space left on device (ENOSPC)" in line and f"free space in {changelog}" in line, line

    # The slot is confirmed no further than the changelog holds: every transaction that
    # ended at or before the confirmed position is in it.
    held = set(_changelog_ids(changelog))
    confirmed = _confirmed(pg)
    assert all(i in held for i, end in enumerate(writer.ends) if end <= confirmed)

    # Restarted on the same disk, still full: the same line again, nothing lost.
    again = start_serve([_source(pg)], changelog)
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as c:  # (one more, so there is something to write)
            c.execute("INSERT INTO big VALUES (%s, repeat('z', 70000))", (len(writer.ends),))
        status, errors = _ended(again)
    finally:
        again.kill()
    assert status == 1 and len(errors) == 1 and "(ENOSPC)" in errors[0], errors
    n = len(writer.ends) + 1

    # Given space, a restart delivers every committed transaction exactly once.
    grow(small_disk, "128m")
    served = start_serve([_source(pg)], changelog)
    try:
        _all_once(served, n, n)
    finally:
        code, err = served.terminate()
    assert code == 0, err


def test_changelog_disk_filled_by_another_is_noticed_without_more_load(
    pg: PgDatabase, small_disk: str
) -> None:
    """The disk fills from outside, one transaction follows and then nothing: the service must end.

    Its write meets ENOSPC in the background sync; with no further
    transaction to append, that failure must still end the service (not
    wait, serving on, for a later append or a subscriber's mark to find it)."""
    _setup(pg)
    changelog = os.path.join(small_disk, "changelog")
    served = start_serve([_source(pg)], changelog)
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("INSERT INTO big VALUES (0, 'small')")
            wait_for(lambda: served.newest_csn() > 0, "the first transaction in the changelog")
            fill(small_disk)
            c.execute("INSERT INTO big VALUES (1, repeat(md5('1'), 2000))")  # (64 kB: past any page's slack)
        status, errors = _ended(served, seconds=60)
    finally:
        served.kill()
    assert status == 1
    assert len(errors) == 1, errors
    assert f"changelog {changelog}: cannot write {changelog}/" in errors[0], errors
    assert "(ENOSPC)" in errors[0] and f"free space in {changelog}" in errors[0], errors
    assert set(_changelog_ids(changelog)) == {0}

    os.unlink(os.path.join(small_disk, "filler"))
    served = start_serve([_source(pg)], changelog)
    try:
        _all_once(served, 2, 2)
    finally:
        code, err = served.terminate()
    assert code == 0, err


def test_full_spill_directory_names_node_xid_lsn_and_directory(pg: PgDatabase, small_disk: str) -> None:
    _setup(pg)
    spill = os.path.join(small_disk, "spill")
    os.mkdir(spill)
    config = os.path.join(tempfile.mkdtemp(prefix="csnd-cfg-"), "serve.toml")
    with open(config, "w") as f:
        f.write(f'[spill]\ndir = "{spill}"\nbytes = 65536\n')
    changelog = tempfile.mkdtemp(prefix="csnd-changelog-")
    served = start_serve([_source(pg)], changelog, "--config", config)
    try:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("INSERT INTO big VALUES (0, 'small')")
            wait_for(lambda: served.newest_csn() > 0, "the first transaction in the changelog")
            with c.transaction():  # ~12 MB of lines in one transaction: spills past the 8 MiB disk
                c.execute(
                    "INSERT INTO big SELECT g, repeat(md5(g::text), 2000) FROM generate_series(1, 190) g"
                )
            (xid,) = c.execute("SELECT xmin::text FROM big WHERE id = 1").fetchone() or ("?",)
        status, errors = _ended(served)
    finally:
        served.kill()
    assert status == 1
    assert len(errors) == 1, errors
    line = errors[0]
    assert line.startswith("csnd serve: error: node dn1: "), line
    # (the LSN: the change that did not fit)
    assert re.search(
        rf"transaction {xid} at [0-9A-F]+/[0-9A-F]+ in {spill}: No space left on device \(ENOSPC\)", line
    ), line
    assert set(_changelog_ids(changelog)) == {0}

    # Restarted with space (the same spill directory, grown): everything once, so nothing
    # past the big transaction was confirmed.
    grow(small_disk, "128m")
    served = start_serve([_source(pg)], changelog, "--config", config)
    try:
        _all_once(served, 2, 1 + 190)
    finally:
        code, err = served.terminate()
    assert code == 0, err
