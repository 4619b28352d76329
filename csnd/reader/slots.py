"""Replication slots as the user sees them: `csnd slot list|drop`, and what a run leaves behind.

A logical slot keeps every byte of WAL from its restart position until it is
confirmed further or dropped: one forgotten after a trial run fills the
server's disk.  So a run that created a slot (`--create-slot`) says at its
end which slot holds WAL from where and how to drop it, and `csnd slot drop`
drops one -- never an active one, which belongs to a running reader.
"""

from __future__ import annotations

import shlex
import urllib.parse
from typing import TextIO

import psycopg

from csnd.core.errors import SourceError
from csnd.reader.reconnect import connect_hint, one_line

_SLOTS_SQL = (
    "SELECT slot_name, COALESCE(plugin, ''), slot_type, COALESCE(database, ''), active, active_pid, "
    "restart_lsn::text, confirmed_flush_lsn::text, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 "
    "FROM pg_replication_slots"
)


def shown_url(conninfo: str) -> str:
    """`conninfo` to print: a URL's password replaced by `***`."""
    try:
        parts = urllib.parse.urlsplit(conninfo)
    except ValueError:
        return conninfo
    if parts.password is None:
        return conninfo
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _connect(conninfo: str) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.OperationalError as e:
        text = one_line(str(e))
        hint = connect_hint(text)
        raise SourceError(
            f"cannot connect to {shown_url(conninfo)}: {text}{'; ' + hint if hint else ''}"
        ) from None


def list_slots(conninfo: str, out: TextIO) -> int:
    """One line per slot of the server: name, plugin, database, state and the WAL it holds."""
    with _connect(conninfo) as conn:
        rows = conn.execute(_SLOTS_SQL + " ORDER BY slot_name").fetchall()
    for name, plugin, kind, db, active, pid, restart, confirmed, held in rows:
        state = f"active (pid {pid})" if active else "inactive"
        what = f"{kind} {plugin}".strip() if kind == "logical" else str(kind)
        out.write(
            f"{name}\t{what}\tdatabase {db or '-'}\t{state}\trestart {restart or '-'}\t"
            f"confirmed {confirmed or '-'}\tholds {_size(held)}\n"
        )
    return len(rows)


def drop_slot(name: str, conninfo: str) -> None:
    """Drop an inactive slot; an active one (a reader is using it) or a missing one is a `SourceError`."""
    where = shown_url(conninfo)
    with _connect(conninfo) as conn:
        row = conn.execute(
            "SELECT active, active_pid FROM pg_replication_slots WHERE slot_name = %s", (name,)
        ).fetchone()
        if row is None:
            raise SourceError(f"there is no replication slot {name} on {where}")
        if row[0]:
            raise SourceError(
                f"replication slot {name} on {where} is active (used by server process {row[1]}); "
                "stop the reader using it first"
            )
        try:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
        except psycopg.Error as e:  # (it became active in between, or no privilege)
            raise SourceError(f"cannot drop replication slot {name} on {where}: {one_line(str(e))}") from None


def report_created(created: list[tuple[str, str, str]], out: TextIO) -> None:
    """For each `(node, slot, conninfo)` this run created: the slot, the WAL it holds, how to drop it."""
    for node, slot, conninfo in created:
        held = ""
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                row = conn.execute(
                    "SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
                ).fetchone()
            if row is None:
                continue  # (dropped already)
            held = f" holds WAL from {row[0]}"
        except psycopg.Error:
            held = " holds WAL"  # (the server is away: the slot is still there)
        out.write(
            f"csnd: slot {slot} on {node}{held}; drop it with "
            f"csnd slot drop {slot} {shlex.quote(shown_url(conninfo))} when done\n"
        )


def _size(n: object) -> str:
    if not isinstance(n, int):
        return "-"
    if n < 1024:
        return f"{n} bytes"
    x, unit = n / 1024, "kB"
    for bigger in ("MB", "GB"):
        if x < 1024:
            break
        x, unit = x / 1024, bigger
    return f"{x:.1f} {unit}"
