"""One initial snapshot, from the exported snapshots to the completion record in the changelog.

    NodeSnapshot (per node) ── planner thread: tables ─► chunks ─► copier threads ─┐
                                                                                   ▼ done queue (bounded)
    SnapshotRun.run (the service's pipeline thread): csn 1, 2, ... ─► Changelog.append_parts, a sync behind
                                                      then the completion record ─► sync

CSNs (docs/design.md section 5, "Initial snapshot"): the snapshot's records take
CSNs 1, 2, ... in the order their chunks finish, the completion record the
next one.  Every streamed transaction's CSN must be above them:

- single mode: a CSN is a commit LSN, and every streamed commit starts at or
  after the slot's consistent point, so the snapshot must stay below it --
  it does by some millions (a consistent point is never below the first WAL
  segment's end); a snapshot that would reach it is refused;
- GTM mode: the GTM's counter is checked when the stream starts -- a
  streamed transaction at or below the completion record's CSN ends the
  service with one line (`csnd.service.sink`), never a silent skip.  Taken
  under a GTM commit barrier (`GtmCut`), the completion record takes the
  barrier's CSN X when the chunks stay below it; the stream then resumes
  after X, dropping the transactions the snapshot already holds.

Chunk records are appended in runs: one fsync for the chunks that are
ready (at most `SYNC_CHUNKS`), the completion record only after them, so
a crash leaves a prefix of whole chunks and no completion record: the next start
sees it (`lines.snapshot_state`) and refuses.  The fsync of a run runs behind
the appends of the next (`changelog.behind.SyncBehind`): waited for in this
thread, the syncs were 15-20% of a million-row snapshot's wall clock.  The first chunk of each table
has the table's relation version kept in the changelog first, from the
Relation message its rows were rendered with, as a streamed transaction's
is (docs/design.md section 7, relation lines).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from csnd.changelog import SyncBehind
from csnd.core.errors import SnapshotError
from csnd.core.ids import lsn_to_str
from csnd.decoder.schema import relation_body
from csnd.reader.pgoutput import Relation, TypeMsg
from csnd.snapshot.copier import ChunkResult, NodeSnapshot
from csnd.snapshot.lines import changes_parts, done_line
from csnd.snapshot.plan import TableInfo, chunk_pages
from csnd.snapshot.progress import SnapshotProgress

if TYPE_CHECKING:
    from csnd.changelog import Changelog

# How often a waiting step looks at the stop flag.
POLL_S: Final = 0.5
# A progress line (INFO: with csnd -v) this often while copying, and at each table done: often
# enough that a long copy is seen moving, rare enough to leave the log readable.
PROGRESS_LOG_S: Final = 5.0

logger = logging.getLogger("csnd.snapshot")
# Finished chunks waiting to be appended, per copier: a bound on the rendered
# rows held in memory (each chunk up to CHUNK_ROWS rows).
RESULTS_PER_READER: Final = 2
# Chunk records appended before an fsync while more are ready: fewer fsyncs (each a disk round
# trip, tens of ms on a busy disk), against that many records written but not yet durable (and
# held in the changelog's pending buffer) -- a crash loses them, as any chunk not yet appended.
SYNC_CHUNKS: Final = 8


class SyncOver:
    """Put in the results queue when a sync behind the appends has ended.

    The run then shows the chunks it covered at once: it waits for the next
    chunk or this, never in the fsync while a chunk may come."""


FSYNCED: Final = SyncOver()


@dataclass(frozen=True)
class GtmCut:
    """The GTM commit barrier the nodes' snapshots were exported under (`csnd.gtm.barrier`).

    Every transaction with a CSN at most `csn` is in them, on every node, and
    none above: the completion record takes `csn` (when the chunks left room
    below it), so the stream resumes after it and drops what the snapshot holds.
    """

    csn: int
    held_ms: float  # how long the GTM was held: what a writer's commit may have waited


@dataclass
class SnapshotNode:
    """One node to snapshot: its readers and what its exported snapshot said."""

    reader: NodeSnapshot
    mode: str  # "single" or "gtm"
    made_at: int  # when the slot was made (µs since 2000-01-01): the records' commit_time
    gtm_cut: GtmCut | None = None  # exported under a GTM commit barrier (the same for every node)


class SnapshotRun:
    """Copies every node's snapshot into the changelog; `run()` returns the completion record's CSN."""

    def __init__(self, nodes: Sequence[SnapshotNode], progress: SnapshotProgress) -> None:
        self.nodes = list(nodes)
        self.progress = progress
        self._stop = threading.Event()
        size = max(1, sum(n.reader.settings.readers for n in self.nodes)) * RESULTS_PER_READER
        self._results: queue.Queue[ChunkResult | BaseException | tuple[str, int] | SyncOver] = queue.Queue(
            size
        )

    def stop(self) -> None:
        self._stop.set()
        for n in self.nodes:
            n.reader.close()

    def _put(self, item: ChunkResult | BaseException | tuple[str, int] | SyncOver) -> None:
        while not self._stop.is_set():
            try:
                self._results.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _wake_on_fsynced(self) -> None:
        # In the sync's thread, which must never block: when the queue is full, chunks are
        # waiting, and the run shows the sync when it starts the next one.
        with contextlib.suppress(queue.Full):
            self._results.put_nowait(FSYNCED)

    def _plan(self, node: SnapshotNode) -> None:
        """The node's planner thread: each table's chunks to the copiers as soon as it is cut."""
        reader = node.reader
        planned = 0
        try:
            for table in reader.plan_tables():
                chunks = reader.chunks(table)
                self.progress.add_table(
                    reader.node,
                    table.schema,
                    table.name,
                    reader.expected_rows(table),
                    len(chunks),
                    pages=reader.pages(table.relid),
                )
                for c in chunks:
                    reader.feed(c)
                planned += len(chunks)
            self._put((reader.node, planned))  # (this node's chunk count: its planning is over)
        except BaseException as e:  # (ends the run in its thread)
            self._put(e)
        finally:
            reader.feed(None)

    def run(self, log: Changelog) -> int:
        progress = self.progress
        progress.state = "running"
        lsns = {n.reader.node: n.reader.consistent_lsn for n in self.nodes}
        by_node = {n.reader.node: n for n in self.nodes}
        limit = min((n.reader.consistent_lsn for n in self.nodes if n.mode == "single"), default=None)
        next_csn = log.newest_csn + 1
        progress.first_csn = next_csn
        cut = next((n.gtm_cut for n in self.nodes if n.gtm_cut is not None), None)
        if cut is not None:
            progress.gtm_csn, progress.barrier_ms = cut.csn, round(cut.held_ms, 1)
        planned: dict[str, int] = {}
        described: set[tuple[str, int]] = set()  # (node, relid) whose relation version is kept
        appended = rows = 0
        tables_done = 0
        logged_at = time.monotonic()
        behind = SyncBehind(log, "csnd-snapshot-sync", on_fsynced=self._wake_on_fsynced)
        # Chunks appended since the last sync began: reported done (progress) once a sync shows them.
        unsynced_chunks: list[tuple[str, str, str, int, int, int]] = []

        def log_line() -> None:
            nonlocal logged_at
            logger.info("initial snapshot: %s", progress.summary())
            logged_at = time.monotonic()

        def log_when_due() -> None:
            # A line every PROGRESS_LOG_S while copying.
            if time.monotonic() - logged_at >= PROGRESS_LOG_S and progress.tables():
                log_line()

        def log_tables_done() -> None:
            # A line at each table done.  A table is done only when a sync shows its last
            # chunk, so only here: the count is taken once a chunk shown, not once appended.
            nonlocal tables_done
            done_now = sum(v.state == "done" for v in progress.tables())
            if done_now > tables_done:
                tables_done = done_now
                log_line()
            else:
                log_when_due()

        def shown(chunks: list[tuple[str, str, str, int, int, int]]) -> Callable[[], None]:
            def report() -> None:
                for node_name, schema, name, chunk_rows, pages, csn in chunks:
                    progress.chunk_done(node_name, schema, name, chunk_rows, pages=pages)
                    progress.last_csn = csn
                    log_tables_done()  # (a line at each table done, even in one sync's batch)

            return report

        try:
            for n in self.nodes:
                n.reader.on_chunk_start = lambda c, node=n.reader.node: progress.chunk_started(
                    node, c.table.schema, c.table.name
                )
                n.reader.start(self._put)
                logger.info(
                    "initial snapshot: copying the tables of node %s as of lsn %s",
                    n.reader.node,
                    lsn_to_str(n.reader.consistent_lsn),
                    extra={"node": n.reader.node, "lsn": n.reader.consistent_lsn},
                )
                threading.Thread(
                    target=self._plan, args=(n,), name=f"csnd-snapshot-plan-{n.reader.node}", daemon=True
                ).start()
            while len(planned) < len(self.nodes) or appended < sum(planned.values()):
                if unsynced_chunks and (len(unsynced_chunks) >= SYNC_CHUNKS or self._results.empty()):
                    # (decided here, before waiting, not after the append: what waits then may be no
                    # chunk -- a node's chunk count, a sync's end -- and the wait after it may be long)
                    behind.start(then=shown(unsynced_chunks))  # (its fsync goes on while chunks come)
                    unsynced_chunks = []
                try:
                    item = self._results.get(timeout=POLL_S)
                except queue.Empty:
                    behind.finish_if_over()  # (a wake-up lost to a full queue: shown at the latest now)
                    if self._stop.is_set():
                        raise SnapshotError("stopped before it was complete") from None
                    log_when_due()
                    continue
                if isinstance(item, SyncOver):
                    behind.finish_if_over()  # (shows the chunks it covered, without waiting for a chunk)
                    continue
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, tuple):
                    planned[item[0]] = item[1]
                    continue
                chunk, node = item.chunk, by_node[item.node]
                if limit is not None and next_csn >= limit:
                    raise SnapshotError(
                        f"the snapshot needs csn {next_csn}, which is not below the slot's consistent point "
                        "(the first csn the stream may use in single mode); use fewer, larger chunks "
                        "([snapshot] chunk_rows)",
                        node=item.node,
                        lsn=limit,
                    )
                t = chunk.table
                marker = {
                    "node": item.node,
                    "schema": t.schema,
                    "table": t.name,
                    "chunk": chunk.index,
                    "chunks": chunk.count,
                    "rows": item.rows,
                }
                parts = changes_parts(
                    next_csn, item.node, lsns[item.node], node.made_at, item.changes, marker
                )
                if (item.node, t.relid) not in described:
                    log.relations.add(next_csn, item.node, table_relation_body(t))
                    described.add((item.node, t.relid))
                log.append_parts(next_csn, parts)  # (not joined: a chunk is megabytes)
                pages = chunk_pages(chunk, node.reader.pages(t.relid))
                unsynced_chunks.append((item.node, t.schema, t.name, item.rows, pages, next_csn))
                next_csn += 1
                appended += 1
                rows += item.rows
                log_when_due()
            for n in self.nodes:
                n.reader.join()
            tables = sum(len(n.reader.tables) for n in self.nodes)
            made_at = max(n.made_at for n in self.nodes)
            done: dict[str, object] = {
                "nodes": sorted(lsns),
                "tables": tables,
                "rows": rows,
                "first_csn": progress.first_csn,
            }
            if cut is not None:
                # (at the barrier's csn: the stream resumes after it, past what the snapshot holds)
                next_csn = max(next_csn, cut.csn)
                done.update(gtm_csn=cut.csn, barrier_ms=round(cut.held_ms, 1))
            if unsynced_chunks:
                behind.start(then=shown(unsynced_chunks))
            behind.finish()  # (every chunk durable before the completion record is appended)
            log.append(next_csn, done_line(next_csn, lsns, made_at, done).encode("utf-8"))
            log.sync()
            progress.last_csn = next_csn
            progress.state = "complete"
            return next_csn
        except BaseException:
            progress.state = "failed"
            behind.abandon()
            raise
        finally:
            self.stop()


def table_relation_body(table: TableInfo) -> str:
    """The relation version a table's rows were rendered with (`decoder.schema.relation_body`)."""
    names: dict[int, tuple[str, str]] = {}
    body = ""
    for msg in table.relation_messages():
        if isinstance(msg, TypeMsg):
            names[msg.type_oid] = (msg.namespace, msg.name)
        elif isinstance(msg, Relation):
            body = relation_body(msg, names)
    return body
