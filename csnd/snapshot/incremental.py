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

The parts: `jobstore` (the jobs as stored), `chunkreader` (a table's chunks
and watermarks on its node), `newtables` (when_needed publications looked
at), `watermark` (the DBLog rule); this module runs the jobs on one thread.

Live sources the service reads itself; in GTM mode only with the GTM named
(`csnd serve --gtm`): each watermark then commits as a global transaction
of its node, at a CSN of the GTM (`chunkreader.ChunkReader`).  A table needs a primary key (rows are told apart by it)
and a replica identity that names it on deletes (DEFAULT, FULL, or USING
INDEX of the primary key).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, Final, TypeVar

import psycopg

from csnd.changelog import Changelog
from csnd.core.errors import CsnOutOfRange, SnapshotError
from csnd.core.tablespec import parse_table
from csnd.reader.reconnect import one_line
from csnd.snapshot.chunkreader import WAIT_NOTE_S, ChunkReader, Stopped, table_info
from csnd.snapshot.jobstore import (
    JOBS_FILE,
    Job,
    Known,
    NodeAccess,
    TableJob,
    outcomes,
    read_jobs,
    shown_job,
    write_jobs,
)
from csnd.snapshot.newtables import look_for_new_tables
from csnd.snapshot.plan import CHUNK_ROWS
from csnd.snapshot.progress import SnapshotProgress
from csnd.snapshot.run import table_relation_body
from csnd.snapshot.watermark import Chunk as WindowChunk
from csnd.snapshot.watermark import Tracker, Window, Windows, body_key

# (re-exported: the service builds NodeAccess from here, tests build jobs)
__all__ = ["IncrementalSnapshots", "Job", "NodeAccess", "TableJob", "list_after"]

log = logging.getLogger("csnd.snapshot")
_T = TypeVar("_T")

