"""`csnd serve` when its replication slot is gone: dropped under the stream, or invalidated by the server.

Either way the WAL after the slot's confirmed position may be removed, so
the service must not reconnect forever, must not point at `--create-slot`
(a new slot starts at the server's current position: a silent gap), and must
not make a new slot when restarted over the changelog that the old one fed.
It ends with one line naming the node, the slot and the LSN after which
transactions cannot be delivered, and what to do.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from csnd.testing.pgserver import PgServer, start_server
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import Served, start_serve, wait_for

SLOT = "csnd"
CSND = [sys.executable, "-m", "csnd.cli"]


def _setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        c.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")


def _insert(dsn: str, ids: range) -> None:
    with psycopg.connect(dsn, autocommit=True) as c:
        for i in ids:
            c.execute("INSERT INTO item VALUES (%s, 'x')", (i,))


def _source(url: str) -> str:
    return f"dn1={url}?slot={SLOT}&publication=csnd_pub&create_slot=true"


def _ended(served: Served, seconds: float = 90) -> tuple[int, list[str]]:
    """The service's exit status and its error lines, once it has ended by itself."""
    try:
        served.proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        served.kill()
        raise AssertionError("csnd serve still runs with its slot gone (a reconnect loop hides it)") from None
    _out, err = served.proc.communicate(timeout=30)
    return served.proc.returncode, [ln for ln in err.splitlines() if ln.startswith("csnd serve: error:")]


_started: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _no_subscriber_left() -> Iterator[None]:
    yield
    while _started:
        sub = _started.pop()
        if sub.poll() is None:
            sub.kill()
            sub.wait()


def _subscriber(address: str, tmp: str) -> subprocess.Popen[bytes]:
    """`csnd subscribe` of the service, printing to `tmp`/sub.out (its stderr: sub.err)."""
    with open(os.path.join(tmp, "sub.out"), "wb") as out, open(os.path.join(tmp, "sub.err"), "wb") as err:
        sub = subprocess.Popen([*CSND, "subscribe", address], stdout=out, stderr=err)
    _started.append(sub)
    return sub


def _printed(tmp: str) -> bool:
    with open(os.path.join(tmp, "sub.out"), "rb") as f:
        return bool(f.read().strip())


def _subscriber_told(sub: subprocess.Popen[bytes], tmp: str) -> tuple[int, str, list[int]]:
    """The subscriber's exit status, stderr and printed csns once it has ended by itself after the service."""
    try:
        sub.wait(timeout=60)
    except subprocess.TimeoutExpired:
        sub.kill()
        sub.wait()
        raise AssertionError(
            "csnd subscribe still runs 60 s after its service ended on a lost slot: it was never told why"
        ) from None
    with open(os.path.join(tmp, "sub.out"), "rb") as f:
        csns = [int(json.loads(line)["csn"]) for line in f.read().splitlines() if line.strip()]
    with open(os.path.join(tmp, "sub.err"), encoding="utf-8", errors="replace") as f:
        return sub.returncode, f.read(), csns


