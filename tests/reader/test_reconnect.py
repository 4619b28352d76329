"""The reconnect policy (sans-I/O): the reader's backoff settings and cases, and the error classes."""

from __future__ import annotations

import pickle

import pytest

from csnd.core import backoff
from csnd.core.errors import ConnectionLost, SlotLost
from csnd.core.ids import Lsn
from csnd.reader.reconnect import (
    RECONNECT_FIRST_S,
    RECONNECT_GIVE_UP_S,
    RECONNECT_MAX_S,
    RECONNECT_STABLE_S,
    Backoff,
    classify,
    connect_hint,
    lost_slot,
    one_line,
    server_hint,
)


def test_the_reader_backoff_is_the_core_policy_with_the_readers_settings() -> None:
    """The policy itself is tested against its oracle in tests/core/test_backoff.py."""
    b = Backoff(lambda: 0.0)
    assert isinstance(b, backoff.Backoff)
    assert (b.first, b.cap, b.give_up, b.stable) == (
        RECONNECT_FIRST_S,
        RECONNECT_MAX_S,
        RECONNECT_GIVE_UP_S,
        RECONNECT_STABLE_S,
    )
    assert RECONNECT_STABLE_S >= 2 * RECONNECT_MAX_S  # (a connection dying on a schedule cannot reset it)


def test_a_connection_that_dies_at_once_does_not_reset_the_wait() -> None:
    """A publication dropped under the stream used to reconnect every 0.2 s forever: connecting is not flowing."""
    now = [0.0]
    b = Backoff(lambda: now[0], first=0.2, cap=5.0, give_up=300.0, random=lambda: 1.0)  # (the ceilings)
    waits = []
    while (w := b.failed()) is not None:
        waits.append(w)
        now[0] += w
        b.connected()  # the connection comes up, the stream dies before any data
    assert waits[:6] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0]) and set(waits[6:-1]) == {5.0}
    assert now[0] == pytest.approx(300)  # it gave up at the give-up time (clock time, injected)


def test_data_ends_the_outage() -> None:
    now = [0.0]
    b = Backoff(lambda: now[0], first=0.2, cap=5.0, give_up=300.0, random=lambda: 1.0)
    assert [b.failed(), b.failed(), b.failed()] == pytest.approx([0.2, 0.4, 0.8])
    b.connected()
    b.flowing()
    assert b.failed() == 0.2


@pytest.mark.parametrize(
    ("sqlstate", "text", "connecting", "permanent"),
    [
        ("42704", 'replication slot "x" does not exist', False, True),
        ("42704", 'publication "p" does not exist', False, True),
        ("22023", 'option "proto_version" = "2" is unknown', False, True),
        ("55000", "logical decoding requires wal_level >= logical", False, True),
        ("55006", 'replication slot "x" is active for PID 7', False, False),
        ("57P01", "terminating connection due to administrator command", False, False),
        (None, 'FATAL:  database "nosuchdb" does not exist', True, True),
        (None, "FATAL:  must be superuser or replication role to start walsender", True, True),
        (None, 'FATAL:  password authentication failed for user "u"', True, True),
        (None, "Connection refused", True, False),
        (None, "the database system is starting up", True, False),
        (None, "server closed the connection unexpectedly", False, False),
    ],
)
def test_classify(sqlstate: str | None, text: str, connecting: bool, permanent: bool) -> None:
    assert classify(sqlstate, text, connecting=connecting) is permanent


def test_hints_and_one_line() -> None:
    assert "ALTER ROLE" in connect_hint("FATAL:  must be superuser or replication role to start walsender")
    assert "database name" in connect_hint('FATAL:  database "x" does not exist')
    assert "host and port" in connect_hint("Connection refused")
    assert "--create-slot" in server_hint("42704", 'replication slot "s" does not exist')
    assert "CREATE PUBLICATION" in server_hint("42704", 'publication "p" does not exist')
    assert "wal_level = logical" in server_hint("55000", "logical decoding requires wal_level >= logical")
    assert (
        one_line('ERROR:  publication "p" does not exist\nCONTEXT:  slot "s"\n')
        == 'publication "p" does not exist'
    )
    # libpq's text for a server that went away mid-stream (logged as one line on each retry)
    assert (
        one_line(
            "server closed the connection unexpectedly\n\tThis probably means the server terminated "
            "abnormally\n\tbefore or while processing the request.\n"
        )
        == "server closed the connection unexpectedly This probably means the server terminated abnormally "
        "before or while processing the request."
    )


