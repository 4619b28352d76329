"""Progress of an initial snapshot, per table: the one object Status, /metrics and the dashboard read.

The copier's threads count rows and chunks as each chunk is appended; a
Status request reads them from another thread (`tables()` copies under a
lock, never waits on a copy).  The ETA is the table's remaining estimated
rows at the rate the table has gone so far, on an injected monotonic clock.

A table cut into ranges of its heap pages (the default, `plan.ctid_chunks`)
has no counted total: before its first chunk is in, its total is its
statistics' rows a page over its pages as it was cut; from then on, its rows
so far over the share of its pages their chunks covered (the pages are known
exactly, the rows a page only as of the last analyse), so stale statistics
mislead the ETA only until the first chunk lands.

Only what is known is shown.  A total is the table's row count (or its
statistics' estimate) while the copy is below it; a table without
statistics, or one the copy has outgrown, has an unknown total (0) and no
ETA, never `60000/60000` while rows still come.  The chunk count is exact
for an initial snapshot, which cuts the table before copying; an
incremental snapshot finds its chunks as it goes, so its count is a guess
from the estimate, unknown (0) once passed, and its table is done only when
`table_done` says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TableProgress:
    """One table as Status shows it (the fields of `csnd.v1.SnapshotTableStatus`)."""

    node: str
    schema: str
    table: str
    state: str  # "waiting", "copying", "done"
    rows: int = 0  # rows appended to the changelog
    rows_estimated: int = (
        0  # the row count or pg_class.reltuples while ahead of `rows`; done: rows (0: unknown)
    )
    chunks_done: int = 0
    chunks: int = 0  # 0: unknown
    eta_seconds: float = -1.0  # -1: unknown (nothing read yet, or no total known)
    rows_per_second: float = (
        0.0  # the rate so far, from its first chunk's start to now (done: to its end); 0: none yet
    )


class _Table:
    __slots__ = (
        "node",
        "schema",
        "table",
        "estimated",
        "chunks",
        "chunks_known",
        "done",
        "rows",
        "started",
        "finished",
        "finished_at",
        "pages",
        "pages_done",
    )

    def __init__(
        self, node: str, schema: str, table: str, estimated: int, chunks: int, chunks_known: bool, pages: int
    ) -> None:
        self.node, self.schema, self.table = node, schema, table
        self.estimated, self.chunks, self.chunks_known = estimated, chunks, chunks_known
        self.pages = pages  # cut into page ranges: the pages they cover (0: cut otherwise)
        self.pages_done = 0
        self.done = self.rows = 0
        self.started: float | None = None
        self.finished = False
        self.finished_at: float | None = None  # when it was done (its rate stops there)


class SnapshotProgress:
    """Every snapshot table's progress; `state` is "", "running", "complete" or "failed"."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str, str], _Table] = {}
        self.state = ""
        self.first_csn = 0
        self.last_csn = 0
        self.gtm_csn = 0  # GTM mode with --gtm: the commit barrier's CSN (csnd.gtm.barrier); 0: none
        self.barrier_ms = 0.0  # how long that barrier held the GTM

    def add_table(
        self,
        node: str,
        schema: str,
        table: str,
        estimated: int,
        chunks: int,
        *,
        chunks_known: bool = True,
        pages: int = 0,
    ) -> None:
        """A table to copy: `estimated` rows (0: unknown), in `chunks` chunks -- exactly, or a guess;
        `pages`: cut into ranges of that many heap pages in all (0: cut by key)."""
        with self._lock:
            self._tables[(node, schema, table)] = _Table(
                node, schema, table, max(estimated, 0), max(chunks, 0), chunks_known, max(pages, 0)
            )

    def chunk_started(self, node: str, schema: str, table: str) -> None:
        with self._lock:
            t = self._tables[(node, schema, table)]
            if t.started is None:
                t.started = self._clock()

    def chunk_done(
        self, node: str, schema: str, table: str, rows: int, chunks: int = 1, *, pages: int = 0
    ) -> None:
        """`chunks` more chunks (one; more when a restart shows what an earlier run did) of `rows` rows,
        covering `pages` of the table's heap pages (cut into page ranges)."""
        with self._lock:
            t = self._tables[(node, schema, table)]
            t.done += chunks
            t.rows += rows
            t.pages_done += max(pages, 0)
            t.finished = t.finished or (t.chunks_known and t.done >= t.chunks)
            if t.finished and t.finished_at is None:
                t.finished_at = self._clock()

    def table_done(self, node: str, schema: str, table: str, chunks: int) -> None:
        """The table is complete in `chunks` chunks (an incremental snapshot learns how many only at its end)."""
        with self._lock:
            t = self._tables[(node, schema, table)]
            t.chunks = t.done = chunks
            t.finished = True
            if t.finished_at is None:
                t.finished_at = self._clock()

    def tables(self) -> list[TableProgress]:
        now = self._clock()
        with self._lock:
            return [self._view(t, now) for t in self._tables.values()]

    @staticmethod
    def _view(t: _Table, now: float) -> TableProgress:
        rate = 0.0
        if t.started is not None and t.rows > 0:
            end = t.finished_at if t.finished_at is not None else now
            rate = t.rows / max(end - t.started, 1e-6)
        if t.finished:
            return TableProgress(t.node, t.schema, t.table, "done", t.rows, t.rows, t.done, t.done, 0.0, rate)
        total = _total(t)
        total = total if total > t.rows else 0  # (passed: the estimate was wrong, say unknown)
        chunks = t.chunks if t.chunks_known or t.chunks > t.done else 0
        eta = -1.0
        if rate > 0 and total > 0:
            eta = (total - t.rows) / rate
        state = "waiting" if t.started is None else "copying"
        return TableProgress(t.node, t.schema, t.table, state, t.rows, total, t.done, chunks, eta, rate)

    def summary(self) -> str:
        """One line for the log: tables and chunks done, rows against the total when every total is known,
        the rate so far and, with a known total, the time left."""
        now = self._clock()
        with self._lock:
            views = [self._view(t, now) for t in self._tables.values()]
            starts = [t.started for t in self._tables.values() if t.started is not None]
        done = sum(v.state == "done" for v in views)
        chunks_done = sum(v.chunks_done for v in views)
        rows = sum(v.rows for v in views)
        parts = [f"{done} of {len(views)} tables done"]
        chunks_known = all(v.chunks or v.state == "done" for v in views)
        parts.append(
            f"{chunks_done} of {sum(v.chunks for v in views)} chunks"
            if chunks_known
            else f"{chunks_done} chunks"
        )
        total_known = all(v.rows_estimated or v.state == "done" for v in views)
        total = sum(v.rows_estimated for v in views)
        rate = rows / max(now - min(starts), 1e-6) if starts and rows else 0.0
        text = f"{rows:,} of {total:,} rows" if total_known else f"{rows:,} rows of an unknown total"
        parts.append(f"{text} ({rate:,.0f} rows/s)")
        if total_known and rate > 0 and done < len(views):
            parts.append(f"eta {max(total - rows, 0) / rate:.0f} s")
        return ", ".join(parts)


def _total(t: _Table) -> int:
    """A table's rows as best known while it copies: page ranges with rows done, their rows over the
    share of pages done (rounded up: ahead of the rows while pages are left); else the estimate."""
    if 0 < t.pages_done < t.pages and t.rows > 0:
        return t.rows + -(-t.rows * (t.pages - t.pages_done) // t.pages_done)
    return t.estimated
