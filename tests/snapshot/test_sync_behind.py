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
from csnd.snapshot.copier import SnapshotSettings
from csnd.snapshot.progress import SnapshotProgress
from csnd.snapshot.run import SnapshotNode, SnapshotRun
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
            SnapshotRun([SnapshotNode(reader, "single", made_at)], SnapshotProgress()).run(log)
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
