"""When a live source tries again, and when it gives up (sans-I/O).

Two questions decide what a failed replication connection does next, and
neither needs a socket to answer, so both live here and are tested without
a server (tests/reader/test_reconnect.py):

* Is the failure *permanent*?  A wrong password, a missing database, slot or
  publication, a role without REPLICATION, a slot of another output plugin,
  `wal_level` below logical: retrying changes nothing, so the source fails at
  once with one line saying what to do (`classify`).  Everything else -- a
  refused or dropped connection, a server starting up or shutting down, a
  slot still held by the walsender of the connection we just lost -- may
  pass by itself.

* How long to wait before the next attempt, and when to stop (`Backoff`:
  `csnd.core.backoff`'s policy with the reader's settings).  The wait is
  drawn below a ceiling that doubles from `first` up to `cap` (full jitter:
  the nodes of a cluster that lost their network together do not all come
  back in the same instant); the attempts stop once the source has been
  down for `give_up` seconds.  An outage ends only when a new connection has
  *flowed* -- delivered data, or stayed up for `stable` seconds -- not when
  it merely connected: a stream that connects and dies at once (a
  publication dropped under it used to be such a case) must not reset the
  wait to `first` and reconnect five times a second forever.

* Is the slot itself gone (`lost_slot`)?  A slot dropped under a running
  stream (`replication slot "x" does not exist` once the stream had started)
  or invalidated by the server (`can no longer get changes from replication
  slot "x"`: `max_slot_wal_keep_size` let the server remove its WAL) has
  lost what committed after its confirmed position.  Retrying cannot bring
  that back and a new slot would start after a gap, so it is a `SlotLost`
  saying which transactions cannot be delivered and what to do -- never a
  reconnect loop, and never the "pass --create-slot" of a slot that never was.

The clock is injected, so the policy is a pure function of the events and
the times it is given.
"""

from __future__ import annotations

import random as _random
import re
from collections.abc import Callable
from typing import Final

from csnd.core import backoff
from csnd.core.errors import SlotLost
from csnd.core.ids import Lsn, lsn_to_str

# The first wait's ceiling, the cap, and how long an outage may last before the source
# fails.  A restart of PostgreSQL takes seconds; an outage of minutes is for
# the operator to see as an error (`--give-up SECONDS`).
RECONNECT_FIRST_S: Final = 0.2
RECONNECT_MAX_S: Final = 5.0
RECONNECT_GIVE_UP_S: Final = 300.0
# A connection that stays up this long has flowed even if the source was idle
# (no data to deliver): twice the longest wait, so a connection that dies on a
# fixed schedule shorter than that cannot reset the backoff.
RECONNECT_STABLE_S: Final = 2 * RECONNECT_MAX_S

# SQLSTATEs a reconnect cannot fix: undefined object (no such slot or
# publication), undefined table, invalid authorization, bad password, no such
# database, object not in prerequisite state (wal_level, a slot of another
# database), syntax error, duplicate object, insufficient privilege, invalid
# parameter value (options a slot of another output plugin does not know).
PERMANENT_SQLSTATES: Final = frozenset(
    {"42704", "42P01", "28000", "28P01", "3D000", "55000", "42601", "42710", "42501", "22023"}
)
# A connection attempt's errors carry no SQLSTATE (libpq reports them as
# text); these server messages are the permanent ones.
PERMANENT_CONNECT_TEXTS: Final = (
    "does not exist",  # database "x" / role "x"
    "must be superuser or replication role",  # PostgreSQL 15
    "permission denied to start wal sender",  # 16 and later
    "password authentication failed",
    "no pg_hba.conf entry",
    "authentication failed",
    "invalid connection option",
    "invalid uri",
    "invalid integer value",
    "invalid port",
)


def classify(sqlstate: str | None, message: str, *, connecting: bool) -> bool:
    """True if the failure is permanent: `sqlstate` of a server error, or the text of a failed connect."""
    if sqlstate:
        return sqlstate in PERMANENT_SQLSTATES
    if connecting:
        text = message.lower()
        return any(t in text for t in PERMANENT_CONNECT_TEXTS)
    return False


class Backoff(backoff.Backoff):
    """The reconnect schedule of one source: `csnd.core.backoff.Backoff` with the reader's settings.

    `failed()` returns how long to wait before the next attempt, or None
    when the outage has lasted `give_up` seconds (the source fails).
    `connected()` and `flowing()` report a new connection and data on it.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        first: float = RECONNECT_FIRST_S,
        cap: float = RECONNECT_MAX_S,
        give_up: float = RECONNECT_GIVE_UP_S,
        stable: float = RECONNECT_STABLE_S,
        random: Callable[[], float] = _random.random,
    ) -> None:
        super().__init__(clock, first=first, cap=cap, give_up=give_up, stable=stable, random=random)


def one_line(text: str) -> str:
    """A libpq or server message on one line, without its `ERROR:`/`FATAL:` prefix or CONTEXT lines."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("CONTEXT:", "HINT:", "DETAIL:"))]
    out = " ".join(lines)
    for prefix in ("ERROR:", "FATAL:"):
        out = out.replace(prefix + "  ", "").replace(prefix + " ", "")
    return out


# PostgreSQL matches a logical replication connection against the lines of its
# database; the `replication` keyword matches physical replication only.
_HBA_WHY: Final = (
    "logical replication needs a line for the database itself: the replication keyword does not match "
    "logical replication"
)
_HBA_FIELDS: Final = re.compile(r'host "([^"]*)", user "([^"]*)", database "([^"]*)"')


