"""The initial snapshot goes on appending chunks while the disk syncs the ones before."""

from __future__ import annotations

import errno
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from csnd.changelog import Changelog, SyncBehind
from csnd.changelog.sync import SyncPoint
from csnd.core.errors import CsndError
from csnd.reader.live import LiveOptions, LiveSource
from csnd.snapshot.copier import ChunkResult, NodeSnapshot, SnapshotSettings
from csnd.snapshot.progress import SnapshotProgress
from csnd.snapshot.run import SnapshotNode, SnapshotRun, SyncOver
from tests.changelog.helpers import FailingDisk
from tests.fixtures.pg import PgDatabase
from tests.snapshot.test_copyproc import _reader_of

CEILING_S = 60.0  # a bound on waiting for a state, never a timing assertion


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CEILING_S
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _run_behind(run: SnapshotRun, log: Changelog) -> tuple[threading.Thread, list[BaseException]]:
    """`run.run(log)` started in a thread of its own; what it raised lands in the list."""
    failures: list[BaseException] = []

    def take() -> None:
        try:
            run.run(log)
        except BaseException as e:
            failures.append(e)

    runner = threading.Thread(target=take, daemon=True)
    runner.start()
    return runner, failures


class _HeldFirstFsync(Changelog):
    """A changelog whose first fsync waits for the test's word; it notes how far appends had gone then."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.in_first = threading.Event()
        self.release = threading.Event()
        self.appended_then = 0
        self.calls = 0

    def appended(self) -> int:
        return self._writer.appended_csn

    def fsync(self, point: SyncPoint) -> None:
        self.calls += 1
        if self.calls == 1:
            self.appended_then = self.appended()
            self.in_first.set()
            assert self.release.wait(CEILING_S)
        super().fsync(point)


class _ChunksAfterTheFirstSync(SnapshotRun):
    """A run whose copiers hand over their chunks after the first only once its first fsync is under way.

    So the run has found no chunk waiting when that sync began, and the
    next ones come while its fsync is held: the case where a run that waits
    for the sync as soon as nothing is waiting stands still."""

    def __init__(self, nodes: list[SnapshotNode], log: _HeldFirstFsync) -> None:
        super().__init__(nodes, SnapshotProgress())
        self._log = log
        self._first_put = threading.Event()

    def _put(self, item: ChunkResult | BaseException | tuple[str, int] | SyncOver) -> None:
        if isinstance(item, ChunkResult):
            if self._first_put.is_set():
                assert self._log.in_first.wait(CEILING_S), "the snapshot never synced"
                time.sleep(0.05)  # (the run is waiting by then, on whatever it waits on)
            self._first_put.set()
        super()._put(item)


def test_chunks_are_appended_while_the_last_ones_are_synced(pg: PgDatabase, tmp_path: Path) -> None:
    with pg.connect() as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO item SELECT i, 'v' || i FROM generate_series(1, 20000) AS i")
        conn.execute("CREATE PUBLICATION snap_pub FOR TABLE item")
    reader, made_at = _reader_of(pg, SnapshotSettings(chunk_rows=1000, readers=2, split="key"))
    log = _HeldFirstFsync(str(tmp_path))
    runner, failures = _run_behind(
        _ChunksAfterTheFirstSync([SnapshotNode(reader, "single", made_at)], log), log
    )
    try:
        assert log.in_first.wait(CEILING_S), "the snapshot never synced"
        # (waited for in the run's thread, the fsync held every append behind it)
        _until(lambda: log.appended() > log.appended_then, "no chunk was appended while the first fsync ran")
        assert log.newest_csn < log.appended()  # (shown to readers only once their sync is over)
    finally:
        log.release.set()
        runner.join(CEILING_S)
    try:
        assert not runner.is_alive() and not failures, failures
        lines = [json.loads(line) for _, line in log.read(0)]
    finally:
        log.close()
    ids = sorted(c["new"]["id"] for line in lines for c in line["changes"])
    assert ids == list(range(1, 20001))
    assert lines[-1]["snapshot"].get("done") is True


def test_a_sync_that_failed_behind_is_raised_at_the_next(tmp_path: Path) -> None:
    log = FailingDisk(str(tmp_path), OSError(errno.EIO, "Input/output error", "0000000000000001.log"))
    behind = SyncBehind(log)
    try:
        log.append(1, b'{"csn": 1}')
        behind.start()  # (the failure comes in the other thread)
        with pytest.raises(CsndError, match="Input/output error"):
            behind.finish()
        assert log.newest_csn == 0
    finally:
        behind.abandon()
        log.close()


def test_syncs_behind_show_what_each_covered(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        behind = SyncBehind(log)
        log.append(1, b'{"csn": 1}')
        behind.start()
        log.append(2, b'{"csn": 2}')
        behind.start()  # (the first is finished first: shown)
        assert log.newest_csn >= 1
        behind.finish()
        assert log.newest_csn == 2
        behind.finish()  # (nothing under way: nothing to do)
        assert log.fsyncs == 2


def test_a_sync_over_is_told_and_shown_without_waiting(tmp_path: Path) -> None:
    told = threading.Event()
    log = _HeldFirstFsync(str(tmp_path))
    behind = SyncBehind(log, on_fsynced=told.set)
    try:
        log.append(1, b'{"csn": 1}')
        behind.start()
        assert log.in_first.wait(CEILING_S)
        assert not behind.finish_if_over()  # (its fsync is held: not waited for)
        assert behind.busy and log.newest_csn == 0
        log.release.set()
        assert told.wait(CEILING_S)
        assert behind.finish_if_over()
        assert not behind.busy and log.newest_csn == 1
        assert behind.finish_if_over()  # (nothing under way)
    finally:
        log.release.set()
        behind.abandon()
        log.close()


def _node_reader(pg: PgDatabase, node: str, publication: str) -> SnapshotNode:
    source = LiveSource(node, LiveOptions(pg.dsn, f"slot_{node}", publication, create_slot=True))
    exported = source.prepare("initial")
    assert exported is not None
    settings = SnapshotSettings(chunk_rows=1000, readers=1, split="key")
    reader = NodeSnapshot(
        node, pg.dsn, publication, exported.consistent_lsn, binary=True, enums=[], settings=settings
    )
    try:
        reader.open(exported.name)
    finally:
        exported.release()
    return SnapshotNode(reader, "single", exported.made_at)


class _ChunksThenTheirCount(SnapshotRun):
    """A run that gets dn1's chunks and then its chunk count at once, the count behind the last chunk.

    So when dn1's last chunk is appended, something other than a chunk is
    waiting in the queue, and then nothing comes while dn2's planning waits."""

    def __init__(self, nodes: list[SnapshotNode]) -> None:
        super().__init__(nodes, SnapshotProgress())
        self._held: list[ChunkResult] = []
        self._count: tuple[str, int] | None = None
        self._lock = threading.Lock()

    def _put(self, item: ChunkResult | BaseException | tuple[str, int] | SyncOver) -> None:
        if isinstance(item, ChunkResult) and item.node == "dn1":
            with self._lock:
                self._held.append(item)
            self._flush_when_whole()
        elif isinstance(item, tuple) and item[0] == "dn1":
            with self._lock:
                self._count = item
            self._flush_when_whole()
        else:
            super()._put(item)

    def _flush_when_whole(self) -> None:
        with self._lock:
            count = self._count
            if count is None or len(self._held) < count[1]:
                return
            items: list[ChunkResult | tuple[str, int]] = [*self._held, count]
            self._held = []
        for held in items:  # (in one go: the run is woken by the first)
            super()._put(held)


