"""The service's changelog sink: a group commit on its own thread that never stops the appends."""

from __future__ import annotations

import errno
import threading
import tracemalloc
from pathlib import Path

import pytest

from csnd.changelog import DEFAULT_INDEX_INTERVAL, DEFAULT_SEGMENT_BYTES, Changelog
from csnd.changelog.sync import SyncPoint
from csnd.core.errors import CsndError
from csnd.service.sink import ChangelogSink

CEILING = 60.0  # seconds: a bound on waiting for a state, never a timing assertion


class SlowDisk(Changelog):
    """A changelog whose fsync waits until the test lets it go (a disk busy with someone else's writes)."""

    def __init__(
        self,
        directory: str,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        index_interval: int = DEFAULT_INDEX_INTERVAL,
    ) -> None:
        super().__init__(directory, segment_bytes=segment_bytes, index_interval=index_interval)
        self.in_fsync = threading.Event()
        self.release = threading.Event()
        self.fail_with: OSError | None = None

    def fsync(self, point: SyncPoint) -> None:
        self.in_fsync.set()
        assert self.release.wait(CEILING)
        if self.fail_with is not None:

            def fail() -> None:
                raise self.fail_with  # type: ignore[misc]

            self._guard(fail)
        super().fsync(point)


def line(csn: int) -> str:
    pad = "y" * (csn * 13 % 200)
    return f'{{"csn": {csn}, "pad": "{pad}"}}'


def _wait(cond: threading.Condition, pred: object) -> None:
    with cond:
        assert cond.wait_for(pred, CEILING)  # type: ignore[arg-type]


def test_appends_go_on_while_a_sync_waits_for_the_disk(tmp_path: Path) -> None:
    log = SlowDisk(str(tmp_path), segment_bytes=600, index_interval=128)  # (segments roll during the sync)
    sink = ChangelogSink(log)
    sink.start()
    try:
        sink.end_transaction(1, line(1))
        first = sink.request_durable()
        assert log.in_fsync.wait(CEILING)

        def append_more() -> None:
            for c in range(2, 40):
                sink.end_transaction(c, line(c))

        appender = threading.Thread(target=append_more)
        appender.start()
        appender.join(CEILING)
        assert not appender.is_alive(), "an append waited for the fsync"
        assert sink.durable_ticket < first and log.durable_csn == 0  # nothing shown before the fsync ends
        second = sink.request_durable()  # (asked while the first sync is still on the disk)

        log.release.set()
        _wait(sink._changed, lambda: sink.durable_ticket >= first)
        # The first sync covers what was appended before it began, and only that.
        assert log.durable_csn in (1, 39)  # (39: the second sync may already have finished)
        _wait(sink._changed, lambda: sink.durable_ticket >= second)
        assert log.durable_csn == 39
        sink.end_transaction(40, line(40))
        sink.make_durable()
        assert log.durable_csn == 40
    finally:
        log.release.set()
        sink.stop()
        log.close()
    with Changelog(str(tmp_path)) as again:
        got = list(again.read(0))
    assert got == [(c, line(c).encode()) for c in range(1, 41)]
    assert len(list(tmp_path.glob("*.log"))) > 5


def test_a_failed_fsync_reaches_the_writer_as_one_clear_error(tmp_path: Path) -> None:
    log = SlowDisk(str(tmp_path))
    log.fail_with = OSError(errno.EIO, "Input/output error", "0000000000000001.log")
    log.release.set()
    sink = ChangelogSink(log)
    sink.start()
    try:
        sink.end_transaction(1, line(1))
        with pytest.raises(
            CsndError, match=r"cannot write .*Input/output error \(EIO\); .*restart the service"
        ):
            sink.make_durable()
        with pytest.raises(CsndError, match="Input/output error"):  # (and every later request)
            sink.request_durable()
        assert log.durable_csn == 0
    finally:
        sink.stop()
        log.close()


def test_without_the_thread_a_request_syncs_at_once(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        sink = ChangelogSink(log)
        sink.end_transaction(1, line(1))
        ticket = sink.request_durable()
        assert sink.durable_ticket == ticket and log.durable_csn == 1
        sink.start()
        sink.end_transaction(2, line(2))
        sink.make_durable()
        sink.stop()
        assert log.durable_csn == 2 and sink.transactions == 2 and sink.ended == 2
        # (Status and /metrics show the group commit's fsyncs: a slow disk shows there first)
        assert log.fsyncs == 2 and log.fsync_seconds_total >= log.last_fsync_seconds > 0


def test_a_large_transaction_is_appended_as_it_comes_never_gathered(tmp_path: Path) -> None:
    """30 MB of parts through a sink that streams past 1 MB: the sink holds a few MB at most."""
    part = '{"new": {"v": "' + "q" * 500_000 + '"}}, '
    with Changelog(str(tmp_path)) as log:
        sink = ChangelogSink(log, stream_over=1 << 20)
        sink.start()
        sink.start_transaction(1)
        sink.end_transaction(1, line(1))
        tracemalloc.start()
        try:
            sink.start_transaction(2)
            sink.write('{"csn": 2, "changes": [')
            for _ in range(60):
                sink.write(part)
            sink.end_transaction(2, "{}]}")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        sink.start_transaction(3)
        sink.end_transaction(3, line(3))
        sink.make_durable()
        sink.stop()
        # Gathered up to stream_over, then joined and encoded once (about 3 MB); a line
        # gathered whole would be 30 MB of text, and its bytes 30 MB more.
        assert peak < 8 << 20, peak
        got = dict(log.read(0))
        assert got[2] == ('{"csn": 2, "changes": [' + part * 60 + "{}]}").encode()
        assert (got[1], got[3]) == (line(1).encode(), line(3).encode())
        assert (sink.transactions, sink.bytes_out) == (3, sum(map(len, got.values())))


def test_a_large_transaction_held_from_before_a_restart_is_dropped_unread(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.append(5, b'{"csn": 5}')
        log.sync()
        sink = ChangelogSink(log, stream_over=100)
        sink.start_transaction(5)  # (re-sent by its source: the changelog has it)
        for _ in range(10):
            sink.write("x" * 60)
        assert sink._parts == []
        sink.end_transaction(5, "]}")
        sink.start_transaction(6)
        for _ in range(10):
            sink.write("x" * 60)
        sink.end_transaction(6, "]}")
        sink.make_durable()
        assert list(log.read(0)) == [(5, b'{"csn": 5}'), (6, b"x" * 600 + b"]}")]
        assert (sink.skipped, sink.transactions) == (1, 1)