def _hba_hint(text: str) -> str:
    """The pg_hba.conf line to add, from PostgreSQL's `no pg_hba.conf entry for host "H", user "U", database "D"`."""
    m = _HBA_FIELDS.search(text)
    if m is None:
        return f"add a pg_hba.conf line for the database and role, then SELECT pg_reload_conf() ({_HBA_WHY})"
    host, user, db = m.groups()
    if host == "[local]":  # (a Unix-domain socket)
        line, wider = f"local {db} {user} scram-sha-256", ""
    else:
        line, wider = (
            f"host {db} {user} {host}{'/128' if ':' in host else '/32'} scram-sha-256",
            " (or a wider range)",
        )
    return (
        f"add to the server's pg_hba.conf the line `{line}`{wider}, then SELECT pg_reload_conf(); {_HBA_WHY}"
    )


def connect_hint(text: str) -> str:
    """What to do about a failed connection, from libpq's text ('' when nothing useful can be said)."""
    t = text.lower()
    if "must be superuser or replication role" in t or "permission denied to start wal sender" in t:
        return "give the role the REPLICATION attribute (ALTER ROLE name REPLICATION)"
    if "database" in t and "does not exist" in t:
        return "check the database name in the URL"
    if "role" in t and "does not exist" in t:
        return "check the user name in the URL"
    if "no pg_hba.conf entry" in t:
        return _hba_hint(text)
    if "password" in t or "authentication failed" in t or "pg_hba.conf" in t:
        return f"check the user, the password and the server's pg_hba.conf ({_HBA_WHY})"
    if "refused" in t or "resolve" in t or "timeout" in t or "timed out" in t or "no route" in t:
        return "check the host and port, and that the server is running"
    return ""


def server_hint(sqlstate: str | None, text: str) -> str:
    """What to do about a server error on the replication connection ('' when nothing useful can be said)."""
    t = text.lower()
    if sqlstate == "42704" and "publication" in t:
        return "create it (CREATE PUBLICATION name FOR ALL TABLES) or name the right one with --publication"
    if sqlstate == "42704" and "replication slot" in t:
        return "pass --create-slot to create it"
    if sqlstate == "22023" and "output plugin" in t:
        return "the slot is not a pgoutput slot; csnd needs one (--create-slot with a new --slot name)"
    if sqlstate == "55006":
        return "another reader is using the slot: stop it, or name another --slot"
    if sqlstate == "55000" and "wal_level" in t:
        return "set wal_level = logical in postgresql.conf and restart the server"
    return ""


# The server's words for a slot whose WAL is gone (PostgreSQL 13 to 17): an
# invalidated slot at START_REPLICATION (SQLSTATE 55000; PostgreSQL 15 says
# "cannot read from logical replication slot" with this detail), or when
# decoding starts.
_INVALIDATED_TEXTS: Final = ("can no longer get changes from replication slot", "slot has been invalidated")


def lost_slot(
    sqlstate: str | None,
    text: str,
    *,
    node: str,
    slot: str,
    confirmed_lsn: Lsn,
    started: bool,
    detail: str = "",
) -> SlotLost | None:
    """The `SlotLost` a server error on START_REPLICATION (or in the stream) means, or None.

    `text` is the server's message, `detail` its DETAIL field.  `started`:
    the slot was there when this run began (checked or streamed from), so
    its absence now means it was dropped, not mistyped.
    """
    t = f"{text} {detail}".lower()
    if any(s in t for s in _INVALIDATED_TEXTS):
        reason = _INVALIDATION_CAUSE.search(detail)
        how = invalidated_how(reason.group(1) if reason else None)
    elif started and sqlstate == "42704" and "replication slot" in t and "does not exist" in t:
        how = (
            "was dropped on the server, or the server reached now is a promoted standby without a "
            "synchronised copy of it (to follow a failover, make the slot with --failover-slot and run "
            "the standby with sync_replication_slots = on; docs/failover.md)"
        )
    else:
        return None
    return slot_lost_error(node, slot, how, text, confirmed_lsn)


# PostgreSQL 17+ says why in the DETAIL: "This replication slot has been invalidated due to "idle_timeout"."
_INVALIDATION_CAUSE: Final = re.compile(r'invalidated due to "([a-z_]+)"')
# pg_replication_slots.invalidation_reason (PostgreSQL 17+), each with the setting or event behind it.
# Before 17 a logical slot on a primary is invalidated only for its WAL: `wal_removed`.
INVALIDATION_CAUSES: Final = {
    "wal_removed": "its WAL exceeded max_slot_wal_keep_size and was removed",
    "idle_timeout": "it was inactive longer than idle_replication_slot_timeout",
    "rows_removed": "the primary removed rows it still needed (a standby's slot conflicting with vacuum)",
    "wal_level_insufficient": "wal_level on the primary is no longer logical",
}


def invalidated_how(reason: str | None) -> str:
    """What a slot invalidated for `reason` (pg_replication_slots.invalidation_reason; None: unknown,
    before PostgreSQL 17) went through, for `slot_lost_error`."""
    cause = INVALIDATION_CAUSES.get(reason or "wal_removed", "")
    named = f"invalidation_reason {reason}: " if reason else ""
    return f"was invalidated by the server ({named}{cause or 'a cause csnd does not know'})"


def slot_lost_error(node: str, slot: str, how: str, server_text: str, confirmed_lsn: int) -> SlotLost:
    """The one line of a lost slot: which, how, from where nothing can be delivered, and what to do."""
    at = lsn_to_str(confirmed_lsn)
    said = f" ({server_text})" if server_text else ""
    return SlotLost(
        f"replication slot {slot} {how}{said}: its WAL is gone, so transactions committed after {at} "
        "cannot be delivered; create a new slot and start with a new changelog directory "
        "(or reload the tables from a snapshot)",
        node=node,
        lsn=confirmed_lsn,
    )