def _lost(sqlstate: str, text: str, detail: str = "", started: bool = True) -> SlotLost | None:
    return lost_slot(
        sqlstate, text, node="dn1", slot="s1", confirmed_lsn=Lsn(0x1505F10), started=started, detail=detail
    )


def test_a_lost_slot_is_named_with_what_cannot_be_delivered() -> None:
    """A dropped or invalidated slot is a SlotLost (terminal), never the --create-slot hint."""
    dropped = _lost("42704", 'replication slot "s1" does not exist')
    assert isinstance(dropped, SlotLost) and not isinstance(dropped, ConnectionLost)
    assert str(dropped).startswith("node dn1: replication slot s1 was dropped on the server")
    assert "after 0/1505F10 cannot be delivered" in str(dropped)
    assert "new changelog directory" in str(dropped) and "--create-slot" not in str(dropped)
    # PostgreSQL 15 at START_REPLICATION; 13, 14, 16 and 17 when decoding starts
    pg15 = "This slot has been invalidated because it exceeded the maximum reserved size."
    for text, detail in (
        ('cannot read from logical replication slot "s1"', pg15),
        ('can no longer get changes from replication slot "s1"', ""),
    ):
        lost = _lost("55000", text, detail)
        assert lost is not None and "s1 was invalidated" in str(lost), lost
        assert "max_slot_wal_keep_size" in str(lost)
    # a slot never seen (the first connection's check says --create-slot), and other errors: not lost
    assert _lost("42704", 'replication slot "s1" does not exist', started=False) is None
    assert _lost("42704", 'publication "p" does not exist') is None
    assert (
        _lost("55000", 'cannot read from logical replication slot "s1"') is None
    )  # (no detail: in use etc.)
    assert _lost("57P01", "terminating connection due to administrator command") is None
    assert pickle.loads(pickle.dumps(dropped)).message == dropped.message


def test_the_pg_hba_hint_asks_for_a_line_of_the_database() -> None:
    """PostgreSQL's `replication` keyword matches physical replication only: a logical one needs the database's line."""
    hint = connect_hint(
        'FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "csnd", database "shop", no encryption'
    )
    assert "host shop csnd 10.0.0.7/32 scram-sha-256" in hint, hint
    assert "the replication keyword does not match logical replication" in hint, hint
    password = connect_hint('FATAL:  password authentication failed for user "csnd"')
    assert "password" in password and "the replication keyword does not match" in password


def test_an_invalidated_slot_is_named_with_the_server_s_reason() -> None:
    """PostgreSQL 17+ says why in the DETAIL: the error names that reason and its setting, not another."""
    text = 'can no longer access replication slot "s1"'  # (18's words at START_REPLICATION)
    for reason, setting in (
        ("idle_timeout", "idle_replication_slot_timeout"),
        ("wal_removed", "max_slot_wal_keep_size"),
        ("wal_level_insufficient", "wal_level"),
    ):
        detail = f'This replication slot has been invalidated due to "{reason}".'
        lost = _lost("55000", text, detail)
        assert lost is not None and "s1 was invalidated" in str(lost), lost
        assert f"invalidation_reason {reason}" in str(lost) and setting in str(lost), lost
        assert "after 0/1505F10 cannot be delivered" in str(lost)
    idle = _lost("55000", text, 'This replication slot has been invalidated due to "idle_timeout".')
    assert "max_slot_wal_keep_size" not in str(idle)
    # a reason this release does not know: said as the server said it
    odd = _lost("55000", text, 'This replication slot has been invalidated due to "something_new".')
    assert "invalidation_reason something_new" in str(odd)
