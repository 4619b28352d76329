"""`csnd snapshot TABLE...`: incremental snapshots of a running service's tables, chunk by chunk.

    StartSnapshot (gRPC) ─► IncrementalSnapshots.submit: tables checked, the job stored, queued
    job thread, per table, per chunk of CHUNK_ROWS keys after the last one done:
        Windows.open ─► REPEATABLE READ: the chunk's upper key, COPY (lo, hi] ─► read bodies
        ─► store the chunk as pending ─► BEGIN; txid_current(); Windows.arm; emit the watermark; COMMIT
        ─► the sink attaches the rows to the watermark's record ─► durable ─► store the chunk as done

The stream never stops and the table is never locked: the chunks interleave
with the live stream, and `csnd.snapshot.watermark` says why the rows a
chunk keeps are right at its watermark's CSN.

Crashes.  The job's progress is stored in the changelog directory
(`incremental_snapshots.json`, replaced atomically): per table the key after
which the next chunk starts, and the chunk in flight with the CSN the
changelog had reached before it.  A restarted service resumes each job
unfinished.  Whether the chunk in flight made it is read from the changelog
itself (a record with its marker after that CSN), so a chunk is neither lost
nor appended twice; a watermark whose rows were lost with the process is
left in the changelog as an empty transaction.

Only single-mode live sources the service reads itself: in GTM mode the
watermark's transaction would need a CSN from the GTM, which the service
does not reach.  A table needs a primary key (rows are told apart by it)
and a replica identity that names it on deletes (DEFAULT, FULL, or USING
INDEX of the primary key).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Final, TypeVar

import psycopg

from csnd.changelog import Changelog
from csnd.core.durable import replace_file
from csnd.core.errors import CsnOutOfRange, SnapshotError
from csnd.core.tablespec import parse_table
from csnd.reader.reconnect import one_line
from csnd.snapshot.copyrows import BinaryCopyRows, CopyFormatError, TextCopyRows
from csnd.snapshot.lines import read_body
from csnd.snapshot.plan import CHUNK_ROWS, Chunk, TableInfo, chunk_copy_sql, next_bound_sql
from csnd.snapshot.progress import SnapshotProgress
from csnd.snapshot.run import table_relation_body
from csnd.snapshot.watermark import PREFIX, UNPLACED_LSN, ReadSnapshot, Tracker, Window, Windows, body_key
from csnd.snapshot.watermark import Chunk as WindowChunk

log = logging.getLogger("csnd.snapshot")
_T = TypeVar("_T")

JOBS_FILE: Final = "incremental_snapshots.json"
# A chunk every row of which had to be left out (the table truncated, a transaction too
# large to look into) is read again; this many times in a row ends the job.
REDO_LIMIT: Final = 20
# How often a job waiting for its watermark to come through the pipeline says so.
WAIT_NOTE_S: Final = 30.0
# Waits on the database after a lost connection, before the chunk is tried again.
RETRY_WAITS_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0)
# A chunk's rendered rows are held in memory and appended as one record: chunks of wide rows
# hold fewer rows, so that one stays about this size (the first chunk of a table learns the width).
CHUNK_BYTES: Final = 64 << 20
# How long a connection to a node may take to open.
CONNECT_TIMEOUT_S: Final = 10
# After a job, the next look for tables new to a when_needed publication waits at least this long.
AFTER_JOB_S: Final = 5.0
# How often a when_needed node's publication is looked at for tables new to it
# (CSND_NEW_TABLES_EVERY_S: tests make it short).
NEW_TABLES_EVERY_S: Final = float(os.environ.get("CSND_NEW_TABLES_EVERY_S", "30"))

_PUBLISHED_SQL: Final = """
SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = %s
ORDER BY schemaname, tablename
"""


@dataclass(frozen=True)
class NodeAccess:
    """How a job reaches one node: what the service's live source for it says."""

    node: str
    conninfo: str
    publication: str
    binary: bool
    mode: str
    enums: Callable[[], list[tuple[int, int]]]
    # snapshot=when_needed: a table that joins the publication later is snapshotted by itself
    when_needed: bool = False


@dataclass
class TableJob:
    """One table of a job, as stored: where its next chunk starts and the chunk in flight."""

    node: str
    schema: str
    table: str
    state: str = "waiting"  # "waiting", "copying", "done"
    after: list[str] | None = None  # the last key done, as text (None: none yet)
    chunks: int = 0  # chunks done
    rows: int = 0  # rows kept (appended as reads)
    estimated: int = 0
    # the chunk in flight: {"chunk": n, "hi": [...] | None, "floor": the changelog's newest csn before it}
    pending: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass
