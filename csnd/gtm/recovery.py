"""In-doubt recovery: finish the global transactions of writers that died mid-commit.

A writer killed inside `GlobalTransaction.commit` leaves, depending on the
step, a `committing` marker with no `commit` or `abort` after it, or prepared
transactions `<gid>@<node>`; either blocks that node's stream in csnd's
sender for good (a committing transaction holds back every larger CSN).
GaussDB's GTM resolves them from its own record of each transaction; so does
this, from the shared GTM's commit log (`PgGtm`, table `<name>_txn`):

    record found, owner dead
      ├─ decided (csn set)    COMMIT PREPARED '<gid>@<node>' wherever still prepared
      │                       (the decision was written after every node prepared,
      │                        so a node where it is not prepared has committed)
      └─ not decided          ROLLBACK PREPARED wherever prepared; then `abort <gid>`
                              on every node whose WAL holds `committing <gid>` and no
                              `abort <gid>` yet; flushed, so the stream moves at once
    record found, owner alive  left alone: an in-flight commit (reported)
    prepared '<gid>@<node>'    left alone and reported: not ours, or its record was
      with no record            deleted by hand (our writers record before preparing)

Why a record on the GTM and not the prepared transactions alone.  Whether
to commit cannot be read from the nodes: once one node has committed,
"prepared everywhere" no longer holds, and only a decision written before the
first COMMIT PREPARED says the others must commit.  And *where* `committing`
was logged cannot be guessed: the sender rejects an `abort` for a
transaction it never saw committing (and a second one), so `abort` must go to
exactly the nodes that logged `committing` -- a prefix of the participants if
the writer died between two of them.  That is read from each server's WAL
with pg_walinspect (PostgreSQL 15 shows a logical message's payload), from
the WAL position the writer recorded before its first marker there, so the
scan is short.  Recording progress per node on the GTM instead would cost a
round trip per node per transaction; the scan costs only at recovery.

Owners: a record names its writer's GTM session (backend pid and start
time); while that session is alive the transaction may be mid-commit, and
touching it would break it.  A killed writer's session ends within
milliseconds (its socket closes); `settle` waits that long for owners to go.
Each record is resolved under a row lock (SELECT ... FOR UPDATE SKIP LOCKED)
held until its deletion commits, so two recoveries (two writers starting at
once) never resolve one transaction twice.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from csnd.core import markers
from csnd.core.errors import CsndError
from csnd.core.ids import lsn_from_str, lsn_to_str
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.writer import emit_flushed

Connection = psycopg.Connection[Any]

_OWNER_ALIVE = (
    "EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = t.owner_pid AND a.backend_start = t.owner_start)"
)
_MARKERS_OF = (
    "SELECT description FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) "
    "WHERE resource_manager = 'LogicalMessage' AND description LIKE %s"
)


@dataclass
class RecoveryReport:
    committed: list[str] = field(default_factory=list)  # committed by recovery on some node
    aborted: list[str] = field(default_factory=list)  # rolled back / abort logged by recovery
    finished: list[str] = field(default_factory=list)  # records of txns already finished everywhere
    in_flight: list[str] = field(default_factory=list)  # owner alive: left alone
    unknown_prepared: list[str] = field(default_factory=list)  # '<gid>@<node>' with no record
    aborts_logged: dict[str, list[str]] = field(default_factory=dict)  # gid -> nodes
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.committed)} committed, {len(self.aborted)} aborted, {len(self.finished)} already "
            f"finished, {len(self.in_flight)} in flight (live writer), {len(self.unknown_prepared)} unknown "
            f"prepared, {len(self.errors)} errors"
        )


def recover_in_doubt(nodes: Mapping[str, Connection], gtm: PgGtm, *, settle: float = 2.0) -> RecoveryReport:
    """Resolve every in-doubt global transaction of dead writers; see the module docstring.

    `nodes`: every node name a writer may have used -> an autocommit
    connection to it.  A record naming a node not given is reported in
    `errors` and kept.
    """
    report = RecoveryReport()
    for name, conn in nodes.items():
        if not conn.autocommit:
            raise ValueError(f"node {name}: the connection must be in autocommit mode")
    # Prepared transactions first, records second: a prepared transaction
    # seen here had its record written before it prepared, so it is either
    # among the records read next or finished by then.
    prepared_before = {name: _prepared(conn, name) for name, conn in nodes.items()}
    with psycopg.connect(gtm.conninfo, autocommit=True) as g:
        g.execute("SET synchronous_commit = on")
        table = sql.Identifier(gtm.table)
        deadline = time.monotonic() + settle
        while True:
            rows = g.execute(
                sql.SQL("SELECT gid, " + _OWNER_ALIVE + " FROM {} t ORDER BY created").format(table)
            ).fetchall()
            alive = [gid for gid, live in rows if live]
            if not alive or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        recorded = {gid for gid, _ in rows}
        report.in_flight = alive
        for gid, live in rows:
            if not live:
                _resolve(g, table, gid, nodes, report)
    for name, conn in nodes.items():
        still = _prepared(conn, name)
        for local in sorted(prepared_before[name] & still):
            gid = local.rsplit("@", 1)[0]
            if gid not in recorded:
                report.unknown_prepared.append(local)
    return report


def _resolve(
    g: Connection, table: sql.Identifier, gid: str, nodes: Mapping[str, Connection], report: RecoveryReport
) -> None:
    with contextlib.suppress(_Keep):  # (the record stays: the next recovery tries again)
        _resolve_locked(g, table, gid, nodes, report)


def _resolve_locked(
    g: Connection, table: sql.Identifier, gid: str, nodes: Mapping[str, Connection], report: RecoveryReport
) -> None:
    with g.transaction():
        row = g.execute(
            sql.SQL(
                "SELECT nodes, start_lsns::text[], csn FROM {} t WHERE gid = %s AND NOT "
                + _OWNER_ALIVE
                + " FOR UPDATE OF t SKIP LOCKED"
            ).format(table),
            (gid,),
        ).fetchone()
        if row is None:
            return  # finished by its writer meanwhile, or another recovery has it
        names, lsns, csn = row
        missing = [n for n in names if n not in nodes]
        if missing:
            report.errors.append(
                f"global transaction {gid} touched node(s) {', '.join(missing)}, which were not given; "
                "run csnd gtm recover with every node of the cluster"
            )
            return
        try:
            if csn is not None:
                done = [n for n in names if _finish_prepared(nodes[n], f"{gid}@{n}", "COMMIT")]
                (report.committed if done else report.finished).append(gid)
            else:
                rolled = [n for n in names if _finish_prepared(nodes[n], f"{gid}@{n}", "ROLLBACK")]
                logged = []
                for group in _by_server(names, nodes):
                    start = min(lsn_from_str(lsns[names.index(n)]) for n in group)
                    committing, aborted = _marker_counts(nodes[group[0]], group[0], gid, start)
                    # Markers go to the participants in their recorded order, so on
                    # each server the nodes with `committing` are the first ones of
                    # the group, and those with `abort` a prefix of those.
                    for n in group[aborted:committing]:
                        emit_flushed(nodes[n], markers.abort(gid))
                        logged.append(n)
                if logged:
                    report.aborts_logged[gid] = logged
                (report.aborted if rolled or logged else report.finished).append(gid)
        except (psycopg.Error, CsndError) as e:
            report.errors.append(
                f"global transaction {gid}: {str(e).strip().splitlines()[0]}; the record is kept"
            )
            raise _Keep() from e
        g.execute(sql.SQL("DELETE FROM {} WHERE gid = %s").format(table), (gid,))


class _Keep(Exception):
    """Roll back the record's lock and keep it."""