def _assert_told(sub: subprocess.Popen[bytes], tmp: str, how: str) -> None:
    """The subscriber ended, exit 1, with the one line that names node and slot; before it, a gapless prefix."""
    code, err, csns = _subscriber_told(sub, tmp)
    assert code == 1, (code, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("csnd subscribe: error:"), err
    assert "node dn1" in lines[0] and f"replication slot {SLOT} was {how}" in lines[0], err
    assert csns and csns == sorted(set(csns)), csns


def _slot_exists(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as c:
        return (
            c.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
            is not None
        )


def test_dropped_slot_ends_the_service_and_is_never_made_anew(pg: PgDatabase, tmp_path: object) -> None:
    _setup(pg.dsn)
    changelog = os.path.join(str(tmp_path), "changelog")
    served = start_serve([_source(pg.url)], changelog)
    sub = _subscriber(served.address, str(tmp_path))
    try:
        _insert(pg.dsn, range(20))
        wait_for(lambda: served.newest_csn() > 0, "the first transactions in the changelog")
        # (connected, not only started: one that first dials after the service ended is told nothing)
        wait_for(lambda: _printed(str(tmp_path)), "the subscriber's first line")
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            deadline = time.monotonic() + 60
            while True:  # (the reader reconnects at once: terminate and drop until the drop wins)
                (pid,) = c.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
                ).fetchone() or (None,)
                if pid is not None:
                    c.execute("SELECT pg_terminate_backend(%s)", (pid,))
                try:
                    c.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
                    break
                except psycopg.errors.ObjectInUse:
                    assert time.monotonic() < deadline, "the slot stayed in use"
                    time.sleep(0.02)
        _insert(pg.dsn, range(20, 30))  # committed with no slot: no csnd can deliver these
        status, errors = _ended(served)
    finally:
        served.kill()
    # Its subscriber is told why, with the same line, and stops (a reconnect would find no service).
    _assert_told(sub, str(tmp_path), "dropped")
    assert status == 1
    assert len(errors) == 1, errors
    line = errors[0]
    assert "node dn1" in line and f"replication slot {SLOT} was dropped" in line, line
    assert "cannot be delivered" in line and "new changelog directory" in line, line
    assert "--create-slot" not in line, line

    # Restarted over the same changelog with create_slot still on its URL: it refuses before it is ready.
    with pytest.raises(AssertionError, match="before it was ready") as failed:
        start_serve([_source(pg.url)], changelog).kill()
    text = str(failed.value)
    assert f"node dn1: replication slot {SLOT} does not exist, but changelog" in text, text
    assert "cannot be delivered" in text, text
    assert not _slot_exists(pg.dsn), "a new slot was made: what committed without one would be skipped"


@pytest.fixture
def small_wal_server() -> Iterator[PgServer]:
    """A server of its own that keeps at most 1 MB of WAL for a slot (the shared one must not lose slots)."""
    server = start_server()
    try:
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            c.execute("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'")
            c.execute("ALTER SYSTEM SET wal_keep_size = 0")
            c.execute("SELECT pg_reload_conf()")
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


def test_invalidated_slot_ends_the_service(small_wal_server: PgServer, tmp_path: object) -> None:
    dsn, url = small_wal_server.dsn(), small_wal_server.url()
    _setup(dsn)
    changelog = os.path.join(str(tmp_path), "changelog")
    served = start_serve([_source(url)], changelog)
    sub = _subscriber(served.address, str(tmp_path))
    stopped = False
    try:
        _insert(dsn, range(10))
        wait_for(lambda: served.newest_csn() > 0, "the first transactions in the changelog")
        # (connected, not only started: one that first dials after the service ended is told nothing)
        wait_for(lambda: _printed(str(tmp_path)), "the subscriber's first line")
        wait_for(
            lambda: os.path.getsize(os.path.join(str(tmp_path), "sub.out")) > 0, "the subscriber's lines"
        )
        os.kill(served.proc.pid, signal.SIGSTOP)  # nothing is confirmed from now on
        stopped = True
        with psycopg.connect(dsn, autocommit=True) as c:

            def lost() -> bool:
                for i in range(3):  # WAL past max_slot_wal_keep_size: whole segments
                    c.execute("INSERT INTO item VALUES (%s, 'y') ON CONFLICT (id) DO NOTHING", (1000 + i,))
                    c.execute("SELECT pg_switch_wal()")
                c.execute("CHECKPOINT")
                row = c.execute("SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
                return bool((row.fetchone() or ("",))[0] == "lost")

            wait_for(lost, "the slot's wal_status to become lost", seconds=60, every=0.5)
        os.kill(served.proc.pid, signal.SIGCONT)
        stopped = False
        status, errors = _ended(served)
    finally:
        if stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(served.proc.pid, signal.SIGCONT)
        served.kill()
    _assert_told(sub, str(tmp_path), "invalidated")
    assert status == 1
    assert len(errors) == 1, errors
    line = errors[0]
    assert "node dn1" in line and f"replication slot {SLOT} was invalidated" in line, line
    assert "max_slot_wal_keep_size" in line and "cannot be delivered" in line, line
    assert "new changelog directory" in line, line

    # Restarted: the slot is still listed (wal_status lost), and refused before the ready line.
    with pytest.raises(AssertionError, match="before it was ready") as failed:
        start_serve([_source(url)], changelog).kill()
    assert f"node dn1: replication slot {SLOT} was invalidated" in str(failed.value), failed.value
