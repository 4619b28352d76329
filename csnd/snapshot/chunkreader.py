"""One table's chunks of an incremental snapshot, read from its node, and their watermarks.

`ChunkReader` holds a table's connection to its node: each chunk is read in
one REPEATABLE READ transaction (its upper key, its rows by COPY, its
snapshot, the table's columns), rendered as the decoder renders an insert,
and its high watermark is committed with its xid armed in the window first
(`csnd.snapshot.watermark` says why that order is what makes the rule hold).
`table_info` checks that a table can be snapshotted this way at all.
`csnd.snapshot.incremental` runs the jobs that use them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Final

import psycopg

from csnd.core.errors import SnapshotError
from csnd.reader.reconnect import one_line
from csnd.snapshot.closing import close_cancelling
from csnd.snapshot.copyrows import BinaryCopyRows, CopyFormatError, TextCopyRows
from csnd.snapshot.jobstore import NodeAccess
from csnd.snapshot.lines import read_body
from csnd.snapshot.plan import Chunk, TableInfo, chunk_copy_sql, next_bound_sql
from csnd.snapshot.watermark import PREFIX, UNPLACED_LSN, ReadSnapshot, Window, Windows
from csnd.snapshot.watermark import Chunk as WindowChunk

if TYPE_CHECKING:
    from csnd.gtm.pggtm import PgGtm

log = logging.getLogger("csnd.snapshot")

# How often a job waiting for its watermark to come through the pipeline says so.
WAIT_NOTE_S: Final = 30.0
# A chunk's rendered rows are held in memory and appended as one record: chunks of wide rows
# hold fewer rows, so that one stays about this size (the first chunk of a table learns the width).
CHUNK_BYTES: Final = 64 << 20
# How long a connection to a node may take to open.
CONNECT_TIMEOUT_S: Final = 10


class Stopped(Exception):
    """The service is stopping: the job ends here and resumes at the next start."""


def check_snapshottable(info: TableInfo, node: str) -> None:
    """ValueError unless the table's rows can be told apart in the stream by its primary key."""
    if not info.key:
        raise ValueError(
            f"table {info.label} on node {node} has no primary key (or its publication leaves a key column "
            "out): an incremental snapshot tells a chunk's rows from the stream's by it"
        )
    identity = {c.name for c in info.columns if c.identity}
    if info.replident not in ("d", "f") and not set(info.key) <= identity:
        raise ValueError(
            f"table {info.label} on node {node} has a replica identity that does not hold its primary key "
            f"({', '.join(info.key)}): a delete would not say which row it removed; use REPLICA IDENTITY "
            "DEFAULT or FULL"
        )