def _prepared(conn: Connection, node: str) -> set[str]:
    """This node's prepared transactions named '<gid>@<node>' (the names are server-wide)."""
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE %s",
        ("%@" + node.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_"),),
    ).fetchall()
    return {r[0] for r in rows}


def _finish_prepared(conn: Connection, local_gid: str, how: str) -> bool:
    """COMMIT or ROLLBACK PREPARED if it is still prepared; whether it was."""
    try:
        conn.execute(sql.SQL(how + " PREPARED {}").format(sql.Literal(local_gid)))
    except psycopg.errors.UndefinedObject:
        return False
    return True


def _by_server(names: list[str], nodes: Mapping[str, Connection]) -> list[list[str]]:
    """The participants grouped by the server (the WAL) they live on, each group in `names` order.

    Nodes may be databases of one server, and pg_walinspect shows a
    server's whole WAL without the database of a logical message: markers
    can be told apart only by counting them per server.  A server is its
    system identifier and postmaster start time (a clone shares the former).
    """
    groups: dict[Any, list[str]] = {}
    for n in names:
        row = (
            nodes[n]
            .execute("SELECT system_identifier, pg_postmaster_start_time() FROM pg_control_system()")
            .fetchone()
        )
        groups.setdefault(row, []).append(n)
    return list(groups.values())


def _marker_counts(conn: Connection, node: str, gid: str, start: int) -> tuple[int, int]:
    """How many `committing <gid> ...` and `abort <gid>` this server's WAL holds from `start`."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    # The dead writer's markers may still be unflushed, and pg_walinspect
    # reads only flushed WAL: a commit with an xid flushes up to itself.
    conn.execute("BEGIN; SET LOCAL synchronous_commit = on; SELECT pg_current_xact_id(); COMMIT")
    row = conn.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
    assert row is not None
    end = row[0]
    pattern = f'non-transactional, prefix "{markers.PREFIX}"; payload (% bytes): %{_hex(" " + gid)}%'
    committing = aborted = 0
    try:
        rows = conn.execute(_MARKERS_OF, (lsn_to_str(start), end, pattern)).fetchall()
    except psycopg.Error as e:
        raise CsndError(
            f"cannot read the wal from {lsn_to_str(start)} to {end} to find the markers of global "
            f"transaction {gid} ({str(e).strip().splitlines()[0]}); is the wal still there?",
            node=node,
        ) from e
    for (desc,) in rows:
        payload = bytes.fromhex(desc.split("): ", 1)[1].replace(" ", ""))
        try:
            m = markers.parse_marker(payload)
        except ValueError:
            continue
        if m.gid == gid:
            committing += m.kind == "committing"
            aborted += m.kind == "abort"
    return committing, aborted


def _hex(text: str) -> str:
    """The text as pg_walinspect prints a payload: uppercase hex bytes separated by spaces."""
    return " ".join(f"{b:02X}" for b in text.encode("ascii"))