# A chunk every row of which had to be left out (the table truncated, a transaction too
# large to look into) is read again; this many times in a row ends the job.
REDO_LIMIT: Final = 20
# Waits on the database after a lost connection, before the chunk is tried again.
RETRY_WAITS_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0)
# How many jobs that ended Status still tells the outcome of (a follower of a queued job reads it there).
ENDED_KEPT: Final = 16
# After a job, the next look for tables new to a when_needed publication waits at least this long.
AFTER_JOB_S: Final = 5.0
# How often a when_needed node's publication is looked at for tables new to it
# (CSND_NEW_TABLES_EVERY_S: tests make it short).
NEW_TABLES_EVERY_S: Final = float(os.environ.get("CSND_NEW_TABLES_EVERY_S", "30"))


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
        self.known: Known = {}
        self._next_look = 0.0
        self._active: ChunkReader | None = None  # the table being read (stop() cancels its query)
        self._submitting = threading.Lock()  # one submit at a time: the queue's order is the submits' order

    # --- jobs ---------------------------------------------------------------------------

    def load(self) -> None:
        """The jobs stored by an earlier run; the unfinished ones resume once `start()` is called."""
        jobs, self.known = read_jobs(self.path)
        for job in jobs:
            self._jobs.append(job)
            if job.state == "running":
                self._show(job)
                log.info("incremental snapshot %s: resuming", job.id)

    def latest(self) -> Job | None:
        with self._lock:
            return shown_job(self._jobs)

    def queued(self) -> list[str]:
        with self._lock:
            return [j.id for j in self._jobs if j.state == "queued"]

    def ended(self) -> dict[str, str]:
        with self._lock:
            return outcomes(self._jobs)

    def look_for_new_tables(self) -> None:
        """Snapshot, by a job of their own, the tables new to a when_needed node's publication."""
        look_for_new_tables(self.nodes, self.known, self.submit, self._update)

    def _update(self, change: Callable[[], None]) -> None:
        with self._lock:
            change()
            self._store()

    def submit(self, specs: list[str], node: str | None = None, chunk_rows: int = 0) -> Job:
        """A new job over `specs` (`schema.table`) on `node` (None: every node that has the table).

        ValueError for what the caller asked wrong (unknown table or node, no key);
        SnapshotError when the node cannot be read.  Behind a running job the new one is queued.
        """
        with self._submitting:
            return self._submit(specs, node, chunk_rows)

    def _submit(self, specs: list[str], node: str | None, chunk_rows: int) -> Job:
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
                info = table_info(access, schema, table, must=node is not None)
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
            unfinished = [j for j in self._jobs if j.state in ("running", "queued")]
            ended = [j for j in self._jobs if j.state in ("complete", "failed")][-ENDED_KEPT:]
            if unfinished:
                job.state = "queued"  # (one job runs at a time; the others wait their turn, in order)
            self._jobs = ended + unfinished + [job]
            self._store()
        if job.state == "running":
            self._show(job)
        log.info(
            "incremental snapshot %s%s: %s",
            job.id,
            " (queued)" if job.state == "queued" else "",
            ", ".join(f"{t.node} {t.label}" for t in job.tables),
        )
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
            job = self._next_job()
            if job is None:
                if time.monotonic() >= self._next_look:
                    self._next_look = time.monotonic() + NEW_TABLES_EVERY_S
                    try:
                        self.look_for_new_tables()
                    except Stopped:
                        return
                    except Exception as e:  # (looked at again later; the service goes on)
                        log.error("looking for new tables to snapshot failed: %s", e)
                    continue
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            try:
                self._run_job(job)
            except Stopped:
                return
            except Exception as e:  # (the job ends; the service goes on)
                message = str(e) if isinstance(e, SnapshotError) else f"{type(e).__name__}: {e}"
                log.error("incremental snapshot %s failed: %s", job.id, message)
                with self._lock:
                    job.state, job.error = "failed", message
                    self._store()
                self.progress.state = "failed"

    def _next_job(self) -> Job | None:
        """The running job, else the first queued one, now running (None: none to run)."""
        with self._lock:
            running = next((j for j in self._jobs if j.state == "running"), None)
            if running is not None:
                return running
            job = next((j for j in self._jobs if j.state == "queued"), None)
            if job is None:
                return None
            job.state = "running"
            self._store()
        self._show(job)
        log.info("incremental snapshot %s: its turn, starting", job.id)
        return job

    def _run_job(self, job: Job) -> None:
        for t in job.tables:
            if t.state == "done":
                continue
            access = self.nodes.get(t.node)
            if access is None:
                raise SnapshotError(f"node {t.node} is no longer a live source of this service", node=t.node)
            info = self._retrying(
                job, t, "check the table", partial(table_info, access, t.schema, t.table, must=True)
            )
            assert info is not None
            t.state = "copying"
            self.progress.chunk_started(t.node, t.schema, t.table)
            if t.pending is not None:
                self._settle_pending(job, t)
            table = ChunkReader(access, info, self._stop)
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
                    raise Stopped from None
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
                    raise Stopped from None
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

    def _chunk(self, job: Job, t: TableJob, table: ChunkReader, tracker: Tracker) -> None:
        number = t.chunks + 1
        rows = table.chunk_rows(job.chunk_rows)

        def read_and_mark() -> tuple[Window, dict[str, Any]]:
            window = self.windows.open(tracker, self.log.newest_csn)
            if t.since is None:  # (the table's first chunk: the changelog's csn before every window of it)
                t.since = window.since
            try:
                hi, bodies, snapshot = table.read_chunk(t.after, rows, number)
                marker = {
                    "node": t.node,
                    "schema": t.schema,
                    "table": t.table,
                    "incremental": job.id,
                    "chunk": number,
                    "last": hi is None,
                    "since": t.since,
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
                raise Stopped
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
                raise Stopped
        return csn

    def _store(self) -> None:
        """Under the lock: every job, replaced atomically in the changelog directory."""
        write_jobs(self.path, self._jobs, self.known)


def list_after(log: Changelog, csn: int, needle: bytes) -> list[tuple[int, bytes]]:
    """The changelog's records after `csn` that hold `needle`, read now."""
    return [(c, line) for c, line in log.read(csn) if needle in line]