def table_info(access: NodeAccess, schema: str, table: str, *, must: bool) -> TableInfo | None:
    """The table as `access`'s publication has it (None if not in it and not `must`).

    ValueError for what cannot be snapshotted (GTM mode, no key, not published when `must`);
    SnapshotError when the node cannot be read.
    """
    from csnd.snapshot.copier import read_tables

    if access.mode != "single" and not access.gtm:
        raise ValueError(
            f"node {access.node} runs in {access.mode} mode: an incremental snapshot's watermark needs a CSN "
            "from the GTM; name the GTM's server with csnd serve --gtm URL"
        )
    try:
        with psycopg.connect(access.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            tables = read_tables(conn, access.publication, (schema, table))
    except psycopg.Error as e:
        raise SnapshotError(
            f"cannot list the tables of publication {access.publication}: {one_line(str(e))}",
            node=access.node,
        ) from None
    info = tables[0] if tables else None  # (read_tables kept only this table)
    if info is None:
        if must:
            raise ValueError(
                f"table {schema}.{table} is not in publication {access.publication} of node {access.node}"
            )
        return None
    check_snapshottable(info, access.node)
    return info


class ChunkReader:
    """One table's connection to its node: chunks read in REPEATABLE READ, watermarks emitted."""

    def __init__(self, access: NodeAccess, info: TableInfo, stop: threading.Event) -> None:
        self.access = access
        self.info = info
        self._stop = stop
        self._enums = access.enums() if access.binary else []
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._cache: Any = None
        self._row_bytes = 0.0  # rendered bytes a row, as the chunks so far had them (0: none yet)
        self._gtm: PgGtm | None = None  # GTM mode: the session the watermarks take their CSNs through

    def error(self, message: str) -> SnapshotError:
        return SnapshotError(message, node=self.access.node, table=self.info.label)

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.access.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
            )
        return self._conn

    def close(self) -> None:
        """Close the connection (from any thread: a query in progress is cancelled first)."""
        conn, self._conn = self._conn, None
        gtm, self._gtm = self._gtm, None
        if gtm is not None:
            with contextlib.suppress(Exception):
                gtm.close()
        if conn is not None:
            close_cancelling(conn)

    def chunk_rows(self, asked: int) -> int:
        """`asked`, fewer when rows are wide: a chunk's rendered rows are one record, held in memory."""
        if self._row_bytes <= 0:
            return asked
        return max(1, min(asked, int(CHUNK_BYTES / self._row_bytes)))

    def wait_visible(self, job: str) -> None:
        """Until no transaction committed before now is still invisible (see `csnd.snapshot.watermark`).

        Such a transaction's commit may have been handed to the sink before the table was
        tracked: a commit waiting for a synchronous standby (flushed, so sent to logical
        decoding; its backend still holding its xid).  Once it is visible, every later chunk's
        snapshot reflects it.
        """
        conn = self._connection()
        waiting = [int(str(xid)) for (xid,) in conn.execute(_SYNC_REP_XIDS_SQL).fetchall()]
        note = time.monotonic() + WAIT_NOTE_S
        while waiting:
            if self._stop.wait(0.05):
                raise Stopped
            now = ReadSnapshot.parse(str(_one(conn, "SELECT pg_current_snapshot()::text")))
            waiting = [x for x in waiting if not now.sees(x)]
            if waiting and time.monotonic() >= note:
                note += WAIT_NOTE_S
                log.warning(
                    "incremental snapshot %s: node %s: transactions %s have committed but are not visible yet "
                    "(waiting for a synchronous standby?); the snapshot waits for them",
                    job,
                    self.access.node,
                    ", ".join(map(str, waiting[:5])),
                )

    def _relation_cache(self) -> Any:
        from csnd.decoder.rows import RelationCache

        if self._cache is None:
            cache = RelationCache(binary=self.access.binary)
            for oid, array in self._enums:
                cache.declare_enum(oid, array)
            for msg in self.info.relation_messages():
                cache.apply(msg, 0)
            self._cache = cache
        return self._cache

    def read_chunk(
        self, after: list[str] | None, chunk_rows: int, number: int
    ) -> tuple[tuple[str, ...] | None, list[str], ReadSnapshot]:
        """(the chunk's upper key or None if it is the last, its read bodies, its snapshot), in one
        REPEATABLE READ transaction -- the table's columns too, so a change of them is never mixed in."""
        from csnd.decoder.rows import row_change_body
        from csnd.snapshot.copier import read_tables

        conn = self._connection()
        lo = tuple(after) if after is not None else None
        binary = self.access.binary
        parser = BinaryCopyRows() if binary else TextCopyRows()
        bodies: list[str] = []
        size = 0
        try:
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                snapshot = ReadSnapshot.parse(str(_one(conn, "SELECT pg_current_snapshot()::text")))
                found = read_tables(conn, self.access.publication, (self.info.schema, self.info.name))
                if not found:
                    raise self.error(f"the table left publication {self.access.publication} (chunk {number})")
                if dataclasses.replace(found[0], estimated_rows=self.info.estimated_rows) != self.info:
                    # (its columns changed: render with what the chunk's rows have)
                    check_snapshottable(found[0], self.access.node)
                    self.info, self._cache = found[0], None
                cache = self._relation_cache()
                relid = self.info.relid
                row = conn.execute(next_bound_sql(self.info, lo, chunk_rows)).fetchone()
                hi = tuple(str(v) for v in row) if row is not None else None
                chunk = Chunk(self.info, number, 0, lo, hi)
                with conn.cursor() as cur, cur.copy(chunk_copy_sql(chunk, binary)) as copy:
                    for data in copy:
                        for r in parser.feed(data):
                            body = read_body(row_change_body("I", None, relid, r, 0, cache, binary))
                            bodies.append(body)
                            size += len(body)
                parser.finish()
        except psycopg.OperationalError:
            raise
        except psycopg.Error as e:
            raise self.error(f"cannot read chunk {number}: {one_line(str(e))}") from None
        except CopyFormatError as e:
            raise self.error(f"chunk {number}: {e}") from None
        except ValueError as e:  # (check_snapshottable: the table no longer has what a snapshot needs)
            raise self.error(str(e)) from None
        if bodies:
            self._row_bytes = size / len(bodies)
        assert all(b.startswith(UNPLACED_LSN) for b in bodies)
        return hi, bodies, snapshot

    def emit_watermark(
        self,
        windows: Windows,
        window: Window,
        chunk: WindowChunk,
        snapshot: ReadSnapshot,
        job: str,
        number: int,
    ) -> None:
        """The high watermark: its xid armed in the window before it commits, so the sink cannot miss it."""
        conn = self._connection()
        content = json.dumps({"job": job, "chunk": number})
        if self.access.mode == "gtm":
            self._emit_global(
                conn, windows, window, chunk, snapshot, content, f"csnd-snapshot-{job}-{number}"
            )
            return
        try:
            with conn.transaction():
                # (its commit need not wait for a synchronous standby: only this node's decoding reads it)
                conn.execute("SET LOCAL synchronous_commit = local")
                xid = int(str(_one(conn, "SELECT txid_current()")))
                windows.arm(window, xid, chunk, snapshot)
                conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (PREFIX, content))
        except psycopg.OperationalError:
            raise
        except psycopg.Error as e:
            raise self.error(f"cannot write the watermark of chunk {number}: {one_line(str(e))}") from None

    def _emit_global(
        self,
        conn: psycopg.Connection[tuple[Any, ...]],
        windows: Windows,
        window: Window,
        chunk: WindowChunk,
        snapshot: ReadSnapshot,
        content: str,
        name: str,
    ) -> None:
        """GTM mode: the watermark commits as a global transaction of this one node, at a CSN of the GTM.

        Its CSN is taken after the chunk's snapshot, so it is above every
        transaction the chunk sees (they took theirs before they committed),
        which is what the watermark rule asks of it (`csnd.snapshot.watermark`).
        """
        from csnd.core.errors import GlobalCommitError
        from csnd.gtm.writer import GlobalTransaction

        node = self.access.node
        # (a gid of its own each try: one that failed may still be in the GTM's commit log)
        t = GlobalTransaction(self._gtm_session(), {node: conn}, gid=f"{name}-{uuid.uuid4().hex[:8]}")
        try:
            xid = int(str(t.execute(node, "SELECT txid_current()").fetchone()[0]))  # type: ignore[index]
            windows.arm(window, xid, chunk, snapshot)
            t.execute(node, "SELECT pg_logical_emit_message(true, %s, %s)", (PREFIX, content))
            t.commit()
        except psycopg.OperationalError:
            raise
        except (psycopg.Error, GlobalCommitError) as e:
            if t.state == "active":
                with contextlib.suppress(Exception):
                    t.rollback()
            raise self.error(
                f"cannot commit the watermark of {name} through the GTM: {one_line(str(e))}"
            ) from None

    def _gtm_session(self) -> PgGtm:
        if self._gtm is None:
            from csnd.gtm.pggtm import PgGtm

            assert self.access.gtm is not None
            self._gtm = PgGtm(self.access.gtm, connect_timeout=CONNECT_TIMEOUT_S)
        return self._gtm


# Backends whose commit is flushed (so decoded and maybe appended) but not yet visible: waiting for a
# synchronous standby.  (pg_xact_status cannot tell them: it says "in progress" while the xid is held.)
_SYNC_REP_XIDS_SQL: Final = (
    "SELECT backend_xid::text FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND wait_event = 'SyncRep'"
)


def _one(conn: psycopg.Connection[tuple[Any, ...]], query: str, params: tuple[Any, ...] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row is not None else None
