"""Slots made by csnd for a standby and for a failover: `--create-slot` on a hot standby, `--failover-slot`.

A slot made on a standby waits for the primary's next running-xacts record;
after a few seconds csnd says so and how to hurry it, and the slot is made
once the primary writes one (`pg_log_standby_snapshot()`).  `--failover-slot`
makes a slot that a standby with `sync_replication_slots` keeps a copy of;
a server that cannot make one (a standby, PostgreSQL before 17) is refused
with one line naming node and slot.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from csnd.testing.pgserver import PgServer, start_server
from tests.fixtures.standby import StandbyPair, standby_pair
from tests.service.servekit import CSND, start_serve, wait_for

pytestmark = pytest.mark.xdist_group("standby")


@pytest.fixture(scope="module")
def pair() -> Iterator[StandbyPair]:
    with standby_pair(failover_slots=True) as p:
        with psycopg.connect(p.primary.dsn(), autocommit=True) as c:
            c.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
            c.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
        p.wait_replayed()
        yield p


class Lines:
    """A pipe's lines as they come, read by a thread of their own."""

    def __init__(self, pipe: object) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._run, args=(pipe,), daemon=True)
        self._thread.start()

    def _run(self, pipe: object) -> None:
        for line in pipe:  # type: ignore[attr-defined]
            self.lines.append(str(line))

    def having(self, text: str) -> str | None:
        return next((ln for ln in list(self.lines) if text in ln), None)


def test_create_slot_on_a_standby_waits_for_the_primary_and_says_how_to_hurry_it(
    pair: StandbyPair, tmp_path: Path
) -> None:
    source = f"dn1={pair.standby.url()}?slot=on_standby&publication=csnd_pub&create_slot=true"
    cmd = [*CSND, "serve", source, "--changelog", str(tmp_path / "log"), "--listen", "127.0.0.1:0"]
    # A transaction open on the primary holds the slot short of its consistent point whatever
    # running-xacts records the primary writes meanwhile: the wait is long enough to be reported.
    with psycopg.connect(pair.primary.dsn()) as held:
        held.execute("SELECT pg_current_xact_id()")
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        out, err = Lines(proc.stdout), Lines(proc.stderr)
        try:
            line = wait_for(lambda: err.having("pg_log_standby_snapshot"), "the slot's progress line")
            assert (
                "node dn1: slot on_standby waits on this standby for the primary's next running-xacts" in line
            )
            assert "SELECT pg_log_standby_snapshot() on the primary" in line
            assert not out.having("listening on"), "ready before its slot was made"
            held.commit()
            with psycopg.connect(pair.primary.dsn(), autocommit=True) as c:

                def ready() -> str | None:
                    c.execute("SELECT pg_log_standby_snapshot()")
                    return out.having("csnd serve: listening on ")

                wait_for(ready, "the ready line once the primary logged running-xacts", every=0.2)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    with psycopg.connect(pair.standby.dsn(), autocommit=True) as c:
        row = c.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = 'on_standby'").fetchone()
        c.execute("SELECT pg_drop_replication_slot('on_standby')")
    assert row == ("pgoutput",), row


def test_failover_slot_makes_a_slot_the_standby_keeps_a_copy_of(pair: StandbyPair, tmp_path: Path) -> None:
    source = (
        f"dn1={pair.primary.url()}?slot=for_failover&publication=csnd_pub&create_slot=true&failover_slot=true"
    )
    served = start_serve([source], str(tmp_path / "log"))
    try:
        with psycopg.connect(pair.primary.dsn(), autocommit=True) as c:
            (failover,) = c.execute(
                "SELECT failover FROM pg_replication_slots WHERE slot_name = 'for_failover'"
            ).fetchone() or (None,)
            assert failover is True

            def synced() -> bool:  # (csnd confirms past running-xacts records: the copy becomes usable)
                c.execute(
                    "INSERT INTO item VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET v = excluded.v || 'y'"
                )
                c.execute("SELECT pg_log_standby_snapshot()")
                with psycopg.connect(pair.standby.dsn(), autocommit=True) as s:
                    row = s.execute(
                        "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 'for_failover'"
                    ).fetchone()
                return bool(row and row[0])

            wait_for(synced, "the standby's copy of the failover slot", every=0.3)
    finally:
        code, err = served.terminate()
    assert code == 0, err
    with psycopg.connect(pair.primary.dsn(), autocommit=True) as c:
        c.execute("SELECT pg_drop_replication_slot('for_failover')")


def _refused(source: str, tmp_path: Path) -> str:
    with pytest.raises(AssertionError, match="before it was ready") as failed:
        start_serve([source], str(tmp_path / "log")).kill()
    return str(failed.value)


def test_failover_slot_on_a_standby_is_refused(pair: StandbyPair, tmp_path: Path) -> None:
    text = _refused(
        f"dn1={pair.standby.url()}?slot=nope&publication=csnd_pub&create_slot=true&failover_slot=true",
        tmp_path,
    )
    assert "node dn1: cannot create replication slot nope as a failover slot on a standby" in text, text
    assert "make it on the primary" in text, text


@pytest.fixture
def pg15() -> Iterator[PgServer]:
    """A PostgreSQL 15 server of its own, whatever version the run's servers are."""
    server = start_server(version=15)
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


def test_failover_slot_before_postgresql_17_is_refused(pg15: PgServer, tmp_path: Path) -> None:
    with psycopg.connect(pg15.dsn(), autocommit=True) as c:
        c.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    text = _refused(
        f"dn1={pg15.url()}?slot=nope&publication=csnd_pub&create_slot=true&failover_slot=true", tmp_path
    )
    assert (
        "node dn1: cannot create replication slot nope as a failover slot: the server runs PostgreSQL 15"
        in text
    )
    assert "failover slots need 17 or later" in text, text
    with psycopg.connect(pg15.dsn(), autocommit=True) as c:
        assert c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'nope'").fetchone() is None
