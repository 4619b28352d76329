"""Progress of an initial snapshot, per table: the one object Status, /metrics and the dashboard read.

The copier's threads count rows and chunks as each chunk is appended; a
Status request reads them from another thread (`tables()` copies under a
lock, never waits on a copy).  The ETA is the table's remaining estimated
rows at the rate the table has gone so far, on an injected monotonic clock.
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
    rows_estimated: int = 0  # pg_class.reltuples, raised to what was read (0: unknown)
    chunks_done: int = 0
    chunks: int = 0
    eta_seconds: float = -1.0  # -1: unknown (nothing read yet, or no estimate)


class _Table:
    __slots__ = ("node", "schema", "table", "estimated", "chunks", "done", "rows", "started", "finished")

    def __init__(self, node: str, schema: str, table: str, estimated: int, chunks: int) -> None:
        self.node, self.schema, self.table = node, schema, table
        self.estimated, self.chunks = estimated, chunks
        self.done = self.rows = 0
        self.started: float | None = None
        self.finished = False


class SnapshotProgress:
    """Every snapshot table's progress; `state` is "", "running", "complete" or "failed"."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str, str], _Table] = {}
        self.state = ""
        self.first_csn = 0
        self.last_csn = 0

    def add_table(self, node: str, schema: str, table: str, estimated: int, chunks: int) -> None:
        with self._lock:
            self._tables[(node, schema, table)] = _Table(node, schema, table, max(estimated, 0), chunks)

    def chunk_started(self, node: str, schema: str, table: str) -> None:
        with self._lock:
            t = self._tables[(node, schema, table)]
            if t.started is None:
                t.started = self._clock()

    def chunk_done(self, node: str, schema: str, table: str, rows: int) -> None:
        with self._lock:
            t = self._tables[(node, schema, table)]
            t.done += 1
            t.rows += rows
            t.finished = t.done >= t.chunks

    def table_done(self, node: str, schema: str, table: str, chunks: int) -> None:
        """The table is complete in `chunks` chunks (an incremental snapshot learns how many only at its end)."""
        with self._lock:
            t = self._tables[(node, schema, table)]
            t.chunks = t.done = chunks
            t.finished = True

    def tables(self) -> list[TableProgress]:
        now = self._clock()
        with self._lock:
            return [self._view(t, now) for t in self._tables.values()]

    @staticmethod
    def _view(t: _Table, now: float) -> TableProgress:
        estimated = max(t.estimated, t.rows)
        if t.finished:
            return TableProgress(t.node, t.schema, t.table, "done", t.rows, t.rows, t.done, t.chunks, 0.0)
        eta = -1.0
        if t.started is not None and t.rows > 0 and t.estimated > 0:
            rate = t.rows / max(now - t.started, 1e-6)
            eta = max(estimated - t.rows, 0) / rate
        state = "waiting" if t.started is None else "copying"
        return TableProgress(t.node, t.schema, t.table, state, t.rows, estimated, t.done, t.chunks, eta)