def test_chunks_appended_before_a_long_wait_are_synced_and_shown(pg: PgDatabase, tmp_path: Path) -> None:
    with pg.connect() as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO item SELECT i, 'v' || i FROM generate_series(1, 2500) AS i")
        conn.execute("CREATE TABLE held (id int PRIMARY KEY)")
        conn.execute("INSERT INTO held SELECT generate_series(1, 10)")
        conn.execute("ANALYZE item")
        conn.execute("ANALYZE held")
        conn.execute("CREATE PUBLICATION pub_items FOR TABLE item")
        conn.execute("CREATE PUBLICATION pub_held FOR TABLE held")
    nodes = [_node_reader(pg, "dn1", "pub_items"), _node_reader(pg, "dn2", "pub_held")]
    run = _ChunksThenTheirCount(nodes)
    with pg.connect(autocommit=False) as blocker, Changelog(str(tmp_path)) as log:
        blocker.execute("LOCK TABLE held IN ACCESS EXCLUSIVE MODE")  # (dn2's planning waits for it)
        runner, failures = _run_behind(run, log)
        try:
            _until(
                lambda: any(t.node == "dn1" and t.state == "done" for t in run.progress.tables()),
                "dn1's chunks shown done while dn2 waits",
            )
            assert log.newest_csn >= 3  # (its three chunks durable and shown to readers)
        finally:
            blocker.rollback()
            runner.join(CEILING_S)
        assert not runner.is_alive() and not failures, failures
