"""A new slot waiting for its consistent point: what it waits for, by name, and an optional bound.

CREATE_REPLICATION_SLOT returns only once every transaction that held an
xid when it was asked for has ended.  An operator watching a start-up that
does not finish must be told which transactions those are (server process,
user, application, since when, what it runs; the gid of a prepared one) and
what ends each; with `slot_wait_timeout_s` the creation is given up after
that long, the slot in the making gone from the server, with an error
naming node, slot and the transactions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from csnd.core.errors import SourceError
from csnd.reader.live import LiveOptions, LiveSource
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import wait_for

APP = "held_by_test"


@contextmanager
def _held_transactions(pg: PgDatabase) -> Iterator[tuple[int, int]]:
    """A session inside a transaction with an xid, and a prepared transaction: (its pid, ...)."""
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    held = psycopg.connect(pg.dsn, autocommit=False, application_name=APP)
    prepared = psycopg.connect(pg.dsn, autocommit=True)
    try:
        held.execute("INSERT INTO item VALUES (1)")  # an xid: the consistent point waits for it
        pid = held.info.backend_pid
        prepared.execute("BEGIN")
        prepared.execute("INSERT INTO item VALUES (2)")
        prepared.execute("PREPARE TRANSACTION 'gtm_test_gid'")
        xid = int(str(pg.execute("SELECT transaction::text FROM pg_prepared_xacts")[0][0]))
        yield pid, xid
    finally:
        held.rollback()
        held.close()
        with pg.connect() as conn:
            conn.execute("ROLLBACK PREPARED 'gtm_test_gid'")
        prepared.close()


def test_the_waiting_line_names_the_transactions_and_what_ends_them(
    pg: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="csnd.reader.live")
    source = LiveSource("dn1", LiveOptions(pg.url, "waits", "csnd_pub", create_slot=True))
    failures: list[BaseException] = []

    def prepare() -> None:
        try:
            source.prepare()
        except BaseException as e:  # (shown by the assertion below)
            failures.append(e)

    try:
        with _held_transactions(pg) as (pid, xid):
            maker = threading.Thread(target=prepare)
            maker.start()
            wait_for(
                lambda: any("waits for" in r.getMessage() for r in caplog.records) or not maker.is_alive(),
                "the slot's waiting line",
            )
            lines = [r.getMessage() for r in caplog.records if "waits for" in r.getMessage()]
            assert lines, failures
            line = lines[0]
            assert "node dn1" in line and "slot waits" in line, line
            # The open session: its server process, user, application, state and what it ran.
            assert f"pid {pid}" in line, line
            assert APP in line and "idle in transaction" in line and "INSERT INTO item" in line, line
            # The prepared one: its gid and what decides it.
            assert "gtm_test_gid" in line and str(xid) in line, line
            assert "COMMIT PREPARED" in line and "csnd gtm recover" in line, line
            assert "waited" in line, line
        maker.join(timeout=60)
        assert not maker.is_alive(), "the slot was not made once the transactions ended"
        assert not failures, failures
        assert pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'waits'")
    finally:
        source.close()


def test_a_bounded_wait_gives_up_naming_them_and_leaves_no_slot(pg: PgDatabase) -> None:
    options = LiveOptions(pg.url, "bounded", "csnd_pub", create_slot=True, slot_wait_timeout_s=1.0)
    source = LiveSource("dn1", options)
    try:
        with _held_transactions(pg) as (pid, _xid):
            with pytest.raises(SourceError) as caught:
                source.prepare()
            # (the transactions are still open: the slot is gone although they are)
            assert not pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'bounded'")
    finally:
        source.close()
    text = str(caught.value)
    assert caught.value.node == "dn1", text
    assert "slot bounded" in text and "slot_wait_timeout" in text, text
    assert f"pid {pid}" in text and "gtm_test_gid" in text, text
    assert "no slot was left" in text, text


def test_slot_wait_timeout_is_a_live_setting_of_serve() -> None:
    """`slot_wait_timeout` rides on the URL, in [defaults] and as --slot-wait-timeout; unset by default."""
    from csnd.core.errors import ConfigError
    from csnd.service.config import build_config

    url = "postgresql://h/db?slot=s&publication=p"
    c = build_config(
        {"defaults": {"slot_wait_timeout": 90}}, {"changelog": "c"}, [url, url + "&slot_wait_timeout=2.5"]
    )
    assert [s.live.slot_wait_timeout_s for s in c.sources] == [90.0, 2.5]
    assert c.sources[1].live.options("postgresql://h/db").slot_wait_timeout_s == 2.5
    c = build_config({}, {"changelog": "c", "slot_wait_timeout": 4.0}, [url], environ={})
    assert c.sources[0].live.slot_wait_timeout_s == 4.0
    c = build_config({}, {"changelog": "c"}, [url], environ={"CSND_SLOT_WAIT_TIMEOUT": "7"})
    assert c.sources[0].live.slot_wait_timeout_s == 7.0
    assert build_config({}, {"changelog": "c"}, [url], environ={}).sources[0].live.slot_wait_timeout_s is None
    with pytest.raises(ConfigError, match="slot_wait_timeout: expected a number > 0, got '0'"):
        build_config({}, {"changelog": "c"}, [url + "&slot_wait_timeout=0"], environ={})
