"""A source server shutting down while the reader holds its slot back: the shutdown goes on, the stream resumes.

A stopping walsender waits until the client reports flushed everything it
sent; the reader reports only what is durable downstream.  Without the probe
`pg_ctl stop -m fast` hung for as long as the reader held back (for good,
when a `committing` marker's writer was ended by the same shutdown).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from csnd.core.ids import lsn_from_str
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.pgoutput import Change
from csnd.reader.shutdown import ShutdownProbe, refuses_as_stopping
from csnd.testing.pgserver import PgServer, start_server

CEILING_S = 120


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _probe_with(error: Exception | None, clock: _Clock) -> tuple[ShutdownProbe, list[str]]:
    calls: list[str] = []

    def connect(conninfo: str, **kwargs: Any) -> Any:
        calls.append(conninfo)
        if error is not None:
            raise error

        class _Conn:
            def close(self) -> None:
                pass

        return _Conn()

    return ShutdownProbe("host=x", clock=clock, connect=connect), calls


def _settle(probe: ShutdownProbe) -> None:
    thread = probe._running
    assert thread is not None
    thread.join(10)


def test_a_refusal_as_shutting_down_marks_the_server_stopping() -> None:
    clock = _Clock()
    probe, calls = _probe_with(
        psycopg.OperationalError("FATAL:  the database system is shutting down"), clock
    )
    probe.maybe_probe()
    _settle(probe)
    assert probe.stopping.is_set() and calls == ["host=x"]
    probe.reset()
    assert not probe.stopping.is_set()


@pytest.mark.parametrize(
    "error", [psycopg.OperationalError("connection refused"), None, RuntimeError("anything else")]
)
def test_other_outcomes_say_nothing(error: Exception | None) -> None:
    probe, _ = _probe_with(error, _Clock())
    probe.maybe_probe()
    _settle(probe)
    assert not probe.stopping.is_set()


def test_probes_are_spaced_by_the_interval() -> None:
    clock = _Clock()
    probe, calls = _probe_with(psycopg.OperationalError("connection refused"), clock)
    for _ in range(5):
        probe.maybe_probe()
        _settle(probe)
    assert len(calls) == 1
    clock.now += probe.interval
    probe.maybe_probe()
    _settle(probe)
    assert len(calls) == 2


def test_the_sqlstate_alone_is_enough() -> None:
    err = psycopg.errors.CannotConnectNow("(localised text)")
    assert refuses_as_stopping(err)
    assert not refuses_as_stopping(psycopg.OperationalError("timeout expired"))


# --- a real server -------------------------------------------------------------------------


@pytest.fixture()
def own_server() -> Iterator[PgServer]:
    """A server of this test's own: it is stopped and started again.  (In a directory of its own, which
    the postgres user can reach when the tests run as root.)"""
    server = start_server()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


def _pg_ctl_stop_fast(server: PgServer, seconds: int) -> int:
    """`pg_ctl stop -m fast -t seconds`; its exit status (1: the server did not stop in time)."""
    proc = server._run(
        server.bin("pg_ctl"),
        "-D",
        server.data_dir,
        "-m",
        "fast",
        "-w",
        "-t",
        str(seconds),
        "stop",
        check=False,
    )
    return proc.returncode


def test_a_fast_shutdown_is_not_held_by_an_unconfirmed_stream_which_then_resumes(
    own_server: PgServer,
) -> None:
    url = own_server.url()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE t (id int PRIMARY KEY)")
        c.execute("CREATE PUBLICATION p FOR TABLE t")
        row = c.execute("SELECT lsn FROM pg_create_logical_replication_slot('s', 'pgoutput')").fetchone()
        assert row is not None
        (created,) = row
        c.execute("INSERT INTO t VALUES (1)")
    src = LiveSource("dn1", LiveOptions(url, "s", "p", binary=False))
    inserted: list[int] = []
    arrived = threading.Condition()
    failure: list[BaseException] = []

    def read() -> None:
        try:
            for _lsn, msg, _payload in src.frames():
                if isinstance(msg, Change) and msg.kind == "I":
                    with arrived:
                        inserted.append(
                            int(msg.data[-1:].decode())
                        )  # (text mode: the one digit ends the tuple)
                        arrived.notify_all()
        except BaseException as e:  # (checked below)
            failure.append(e)

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + CEILING_S
        with arrived:
            while len(inserted) < n:
                assert not failure, failure
                assert time.monotonic() < deadline, f"only {inserted} arrived"
                arrived.wait(1)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(1)
        # Confirmed, but only to before the insert: a valid flush position behind what was sent (a
        # walsender reads an unset one as "not tracked" and stops anyway), as a committing marker holds it.
        src.confirm(lsn_from_str(str(created)))
        with psycopg.connect(url, autocommit=True) as c:
            deadline = time.monotonic() + CEILING_S
            while c.execute(
                "SELECT flush_lsn = %s::pg_lsn FROM pg_stat_replication", (str(created),)
            ).fetchone() != (True,):
                assert time.monotonic() < deadline, "the walsender never heard of the confirmed position"
                time.sleep(0.05)
        assert _pg_ctl_stop_fast(own_server, 30) == 0, own_server.log_tail()
        assert src.shutdown.probes >= 1
        own_server.start()
        with psycopg.connect(url, autocommit=True) as c:
            c.execute("INSERT INTO t VALUES (2)")
        wait_for(2)  # reconnected: the row after the restart arrives
        assert inserted[-1] == 2 and src.reconnects >= 1
    finally:
        src.close()
        reader.join(CEILING_S)
    assert not failure, failure