class Job:
    id: str
    tables: list[TableJob]
    chunk_rows: int = CHUNK_ROWS
    state: str = "running"  # "running", "complete", "failed"
    error: str = ""
    redo: int = field(default=0, repr=False)


class IncrementalSnapshots:
    """The service's incremental snapshot jobs: submitted over gRPC, run one at a time on a thread."""

    def __init__(
        self,
        directory: str,
        changelog: Changelog,
        windows: Windows,
        nodes: dict[str, NodeAccess],
        *,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.path = os.path.join(directory, JOBS_FILE)
        self.log = changelog
        self.windows = windows
        self.nodes = nodes
        self.chunk_rows = chunk_rows
        self.progress = SnapshotProgress()
        self._lock = threading.Lock()
        self._jobs: list[Job] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # when_needed nodes: the tables of their publication already covered (by the initial
        # snapshot, by a job, or there when the node was first seen), as [schema, table]
        self.known: dict[str, list[list[str]]] = {}
        self._next_look = 0.0
        self._active: _Table | None = None  # the table being read (stop() cancels its query)
        self._submitting = threading.Lock()  # one submit at a time: "one job at a time" holds

    # --- jobs ---------------------------------------------------------------------------

    def load(self) -> None:
        """The jobs stored by an earlier run; the unfinished ones resume once `start()` is called."""
        try:
            with open(self.path, "rb") as f:
                stored = json.loads(f.read())
        except FileNotFoundError:
            return
        except ValueError as e:
            raise SnapshotError(f"{self.path} is not the incremental snapshots' JSON: {e}") from None
        try:
            self.known = {n: [list(t) for t in ts] for n, ts in stored.get("known", {}).items()}
            jobs = [
                Job(j["id"], [TableJob(**t) for t in j["tables"]], j["chunk_rows"], j["state"], j["error"])
                for j in stored.get("jobs", [])
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise SnapshotError(
                f"{self.path} is not the incremental snapshots' JSON csnd writes ({type(e).__name__}: {e}); "
                "move it away to forget the jobs (a job then running is not resumed)"
            ) from None
        for job in jobs:
            self._jobs.append(job)
            if job.state == "running":
                self._show(job)
                log.info("incremental snapshot %s: resuming", job.id)

    def latest(self) -> Job | None:
        with self._lock:
            return self._jobs[-1] if self._jobs else None

    def look_for_new_tables(self) -> None:
        """Snapshot, by a job of their own, the tables new to a when_needed node's publication.

        A node seen the first time takes its publication as it is: its tables
        are the initial snapshot's, or were streamed from a slot that existed
        (when_needed streams those without a snapshot).  A table that cannot be
        snapshotted (no primary key) is logged once and counted as known.
        """
        for access in self.nodes.values():
            if not access.when_needed or access.mode != "single":
                continue
            try:
                with psycopg.connect(
                    access.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S
                ) as conn:
                    published = [
                        [str(a), str(b)] for a, b in conn.execute(_PUBLISHED_SQL, (access.publication,))
                    ]
            except psycopg.Error as e:
                log.warning(
                    "node %s: cannot look for new tables to snapshot: %s", access.node, one_line(str(e))
                )
                continue
            known = self.known.get(access.node)
            if known is None:
                with self._lock:
                    self.known[access.node] = published
                    self._store()
                continue
            new = [t for t in published if t not in known]
            if not new:
                continue
            specs = []
            try:
                for schema, table in new:
                    try:
                        self._table_info(access, schema, table, must=True)
                        specs.append(table_spec(schema, table))
                    except ValueError as e:
                        log.warning(
                            "node %s: not snapshotting %s.%s, new in its publication: %s",
                            access.node,
                            schema,
                            table,
                            e,
                        )
            except SnapshotError as e:  # (the node cannot be read now: looked at again later)
                log.warning("node %s: cannot look for new tables to snapshot: %s", access.node, e)
                continue
            if specs:
                try:
                    self.submit(specs, access.node)
                except (RuntimeError, SnapshotError) as e:  # (a job started meanwhile; the node is away)
                    log.warning("node %s: new tables wait for the next look: %s", access.node, e)
                    return
                except ValueError as e:  # (one of them went away or changed meanwhile)
                    log.warning("node %s: not snapshotting %s: %s", access.node, ", ".join(specs), e)
                else:
                    log.info(
                        "node %s: new in publication %s: %s",
                        access.node,
                        access.publication,
                        ", ".join(specs),
                    )
            with self._lock:
                known.extend(new)
                self._store()
            if specs:
                return  # (one job at a time: other nodes' new tables at the next look)

    def submit(self, specs: list[str], node: str | None = None, chunk_rows: int = 0) -> Job:
        """A new job over `specs` (`schema.table`) on `node` (None: every node that has the table).

        ValueError for what the caller asked wrong (unknown table or node, no key);
        RuntimeError while another job runs; SnapshotError when the node cannot be read.
        """
        with self._submitting:
            return self._submit(specs, node, chunk_rows)

    def _submit(self, specs: list[str], node: str | None, chunk_rows: int) -> Job:
        with self._lock:
            running = next((j for j in self._jobs if j.state == "running"), None)
        if running is not None:
            raise RuntimeError(
                f"incremental snapshot {running.id} is still running "
                f"({', '.join(t.label for t in running.tables)}); start another once it is complete"
            )
        if not specs:
            raise ValueError("name at least one table (schema.table)")
        wanted = []
        for spec in specs:
            schema, table = parse_table(spec)
            if table is None:
                raise ValueError(f"{spec}: name one table, not every table of a schema")
            wanted.append((schema, table))
        if node is not None and node not in self.nodes:
            raise ValueError(
                f"no live node {node!r} in this service (nodes: {', '.join(sorted(self.nodes))})"
            )
        targets = [self.nodes[node]] if node is not None else [self.nodes[n] for n in sorted(self.nodes)]
        if not targets:
            raise ValueError("this service reads no live PostgreSQL source: there is nothing to snapshot")
        tables: list[TableJob] = []
        for schema, table in wanted:
            found = False
            for access in targets:
                info = self._table_info(access, schema, table, must=node is not None)
                if info is not None:
                    found = True
                    tables.append(TableJob(access.node, schema, table, estimated=info.estimated_rows))
            if not found:
                raise ValueError(
                    f"table {schema}.{table} is not in the publication of any node "
                    f"({', '.join(f'{a.node}: {a.publication}' for a in targets)})"
                )
        job = Job(uuid.uuid4().hex[:12], tables, chunk_rows or self.chunk_rows)
        with self._lock:
            self._jobs = [j for j in self._jobs if j.state == "running"] + [job]
            self._store()
        self._show(job)
        log.info("incremental snapshot %s: %s", job.id, ", ".join(f"{t.node} {t.label}" for t in job.tables))
        self._wake.set()
        return job

    def _show(self, job: Job) -> None:
        self.progress = SnapshotProgress()
        self.progress.state = job.state
        for t in job.tables:
            self.progress.add_table(  # (chunks are found as the copy goes: the estimate's count is a guess)
                t.node, t.schema, t.table, t.estimated, -(-t.estimated // job.chunk_rows), chunks_known=False
            )
            if t.chunks:
                self.progress.chunk_done(t.node, t.schema, t.table, t.rows, chunks=t.chunks)
            if t.state == "done":
                self.progress.table_done(t.node, t.schema, t.table, t.chunks)

    def _table_info(self, access: NodeAccess, schema: str, table: str, *, must: bool) -> TableInfo | None:
        from csnd.snapshot.copier import read_tables

        if access.mode != "single":
            raise ValueError(
                f"node {access.node} runs in {access.mode} mode: an incremental snapshot's watermark would "
                "need a CSN from the GTM, which the service does not reach (take an initial snapshot instead)"
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

    # --- the job thread -------------------------------------------------------------------

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="csnd-incremental-snapshot", daemon=True)
        thread.start()
        self._thread = thread  # (only once started: a stop may come at any moment, a signal's)

    def stop(self) -> None:
        """End the job thread (the job resumes at the next start); a query it waits on is cancelled."""
        self._stop.set()
        self._wake.set()
        active = self._active
        if active is not None:
            active.close()
        thread = self._thread
        if thread is not None and thread.ident is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                job = next((j for j in self._jobs if j.state == "running"), None)
            if job is None:
                if time.monotonic() >= self._next_look:
                    self._next_look = time.monotonic() + NEW_TABLES_EVERY_S
                    try:
                        self.look_for_new_tables()
                    except _Stopped:
                        return
                    except Exception as e:  # (looked at again later; the service goes on)
                        log.error("looking for new tables to snapshot failed: %s", e)
                    continue
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self._run_job(job)
            except _Stopped:
                return
            except Exception as e:  # (the job ends; the service goes on)
                message = str(e) if isinstance(e, SnapshotError) else f"{type(e).__name__}: {e}"
                log.error("incremental snapshot %s failed: %s", job.id, message)
                with self._lock:
                    job.state, job.error = "failed", message
                    self._store()
                self.progress.state = "failed"

    def _run_job(self, job: Job) -> None:
        for t in job.tables:
            if t.state == "done":
                continue
            access = self.nodes.get(t.node)
            if access is None:
                raise SnapshotError(f"node {t.node} is no longer a live source of this service", node=t.node)
            info = self._retrying(
                job, t, "check the table", partial(self._table_info, access, t.schema, t.table, must=True)
            )
            assert info is not None
            t.state = "copying"
            self.progress.chunk_started(t.node, t.schema, t.table)
            if t.pending is not None:
                self._settle_pending(job, t)
            table = _Table(access, info, self._stop)
            self._active = table
            tracker = self.windows.track(t.node, t.schema, t.table, info.key)
            try:
                self._retrying(
                    job, t, "wait for commits not yet visible", partial(table.wait_visible, job.id)
                )
                while t.state != "done":
                    self._chunk(job, t, table, tracker)
            finally:
                self.windows.untrack(tracker)
                self._active = None
                table.close()
        with self._lock:
            job.state = "complete"
            self._store()
        self.progress.state = "complete"
        # (a table new to a when_needed publication waits a little: a follower of this job sees it end)
        self._next_look = max(self._next_look, time.monotonic() + AFTER_JOB_S)
        log.info("incremental snapshot %s complete: %d rows", job.id, sum(t.rows for t in job.tables))

    def _retrying(self, job: Job, t: TableJob, what: str, step: Callable[[], _T]) -> _T:
        """`step()`, tried again after a lost connection (RETRY_WAITS_S), then a clear error."""
        for attempt, wait in enumerate((*RETRY_WAITS_S, None)):
            try:
                return step()
            except psycopg.OperationalError as e:
                if self._stop.is_set():
                    raise _Stopped from None
                if wait is None:
                    raise SnapshotError(
                        f"cannot {what}: {one_line(str(e))}", node=t.node, table=t.label
                    ) from None
                log.warning(
                    "incremental snapshot %s: %s %s: cannot %s: %s; trying again in %.1fs (attempt %d)",
                    job.id,
                    t.node,
                    t.label,
                    what,
                    one_line(str(e)),
                    wait,
                    attempt + 1,
                )
                if self._active is not None:
                    self._active.close()
                if self._stop.wait(wait):
                    raise _Stopped from None
        raise AssertionError("unreachable")

    def _settle_pending(self, job: Job, t: TableJob) -> None:
        """A chunk was in flight when the service stopped: did its record reach the changelog?"""
        assert t.pending is not None
        needle = f'"incremental": "{job.id}"'.encode()
        try:
            records = list_after(self.log, int(t.pending["floor"]), needle)
        except CsnOutOfRange as e:
            raise SnapshotError(
                f"cannot tell whether chunk {t.pending['chunk']}, in flight when the service stopped, reached "
                f"the changelog: retention dropped the records after csn {t.pending['floor']} ({e.message}); "
                "start the snapshot again",
                node=t.node,
                table=t.label,
            ) from None
        for csn, line in records:
            marker = json.loads(line).get("snapshot") or {}
            if (marker.get("node"), marker.get("table"), marker.get("chunk")) == (
                t.node,
                t.table,
                t.pending["chunk"],
            ) and marker.get("schema") == t.schema:
                self._chunk_done(
                    job, t, t.pending, csn, int(marker.get("rows", 0)), redo=bool(marker.get("redo"))
                )
                return
        t.pending = None  # (lost with the process: read again)

    def _chunk(self, job: Job, t: TableJob, table: _Table, tracker: Tracker) -> None:
        number = t.chunks + 1
        rows = table.chunk_rows(job.chunk_rows)

        def read_and_mark() -> tuple[Window, dict[str, Any]]:
            window = self.windows.open(tracker, self.log.newest_csn)
            try:
                hi, bodies, snapshot = table.read_chunk(t.after, rows, number)
                marker = {
                    "node": t.node,
                    "schema": t.schema,
                    "table": t.table,
                    "incremental": job.id,
                    "chunk": number,
                    "last": hi is None,
                }
                keys = [body_key(b, table.info.key) for b in bodies]
                pending = {
                    "chunk": number,
                    "hi": list(hi) if hi is not None else None,
                    "floor": self.log.newest_csn,
                }
                with self._lock:
                    t.pending = pending
                    self._store()
                chunk = WindowChunk(bodies, keys, marker, table_relation_body(table.info))
                table.emit_watermark(self.windows, window, chunk, snapshot, job.id, number)
                return window, pending
            except BaseException:
                self.windows.close(window)
                with self._lock:
                    t.pending = None  # (no watermark committed: nothing of it can be in the changelog)
                raise

        window, pending = self._retrying(job, t, f"read chunk {number}", read_and_mark)
        try:
            csn = self._wait_appended(job, t, window)
        finally:
            self.windows.close(window)
        kept = window.appended[1] if window.appended is not None else 0
        self._chunk_done(job, t, pending, csn, kept, redo=bool(window.redo))

    def _chunk_done(
        self, job: Job, t: TableJob, pending: dict[str, Any], csn: int, kept: int, *, redo: bool
    ) -> None:
        with self._lock:
            t.pending = None
            if redo:
                job.redo += 1
                if job.redo >= REDO_LIMIT:
                    raise SnapshotError(
                        f"chunk {pending['chunk']} had to be read again {job.redo} times in a row (the table "
                        "truncated, or transactions too large to look into, inside every window); "
                        "start the snapshot again when the table is quieter",
                        node=t.node,
                        table=t.label,
                    )
                self._store()
                return
            job.redo = 0
            t.chunks += 1
            t.rows += kept
            t.after = pending["hi"]
            if pending["hi"] is None:
                t.state = "done"
            self._store()
        self.progress.chunk_done(t.node, t.schema, t.table, kept)
        if t.state == "done":
            self.progress.table_done(t.node, t.schema, t.table, t.chunks)
        log.info(
            "incremental snapshot %s: %s %s chunk %d at csn %d, %d rows",
            job.id,
            t.node,
            t.label,
            pending["chunk"],
            csn,
            kept,
        )

    def _wait_appended(self, job: Job, t: TableJob, window: Window) -> int:
        """The CSN of the watermark's record once it is durable."""
        note = time.monotonic() + WAIT_NOTE_S
        while not window.done.wait(0.5):
            if self._stop.is_set():
                raise _Stopped
            if time.monotonic() >= note:
                note += WAIT_NOTE_S
                log.warning(
                    "incremental snapshot %s: %s %s: the watermark (xid %s) has not come through the pipeline "
                    "for %.0fs; still waiting",
                    job.id,
                    t.node,
                    t.label,
                    window.high_xid,
                    WAIT_NOTE_S,
                )
        assert window.appended is not None
        csn = window.appended[0]
        while not self.log.wait_durable(csn - 1, 0.5):
            if self._stop.is_set():
                raise _Stopped
        return csn

    def _store(self) -> None:
        """Under the lock: every job, replaced atomically in the changelog directory."""
        doc: dict[str, Any] = {
            "jobs": [{**asdict(j), "tables": [asdict(t) for t in j.tables]} for j in self._jobs],
            "known": self.known,
        }
        for j in doc["jobs"]:
            j.pop("redo", None)
        replace_file(self.path, json.dumps(doc, indent=1).encode())


def table_spec(schema: str, table: str) -> str:
    """`schema.table` as `csnd.core.tablespec` reads it back (a part with a dot, quote or space quoted)."""

    def part(name: str) -> str:
        plain = (
            name and name != "*" and not any(ch in name for ch in '."') and not any(c.isspace() for c in name)
        )
        return name if plain else '"' + name.replace('"', '""') + '"'

    return f"{part(schema)}.{part(table)}"


class _Stopped(Exception):
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


class _Table:
    """One table's connection to its node: chunks read in REPEATABLE READ, watermarks emitted."""

    def __init__(self, access: NodeAccess, info: TableInfo, stop: threading.Event) -> None:
        self.access = access
        self.info = info
        self._stop = stop
        self._enums = access.enums() if access.binary else []
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None
        self._cache: Any = None
        self._row_bytes = 0.0  # rendered bytes a row, as the chunks so far had them (0: none yet)

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
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=2.0)
            with contextlib.suppress(Exception):
                conn.close()

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
                raise _Stopped
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


# Backends whose commit is flushed (so decoded and maybe appended) but not yet visible: waiting for a
# synchronous standby.  (pg_xact_status cannot tell them: it says "in progress" while the xid is held.)
_SYNC_REP_XIDS_SQL: Final = (
    "SELECT backend_xid::text FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND wait_event = 'SyncRep'"
)


def _one(conn: psycopg.Connection[tuple[Any, ...]], query: str, params: tuple[Any, ...] | None = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row is not None else None


def list_after(log: Changelog, csn: int, needle: bytes) -> list[tuple[int, bytes]]:
    """The changelog's records after `csn` that hold `needle`, read now."""
    return [(c, line) for c, line in log.read(csn) if needle in line]
