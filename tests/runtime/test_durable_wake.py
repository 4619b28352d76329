"""The group commit's end wakes the merger only when something ended that no sync was asked for."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path

from csnd.changelog import Changelog
from csnd.changelog.sync import SyncPoint
from csnd.core.ids import Csn, Lsn, Xid
from csnd.runtime.items import EndItem, TxnItem
from csnd.runtime.merger import DurableWake, Merger
from csnd.sender.txn import FinishedTxn
from csnd.service.sink import ChangelogSink
from tests.changelog.helpers import FailingDisk
from tests.runtime.queued import QueuedInput


def _txn(k: int) -> FinishedTxn:
    csn = 10 * (k + 1)
    changes = [(0, 0x100 + k, f'"lsn": "0/{k:X}", "body": "t{k}"')]
    return FinishedTxn("dn1", Csn(csn), None, Xid(700 + k), Lsn(0x900 + csn), Lsn(0x910 + csn), 5, changes, 1)


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30  # a ceiling for a stalled run, not a timing goal
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_a_sync_that_covered_everything_does_not_wake_the_merger(tmp_path: Path) -> None:
    """Live, one transaction and then silence: the merger asks for its sync once, and the sync's end,
    with nothing ended since, does not wake the merger for a round that would find nothing."""
    txn = _txn(0)
    log = Changelog(str(tmp_path / "changelog"))
    sink = ChangelogSink(log)
    sink.start()
    node = QueuedInput("dn1", "single", [TxnItem(txn, txn.end_lsn)])
    merger = Merger([node], sink, confirm_interval_s=3600.0, durable_always=True)
    wake = merger.durable_wake
    runner = threading.Thread(target=merger.run, daemon=True)
    runner.start()
    try:
        _until(lambda: wake.passed + wake.dropped >= 1, "the sync never finished")
        assert log.durable_csn == txn.csn
        assert (wake.passed, wake.dropped) == (0, 1)
    finally:
        node.out.put_many([EndItem()])
        runner.join(timeout=60)
        sink.stop()
        log.close()
    assert not runner.is_alive()


class _HeldFsync(Changelog):
    """A changelog whose fsyncs wait for the test's word, so appends land while one is under way."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.entered = threading.Event()
        self.release = threading.Event()

    def fsync(self, point: SyncPoint) -> None:
        self.entered.set()
        assert self.release.wait(30)
        super().fsync(point)


def test_a_transaction_ended_during_a_sync_wakes_the_merger_and_is_made_durable(tmp_path: Path) -> None:
    """The second transaction ends while the first one's sync is under way, so the merger cannot ask
    for it then: the sync's end must wake the merger, which asks, and the second becomes durable
    with the source silent and no timer due."""
    first, second = _txn(0), _txn(1)
    log = _HeldFsync(str(tmp_path / "changelog"))
    sink = ChangelogSink(log)
    sink.start()
    node = QueuedInput("dn1", "single", [TxnItem(first, first.end_lsn)])
    merger = Merger([node], sink, confirm_interval_s=3600.0, durable_always=True)
    wake = merger.durable_wake
    runner = threading.Thread(target=merger.run, daemon=True)
    runner.start()
    try:
        assert log.entered.wait(30), "the first sync never started"
        node.out.put_many([TxnItem(second, second.end_lsn)])
        merger.wakeup.set()
        _until(lambda: sink.transactions == 2, "the second transaction was never appended")
        log.release.set()
        _until(lambda: (log.durable_csn or 0) >= second.csn, "the second transaction never became durable")
        assert wake.passed >= 1
    finally:
        log.release.set()
        node.out.put_many([EndItem()])
        runner.join(timeout=60)
        sink.stop()
        log.close()
    assert not runner.is_alive()
    assert isinstance(wake, DurableWake)


def test_a_failed_sync_wakes_the_merger_which_ends_with_it(tmp_path: Path) -> None:
    """The sync's failure passes the wake (nothing ended since the ask, yet the merger must look)."""
    txn = _txn(0)
    log = FailingDisk(
        str(tmp_path / "changelog"), OSError(errno.ENOSPC, "No space left on device", "0000000000000001.log")
    )
    sink = ChangelogSink(log)
    sink.start()
    node = QueuedInput("dn1", "single", [TxnItem(txn, txn.end_lsn)])
    merger = Merger([node], sink, confirm_interval_s=3600.0, durable_always=True)
    wake = merger.durable_wake
    failures: list[BaseException] = []

    def run() -> None:
        try:
            merger.run()
        except BaseException as e:
            failures.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        runner.join(timeout=60)
        assert not runner.is_alive(), "the merger went on after its sync failed"
        assert len(failures) == 1 and "No space left on device" in str(failures[0])
        assert sink.failed and wake.passed >= 1
    finally:
        node.out.put_many([EndItem()])
        sink.stop()
        log.close()
