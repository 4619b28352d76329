"""Reading an exported snapshot: connections that import it, the catalog, the chunks, in parallel.

    LiveSource.prepare(snapshot=...) ── ExportedSnapshot (the slot's replication connection, held open)
            │
            ▼  NodeSnapshot.open(): 1 planner connection here and READERS copiers (connections in
            │  this process, or copier processes: csnd.snapshot.copyproc), each BEGIN ISOLATION
            │  LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '...' on a connection of its own
            ▼  then ExportedSnapshot.release(): the transactions keep the snapshot
    planner: pg_publication_tables ─► TableInfo ─► chunk bounds ─► chunk queue ─┐
    copier thread i ─ chunk ─► copier i: binary COPY ─► copyrows ─► render ─► its text ─►│
                                                      done queue (bounded) ◄─ ChunkResult ◄─────┘
                                                      └► SnapshotRun appends each chunk (csnd.snapshot.run)

Every connection sees the database exactly as of the slot's consistent
point: what committed before it is in the snapshot, what commits after it is
streamed by the slot.  The planner plans one table at a time and hands its
chunks on at once, so copying starts with the first table.  The copiers
render rows with the stream's own decoder (`csnd.snapshot.render`), so a
read's values are a streamed insert's.  By default they are the copier
threads themselves (`copiers = "threads"`): the COPY's read and the
rendering run in C with the GIL released, so the threads use both cores
with no pipe, no process start-up and no receive; `"processes"` runs each
in a process of its own (what a table with many columns rendered through
Python builders, which hold the GIL, may want).

Errors name the node, the table and the consistent point's LSN; a failed
query, a lost connection, or a copier process that dies, ends the snapshot
(`SnapshotError`), since a snapshot cannot be imported again once the
exporting connection is gone.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from psycopg import sql

from csnd.core.appname import named_conninfo
from csnd.core.errors import CsndError, SnapshotError
from csnd.reader.reconnect import one_line
from csnd.snapshot.closing import close_cancelling
from csnd.snapshot.copyproc import CopierProcess, LocalCopier
from csnd.snapshot.plan import (
    CHUNK_ROWS,
    CTID_SPLIT_SERVER,
    FIRST_NON_BUILTIN_OID,
    Chunk,
    ColumnInfo,
    TableInfo,
    TypeInfo,
    boundaries_sql,
    chunks_of,
    ctid_chunks,
    ctid_rows_estimate,
    split_bounds,
)

log = logging.getLogger("csnd.snapshot")

# Copier processes per node, each with its connection and a thread here that feeds it.  More
# read and render chunks in parallel (on the server and on this machine's cores), each is one more
# connection, process and chunk in memory.  bench/snapshot_bench.py (docs/performance.md): with
# the rendering in this process's threads any of 1, 3 or 6 copied 34,000-43,000 rows/s on 2
# shared cores; in processes, 3 keep 2 cores busy while one waits on its COPY.
READERS: Final = 3
# Where the copiers run: "threads" of this process (the COPY read and the rendering release the
# GIL), or "processes" of their own.  bench/snapshot_bench.py --copiers alternates the two
# (docs/performance.md): threads took 0.24-0.27 client CPU s for 200,000 rows, processes 0.36-0.42
# (the pipe, the start-up and the receive), and copied as fast or faster.
COPIERS: Final = "threads"


@dataclass(frozen=True)
class PageCut:
    """A table cut in heap-page ranges: its pages as it was cut, and its rows as its statistics tell (scaled to them)."""

    pages: int
    estimated_rows: int


@dataclass(frozen=True)
class SnapshotSettings:
    """The tunables of a snapshot (`[snapshot]` in the service's config file)."""

    chunk_rows: int = CHUNK_ROWS
    readers: int = READERS
    copiers: str = COPIERS  # "threads" (in this process) or "processes" (csnd.snapshot.copyproc)
    # "ctid" (where it applies: PostgreSQL 14 or later, not partitioned, with statistics; else by key):
    # ranges of heap pages of about chunk_rows rows each, no boundary pass (plan.ctid_chunks); "key":
    # ranges of the primary key, at most chunk_rows rows each, counted up front.  `python -m
    # bench.snapshot_bench 1000000 --rounds 2 --split ctid` on an idle machine: ctid at 0.77-0.99 of
    # one COPY's rate, key at 0.50-0.61 (its boundary pass and index range scans cost the server
    # more: 0.68-1.08 server CPU s per 1M rows against 0.60-0.73); an incremental snapshot
    # (csnd.snapshot.chunkreader) is cut by key whatever this says: its watermarks need key ranges.
    split: str = "ctid"

    def __post_init__(self) -> None:
        if self.copiers not in ("threads", "processes"):
            raise ValueError(f'snapshot copiers must be "threads" or "processes", not {self.copiers!r}')
        if self.split not in ("key", "ctid"):
            raise ValueError(f'snapshot split must be "key" or "ctid", not {self.split!r}')


@dataclass
class ChunkResult:
    """A chunk read and rendered: its change objects' text in UTF-8 (`csnd.snapshot.render`), its row count."""

    chunk: Chunk
    node: str
    changes: bytes
    rows: int


_TABLES_SQL: Final = """
SELECT c.oid::int8, pt.schemaname::text, pt.tablename::text, c.relreplident::text, c.relkind::text,
       greatest(c.reltuples, 0)::int8, pt.attnames::text[], pt.rowfilter
FROM pg_publication_tables AS pt
JOIN pg_namespace AS n ON n.nspname = pt.schemaname
JOIN pg_class AS c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = %s
ORDER BY pt.schemaname, pt.tablename
"""

_COLUMNS_SQL: Final = """
SELECT a.attname::text, a.atttypid::int8, a.atttypmod, format_type(a.atttypid, a.atttypmod),
       CASE c.relreplident
         WHEN 'f' THEN true
         WHEN 'd' THEN coalesce(a.attnum = ANY ((SELECT i.indkey FROM pg_index AS i
                                                WHERE i.indrelid = c.oid AND i.indisprimary)::int2[]), false)
         WHEN 'i' THEN coalesce(a.attnum = ANY ((SELECT i.indkey FROM pg_index AS i
                                                WHERE i.indrelid = c.oid AND i.indisreplident)::int2[]), false)
         ELSE false END
FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.attgenerated = '' OR a.attname = ANY (%s::text[]))
ORDER BY a.attnum
"""

# A table's statistics (pages, rows), its size in pages now and the page size, for ranges of pages
# (split = "ctid").
_PAGES_SQL: Final = """
SELECT c.relpages::int8, c.reltuples::float8, pg_relation_size(c.oid) / current_setting('block_size')::int8,
       current_setting('block_size')::int8
FROM pg_class AS c WHERE c.oid = %s
"""

_KEY_SQL: Final = """
SELECT a.attname::text
FROM pg_index AS i, unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos), pg_attribute AS a
WHERE i.indrelid = %s AND i.indisprimary AND a.attrelid = i.indrelid AND a.attnum = k.attnum
ORDER BY k.pos
"""

# pgoutput's Type message names the base type of a domain (getBaseType), with its namespace.
_BASE_TYPE_SQL: Final = """
WITH RECURSIVE chain(oid, base, depth) AS (
    SELECT t.oid, t.oid, 0 FROM pg_type AS t WHERE t.oid = %s
  UNION ALL
    SELECT chain.oid, t.typbasetype, chain.depth + 1
    FROM chain JOIN pg_type AS t ON t.oid = chain.base WHERE t.typtype = 'd'
)
SELECT n.nspname::text, t.typname::text
FROM chain JOIN pg_type AS t ON t.oid = chain.base JOIN pg_namespace AS n ON n.oid = t.typnamespace
ORDER BY chain.depth DESC LIMIT 1
"""


class NodeSnapshot:
    """One node's snapshot: its importing connections, its plan and its copier threads."""

    def __init__(
        self,
        node: str,
        conninfo: str,
        publication: str,
        consistent_lsn: int,
        *,
        binary: bool,
        enums: list[tuple[int, int]],
        settings: SnapshotSettings | None = None,
    ) -> None:
        self.node = node
        self.conninfo = conninfo
        self.publication = publication
        self.consistent_lsn = consistent_lsn
        self.binary = binary
        self.enums = enums
        self.settings = settings or SnapshotSettings()
        self._conns: list[psycopg.Connection[tuple[Any, ...]]] = []  # the planner's
        self._copiers: list[CopierProcess | LocalCopier] = []
        self._chunks: queue.Queue[Chunk | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.tables: list[TableInfo] = []
        self.row_counts: dict[int, int] = {}  # relid: rows in the snapshot, counted as the table was cut
        # relid: a table cut in page ranges, as it was cut (progress's total and ETA: csnd.snapshot.progress)
        self.page_cuts: dict[int, PageCut] = {}
        # called (in a copier thread) as a chunk's COPY begins: progress counts the table's time from there
        self.on_chunk_start: Callable[[Chunk], None] | None = None

    def _error(self, message: str, table: str | None = None) -> SnapshotError:
        return SnapshotError(message, node=self.node, lsn=self.consistent_lsn, table=table)

    # --- while the export is alive ------------------------------------------------------

    def open(self, snapshot_name: str) -> None:
        """The planner's connection and the copier processes, each importing `snapshot_name`: call while
        the exporting connection is open and idle (it returns once every one has imported it)."""
        from csnd.decoder.pool import start_worker_server

        try:
            conn = psycopg.connect(named_conninfo(self.conninfo, self.node), autocommit=False)
            self._conns.append(conn)
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            conn.read_only = True
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        except psycopg.Error as e:
            self.close()
            raise self._error(
                f"cannot import the slot's exported snapshot {snapshot_name}: {one_line(str(e))}"
            ) from None
        try:
            if self.settings.copiers == "threads":
                for _ in range(max(1, self.settings.readers)):
                    self._copiers.append(
                        LocalCopier.start(
                            self.conninfo,
                            self.node,
                            snapshot_name,
                            self.consistent_lsn,
                            self.binary,
                            self.enums,
                        )
                    )
                return
            ctx = start_worker_server()
            for _ in range(max(1, self.settings.readers)):
                self._copiers.append(
                    CopierProcess.start(
                        ctx,
                        self.conninfo,
                        self.node,
                        snapshot_name,
                        self.consistent_lsn,
                        self.binary,
                        self.enums,
                    )
                )
            for copier in self._copiers:
                copier.ready()
        except BaseException:
            self.close()
            raise

    @property
    def copier_pids(self) -> list[int]:
        """The copier processes' ids (after `open`)."""
        return [c.pid for c in self._copiers]

    def close(self) -> None:
        self._stop.set()
        for conn in self._conns:
            close_cancelling(conn)  # (a planner blocked in a query ends now)
        self._conns = []
        copiers, self._copiers = self._copiers, []
        for copier in copiers:
            copier.close()

    # --- planning (the planner connection) ----------------------------------------------

    def plan_tables(self) -> list[TableInfo]:
        """The publication's tables, as of the snapshot (one query each for columns, key and types)."""
        try:
            tables = read_tables(self._conns[0], self.publication)
        except psycopg.Error as e:
            raise self._error(
                f"cannot list the tables of publication {self.publication}: {one_line(str(e))}"
            ) from None
        self.tables = tables
        return tables

    def expected_rows(self, table: TableInfo) -> int:
        """Its rows as best known once it is cut: counted by the key's boundary pass, else its
        statistics scaled to its pages now, else the catalog's estimate."""
        counted = self.row_counts.get(table.relid)
        if counted is not None:
            return counted
        cut = self.page_cuts.get(table.relid)
        return table.estimated_rows if cut is None else cut.estimated_rows

    def pages(self, relid: int) -> int:
        """The heap pages of a table cut in page ranges, 0 for one cut by key."""
        cut = self.page_cuts.get(relid)
        return 0 if cut is None else cut.pages

    def chunks(self, table: TableInfo) -> list[Chunk]:
        """The table's chunks: with `split = "ctid"` (the default) the table's statistics and size give
        ranges of its pages; else, or where those do not apply (an older server, a partitioned table,
        no statistics), one pass over its key inside the snapshot finds their bounds."""
        if (
            self.settings.split == "ctid"
            and not table.partitioned
            and self._conns[0].info.server_version >= CTID_SPLIT_SERVER
        ):
            try:
                found = self._conns[0].execute(_PAGES_SQL, (table.relid,)).fetchone()
            except psycopg.Error as e:
                raise self._error(f"cannot read its size in pages: {one_line(str(e))}", table.label) from None
            relpages, reltuples, pages_now, block_size = found or (0, 0.0, 0, 8192)
            by_pages = ctid_chunks(
                table,
                int(relpages),
                float(reltuples),
                int(pages_now),
                self.settings.chunk_rows,
                int(block_size),
            )
            if by_pages is not None:
                self.page_cuts[table.relid] = PageCut(
                    max(int(pages_now), 1),
                    ctid_rows_estimate(int(relpages), float(reltuples), int(pages_now)),
                )
                return by_pages
        if not table.key:
            return chunks_of(table, [])
        try:
            rows = self._conns[0].execute(boundaries_sql(table, self.settings.chunk_rows)).fetchall()
        except psycopg.Error as e:
            raise self._error(f"cannot cut it into key ranges: {one_line(str(e))}", table.label) from None
        bounds, self.row_counts[table.relid] = split_bounds(rows)
        return chunks_of(table, bounds)

    # --- copying (one thread per copier connection) --------------------------------------

    def start(self, done: Callable[[ChunkResult | BaseException], None]) -> None:
        """Copier threads, one a copier process, copying the chunks `feed` gives until `feed(None)`;
        each result goes to `done`."""
        for i, copier in enumerate(self._copiers):
            t = threading.Thread(
                target=self._copier,
                args=(copier, done),
                name=f"csnd-snapshot-{self.node}-{i + 1}",
                daemon=True,
            )
            t.start()
            self._threads.append(t)

    def feed(self, chunk: Chunk | None) -> None:
        """A chunk for the copiers; None: no more (each copier ends once the queue is empty)."""
        if chunk is None:
            for _ in self._threads:
                self._chunks.put(None)
        else:
            self._chunks.put(chunk)

    def join(self) -> None:
        for t in self._threads:
            t.join()

    def _copier(
        self, copier: CopierProcess | LocalCopier, done: Callable[[ChunkResult | BaseException], None]
    ) -> None:
        while True:
            chunk = self._chunks.get()
            if chunk is None or self._stop.is_set():
                return
            try:
                if self.on_chunk_start is not None:
                    self.on_chunk_start(chunk)
                changes, rows = copier.copy(chunk)
                done(ChunkResult(chunk, self.node, changes, rows))
            except BaseException as e:  # (handed to the run, which ends the snapshot)
                if isinstance(e, CsndError) and not isinstance(e, SnapshotError):
                    e = self._error(e.message, chunk.table.label)
                done(e)
                return


def read_tables(
    conn: psycopg.Connection[tuple[Any, ...]], publication: str, only: tuple[str, str] | None = None
) -> list[TableInfo]:
    """The tables of `publication` as `conn` sees them: columns as published, key, row filter, types.

    `only`: (schema, table), that one table (or none, when it is not published).
    """
    rows = [
        r
        for r in conn.execute(_TABLES_SQL, (publication,)).fetchall()
        if only is None or (str(r[1]), str(r[2])) == only
    ]
    tables = []
    for relid, schema, name, replident, relkind, reltuples, attnames, rowfilter in rows:
        published = set(attnames or [])
        columns = tuple(
            ColumnInfo(str(n), int(oid), int(mod), str(sqltype), bool(ident))
            # (a stored generated column only when the publication sends it too: PostgreSQL 18's
            # publish_generated_columns = stored lists it in attnames, and the stream carries it)
            for n, oid, mod, sqltype, ident in conn.execute(_COLUMNS_SQL, (relid, list(published))).fetchall()
            if not published or n in published
        )
        key = tuple(str(r[0]) for r in conn.execute(_KEY_SQL, (relid,)).fetchall())
        if not {c.name for c in columns}.issuperset(key):
            key = ()  # (a column list without the whole key: the table is one chunk)
        types = []
        for oid in sorted({c.type_oid for c in columns if c.type_oid >= FIRST_NON_BUILTIN_OID}):
            base = conn.execute(_BASE_TYPE_SQL, (oid,)).fetchone()
            if base is not None:
                types.append(TypeInfo(oid, str(base[0]), str(base[1])))
        tables.append(
            TableInfo(
                int(relid),
                str(schema),
                str(name),
                str(replident),
                columns,
                key,
                str(rowfilter) if rowfilter else None,
                int(reltuples),
                relkind == "p",
                tuple(types),
            )
        )
    return tables
