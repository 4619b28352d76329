"""How a new slot is asked for, and what its wait is called: on a primary or a standby, failover or not.

    CREATE_REPLICATION_SLOT "csnd" LOGICAL pgoutput NOEXPORT_SNAPSHOT            (a plain slot)
    CREATE_REPLICATION_SLOT "csnd" LOGICAL pgoutput (SNAPSHOT 'nothing', FAILOVER)  (--failover-slot)

A failover slot (PostgreSQL 17+) is copied to standbys that run
`sync_replication_slots = on`, so after a promotion the new primary has it
at a position no further than what its standby had received, and csnd
continues from it (docs/failover.md).  Only a primary can make one.

A slot made on a hot standby waits for its consistent point like one on a
primary, but the standby learns of the transactions running on the primary
only from the primary's next running-xacts record, which an idle primary
writes rarely: the progress line says how to hurry it.
"""

from __future__ import annotations

from typing import Final

# CREATE_REPLICATION_SLOT's FAILOVER option and slot synchronisation came with PostgreSQL 17.
FAILOVER_SINCE: Final = 170000


def create_slot_command(quoted_slot: str, export: bool, failover: bool) -> str:
    """The replication command that makes a pgoutput slot (its name quoted already)."""
    if failover:
        snapshot = "'export'" if export else "'nothing'"
        return f"CREATE_REPLICATION_SLOT {quoted_slot} LOGICAL pgoutput (SNAPSHOT {snapshot}, FAILOVER)"
    how = "(SNAPSHOT 'export')" if export else "NOEXPORT_SNAPSHOT"
    return f"CREATE_REPLICATION_SLOT {quoted_slot} LOGICAL pgoutput {how}"


def failover_refusal(slot: str, server_version: int, in_recovery: bool) -> str | None:
    """Why this server cannot make `slot` a failover slot (None: it can)."""
    if server_version < FAILOVER_SINCE:
        major = server_version // 10000
        return (
            f"cannot create replication slot {slot} as a failover slot: the server runs PostgreSQL {major}, "
            "failover slots need 17 or later; drop --failover-slot (failover=true) or upgrade the server"
        )
    if in_recovery:
        return (
            f"cannot create replication slot {slot} as a failover slot on a standby: make it on the primary "
            "(its standbys with sync_replication_slots = on copy it), or drop --failover-slot to decode "
            "on this standby from a slot of its own"
        )
    return None


# What hurries a slot on a standby to its consistent point.
STANDBY_HINT: Final = "hurry it with SELECT pg_log_standby_snapshot() on the primary"


def standby_waiting_notice() -> str:
    """The progress line of a slot on a standby short of its consistent point (%s node, %s slot, %.0f waited).

    (On a primary the line names the transactions it waits for: reader.slotwait.)
    """
    return (
        "node %s: slot %s waits on this standby for the primary's next running-xacts record "
        f"(its consistent point; waited %.0f s); {STANDBY_HINT}"
    )
