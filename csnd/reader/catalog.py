"""What a live source asks its server over an ordinary connection, beside the replication one.

Three questions a replication connection cannot answer well: the enum types
(binary pgoutput sends an enum as its label without saying it is one), where
a slot resumes (to continue a recording without a gap), and moving a slot
after the stream has ended (`--until-lsn`, when what is durable is known
only once the last status update is gone).  Each failure is a `SourceError`
naming the node and the slot.
"""

from __future__ import annotations

import time

import psycopg

from csnd.core.errors import SourceError
from csnd.core.ids import Lsn, lsn_from_str, lsn_to_str
from csnd.reader.reconnect import one_line
from csnd.reader.replconn import connect_error


def enum_types(node: str, conninfo: str) -> list[tuple[int, int]]:
    """(type OID, array type OID) of every enum in the source database."""
    # The first connection of a run: any failure is reported at once.
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT oid::int8, typarray::int8 FROM pg_type WHERE typtype = 'e' ORDER BY oid"
            ).fetchall()
    except psycopg.OperationalError as e:
        raise connect_error(node, e) from None
    except psycopg.Error as e:
        raise SourceError(f"cannot list enum types: {one_line(str(e))}", node=node) from None
    return [(int(a), int(b)) for a, b in rows]


def slot_position(node: str, conninfo: str, slot: str) -> Lsn:
    """Where `slot` resumes (its confirmed_flush_lsn); a missing slot is an error, not a new start."""
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
    except psycopg.OperationalError as e:
        raise connect_error(node, e) from None
    except psycopg.Error as e:
        raise SourceError(f"cannot read slot {slot}: {one_line(str(e))}", node=node) from None
    if row is None:
        raise SourceError(
            f"replication slot {slot} does not exist: a new slot starts at the server's current "
            "position, so an existing recording cannot be continued without a gap; record to a new file",
            node=node,
        )
    return lsn_from_str(str(row[0])) if row[0] is not None else Lsn(0)


def advance_slot(node: str, conninfo: str, slot: str, lsn: Lsn, timeout_s: float) -> None:
    """Move `slot` forward to `lsn`, waiting up to `timeout_s` for a walsender to let go of it.

    Only forward: a slot made by this run (`--create-slot`) starts at the
    server's position then, which may be past the run's end (`--until-lsn`);
    confirming that end leaves the slot where it is, where PostgreSQL would
    refuse to move it back ("cannot advance replication slot to ..., minimum is ...").
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT confirmed_flush_lsn < %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                    (lsn_to_str(lsn), slot),
                ).fetchone()
                if row is None:
                    raise SourceError(
                        f"cannot confirm {lsn_to_str(lsn)} to slot {slot}: the slot no longer exists",
                        node=node,
                        lsn=lsn,
                    )
                if row[0]:
                    conn.execute(
                        "SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, lsn_to_str(lsn))
                    )
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() >= deadline:
                raise SourceError(
                    f"slot {slot} is still in use after the stream ended; could not confirm {lsn_to_str(lsn)} to it",
                    node=node,
                    lsn=lsn,
                ) from None
            time.sleep(0.1)
        except psycopg.Error as e:
            raise SourceError(
                f"cannot confirm {lsn_to_str(lsn)} to slot {slot}: {str(e).strip()}", node=node, lsn=lsn
            ) from None
