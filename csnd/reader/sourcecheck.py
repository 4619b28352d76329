"""Before a live source's first START_REPLICATION: check the source, and make its slot if asked.

The server reports a missing publication only when the first change is
decoded, a slot of another output plugin as an unknown option, a wrong
wal_level as a bare refusal; asking first gives each mistake its own line
saying what to do.  A slot made here (`--create-slot`, or for an initial
snapshot) is made on the replication connection itself, which returns once
the slot is at its consistent point: everything committed afterwards will
be streamed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn

import psycopg
from psycopg import pq

from csnd.core.errors import ConnectionLost, SourceError
from csnd.core.ids import Lsn, lsn_from_str
from csnd.reader.feedback import now_pg_us
from csnd.reader.reconnect import invalidated_how, slot_lost_error
from csnd.reader.replconn import ReplicationConnection, quote_ident, quote_literal
from csnd.reader.slotmaking import STANDBY_HINT, create_slot_command, failover_refusal, standby_waiting_notice
from csnd.reader.slotwait import (
    OpenTransactions,
    gave_up_text,
    listing_failure,
    open_transactions,
    waiting_line,
)

if TYPE_CHECKING:
    from csnd.reader.live import LiveOptions

log = logging.getLogger("csnd.reader.live")

# A new slot that has not reached its consistent point after this long is
# waiting for long transactions on the server: say so, naming them
# (reader.slotwait), and again every SLOT_CREATE_REPEAT_S while it waits.
# Sooner: noise on a server with a busy moment; later: an operator left
# guessing.  The wait has no limit unless slot_wait_timeout_s sets one (the
# server has none).
SLOT_CREATE_NOTICE_S: Final = 5.0
SLOT_CREATE_REPEAT_S: Final = 30.0
# After a cancelled creation, how long the slot in the making may take to
# disappear: the server drops it after it has sent the cancel's error.
SLOT_GONE_WAIT_S: Final = 10.0
SLOT_GONE_POLL_S: Final = 0.05
STANDBY_WAIT: Final = f"on a standby it waits for the primary's next running-xacts record: {STANDBY_HINT}"


@dataclass(frozen=True)
class ExportedSnapshot:
    """The snapshot a new slot exported at its consistent point (`LiveSource.prepare`).

    Valid while the replication connection that made the slot stays open and
    idle: other connections import it (`SET TRANSACTION SNAPSHOT 'name'` as the
    first statement of a REPEATABLE READ transaction), then `release()`
    closes that connection; their transactions keep the snapshot.
    """

    node: str
    slot: str
    name: str  # what SET TRANSACTION SNAPSHOT takes
    consistent_lsn: Lsn  # the slot's consistent point: streamed commits start at or after it
    made_at: int  # when, in microseconds since 2000-01-01 UTC
    release: Callable[[], None]


@dataclass(frozen=True)
class CreatedSlot:
    node: str
    slot: str
    conninfo: str


# The slots this process created (`--create-slot`): the command line says at
# the end of a run which of them hold WAL and how to drop them.
CREATED_SLOTS: list[CreatedSlot] = []


class SourceCheck:
    """The checks of one source, and the making of its slot, over its replication connection."""

    def __init__(self, node: str, options: LiveOptions, link: ReplicationConnection) -> None:
        self.node = node
        self.options = options
        self.link = link

    def run(self, pgconn: pq.abc.PGconn, snapshot: str = "never") -> ExportedSnapshot | None:
        """wal_level, the slot and the publication, each with what to do; the slot made if asked."""
        o = self.options
        res = self.link.exec(
            pgconn,
            "SELECT current_setting('wal_level'), current_database(), s.plugin, s.database, "
            f"EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {quote_literal(o.publication)}), "
            # (invalidation_reason came with PostgreSQL 17: read through to_jsonb, NULL before)
            "s.wal_status, to_jsonb(s) ->> 'invalidation_reason', s.confirmed_flush_lsn "
            "FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots AS s "
            f"ON s.slot_name = {quote_literal(o.slot)}",
        )
        wal_level, db, plugin, slot_db, has_pub, wal_status, invalidated, confirmed = (
            (v or b"").decode() for v in (res.get_value(0, i) for i in range(8))
        )
        if wal_level != "logical":
            raise SourceError(
                f"wal_level is {wal_level}, logical decoding needs logical: set wal_level = logical "
                "in postgresql.conf and restart the server",
                node=self.node,
            )
        exported: ExportedSnapshot | None = None
        if plugin and snapshot == "initial":
            raise SourceError(
                f"replication slot {o.slot} exists already, but an initial snapshot (snapshot=initial) needs "
                "the slot made now, with the snapshot of its consistent point: drop it "
                f"(csnd slot drop {o.slot} URL) and start again with an empty changelog directory, or use "
                "snapshot=never (stream from the slot) or snapshot=when_needed",
                node=self.node,
            )
        if not plugin:
            export = snapshot in ("initial", "when_needed")
            if not o.create_slot and not export:
                raise SourceError(
                    f"replication slot {o.slot} does not exist; pass --create-slot to create it",
                    node=self.node,
                )
            if has_pub != "t":  # (before the slot is made: a snapshot needs the publication's tables)
                raise self._no_publication(db)
            exported = self._create_slot(pgconn, export=export)
            CREATED_SLOTS.append(CreatedSlot(self.node, o.slot, o.conninfo))
            log.info("node %s: created slot %s", self.node, o.slot)
        elif plugin != "pgoutput":
            raise SourceError(
                f"replication slot {o.slot} uses the output plugin {plugin}, csnd reads pgoutput: "
                "name a pgoutput slot (or a new one with --create-slot)",
                node=self.node,
            )
        elif invalidated or wal_status == "lost":
            # (START_REPLICATION would refuse it too, but says neither why nor from where)
            raise slot_lost_error(
                self.node,
                o.slot,
                invalidated_how(invalidated or None),
                "",
                lsn_from_str(confirmed) if confirmed else self.options.start_lsn,
            )
        elif slot_db != db:
            raise SourceError(
                f"replication slot {o.slot} belongs to database {slot_db}, not {db}: "
                "connect to that database or use another slot",
                node=self.node,
            )
        if has_pub != "t":
            raise self._no_publication(db)
        return exported

    def _no_publication(self, db: str) -> SourceError:
        o = self.options
        return SourceError(
            f"publication {o.publication} does not exist in database {db}: create it "
            f"(CREATE PUBLICATION {quote_ident(o.publication)} FOR ALL TABLES) "
            "or name the right one with --publication",
            node=self.node,
        )

    def _create_slot(self, pgconn: pq.abc.PGconn, export: bool = False) -> ExportedSnapshot | None:
        """CREATE_REPLICATION_SLOT, which returns once the slot is at its consistent point.

        That waits for the transactions running on the server to end, so the
        command is sent without blocking: `close()` and signals are noticed
        meanwhile, and either cancels it (the server then drops the slot
        being made; a closed socket alone would not stop its wait).  With
        `export`, the snapshot of the consistent point is exported and
        returned, the connection left open (see `LiveSource.prepare`).
        """
        slot = self.options.slot
        link = self.link
        # (a standby waits on the primary's running-xacts record: its progress line says so)
        in_recovery = (link.exec(pgconn, "SELECT pg_is_in_recovery()").get_value(0, 0) or b"") == b"t"
        if self.options.failover_slot:
            refusal = failover_refusal(slot, pgconn.server_version, in_recovery)
            if refusal:
                raise SourceError(refusal, node=self.node)
        sql = create_slot_command(quote_ident(slot), export, self.options.failover_slot)
        pgconn.send_query(sql.encode())
        began = time.monotonic()
        notice_at = began + SLOT_CREATE_NOTICE_S
        limit = self.options.slot_wait_timeout_s
        try:
            while pgconn.is_busy():
                if link.wait(pgconn, read=True):
                    link.consume(pgconn, self.options.start_lsn)
                    continue
                now = time.monotonic()
                if limit is not None and now - began >= limit:
                    self._give_up(pgconn, limit, in_recovery)
                if now >= notice_at:
                    notice_at = now + SLOT_CREATE_REPEAT_S
                    self._say_waiting(now - began, in_recovery)
        except BaseException:
            with contextlib.suppress(Exception):
                pgconn.get_cancel().cancel()
            raise
        res = pgconn.get_result()
        while pgconn.get_result() is not None:
            pass
        if res is None:
            raise ConnectionLost(f"CREATE_REPLICATION_SLOT {slot} returned no result", node=self.node)
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise link.result_error(res, ["CREATE_REPLICATION_SLOT", quote_ident(slot)])
        if not export:
            return None
        # (slot_name, consistent_point, snapshot_name, output_plugin)
        point, name = ((res.get_value(0, i) or b"").decode() for i in (1, 2))
        if not name:
            raise SourceError(f"CREATE_REPLICATION_SLOT {slot} exported no snapshot", node=self.node)
        return ExportedSnapshot(self.node, slot, name, lsn_from_str(point), now_pg_us(), link.drop)

    def _open_transactions(self, in_recovery: bool) -> OpenTransactions | str:
        """What the slot waits for, asked on an ordinary connection (a str: why it could not be)."""
        if in_recovery:  # (a standby's own sessions hold no xids: the primary's running-xacts record rules)
            return STANDBY_WAIT
        try:
            return open_transactions(self.options.conninfo)
        except psycopg.Error as e:
            return f"they could not be listed: {listing_failure(e)}"

    def _say_waiting(self, waited_s: float, in_recovery: bool) -> None:
        slot = self.options.slot
        if in_recovery:
            log.warning(standby_waiting_notice(), self.node, slot, waited_s)
            return
        log.warning("%s", waiting_line(self.node, slot, waited_s, self._open_transactions(in_recovery)))

    def _give_up(self, pgconn: pq.abc.PGconn, limit: float, in_recovery: bool) -> NoReturn:
        """Past slot_wait_timeout: cancel the creation, see the slot in the making gone, say what held it."""
        slot = self.options.slot
        open_now = self._open_transactions(in_recovery)
        pgconn.get_cancel().cancel()
        deadline = time.monotonic() + SLOT_GONE_WAIT_S
        while pgconn.is_busy() and time.monotonic() < deadline:
            if self.link.wait(pgconn, read=True):
                self.link.consume(pgconn, self.options.start_lsn)
        while not pgconn.is_busy() and pgconn.get_result() is not None:  # (the cancel's error, expected)
            pass
        left = not self._slot_gone(deadline)
        raise SourceError(gave_up_text(slot, limit, open_now, left), node=self.node)

    def _slot_gone(self, deadline: float) -> bool:
        """Whether the cancelled slot is gone from pg_replication_slots by `deadline` (asked anew each poll)."""
        try:
            with psycopg.connect(self.options.conninfo, autocommit=True, connect_timeout=10) as conn:
                while True:
                    row = conn.execute(
                        "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (self.options.slot,)
                    ).fetchone()
                    if row is None:
                        return True
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(SLOT_GONE_POLL_S)
        except psycopg.Error:
            return False
