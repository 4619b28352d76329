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
from csnd.snapshot.copier import ChunkResult, SnapshotSettings
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
    failures: list[BaseException] = []

    def run() -> None:
        try:
            _ChunksAfterTheFirstSync([SnapshotNode(reader, "single", made_at)], log).run(log)
        except BaseException as e:
            failures.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
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
