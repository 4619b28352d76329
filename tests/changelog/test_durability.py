"""Changelog durability: a tailing reader sees each record once and only once it is durable; kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from csnd.changelog import Changelog
from tests.changelog.helpers import payload

CEILING = 120.0  # seconds: a generous bound on waiting for a state, never a timing assertion


def test_tailing_reader_sees_each_record_once_after_it_is_durable(tmp_path: Path) -> None:
    n = 3000
    log = Changelog(str(tmp_path), segment_bytes=8192, index_interval=512)
    seen: list[list[int]] = [[], []]
    early: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def tail(me: int) -> None:
        try:
            last = 0
            while last < n:
                if not log.wait_durable(last, CEILING):
                    raise AssertionError(f"nothing became durable after csn {last}")
                for csn, line in log.read(last):
                    durable = log.durable_csn
                    if csn > durable:
                        early.append((csn, durable))
                    assert line == payload(csn)
                    seen[me].append(csn)
                    last = csn
        except BaseException as e:
            errors.append(e)

    readers = [threading.Thread(target=tail, args=(i,)) for i in range(2)]
    for r in readers:
        r.start()
    for csn in range(1, n + 1):
        log.append(csn, payload(csn))
        if csn % 7 == 0 or csn == n:
            log.sync()
    for r in readers:
        r.join(CEILING)
    log._check()
    log.close()
    assert not errors and not early
    assert seen == [list(range(1, n + 1))] * 2  # each reader: every record, once, in order


def test_wait_durable_wakes_on_sync_and_close(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path))
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(log.wait_durable(0, CEILING)))
    t.start()
    log.append(1, b"a")
    log.sync()
    t.join(CEILING)
    assert woke == [True]
    t = threading.Thread(target=lambda: woke.append(log.wait_durable(1, CEILING)))
    t.start()
    log.close()
    t.join(CEILING)
    assert woke == [True, False] and not t.is_alive()


def test_wait_durable_ends_when_interrupted_and_woken(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path))
    stop = threading.Event()
    woke: list[bool] = []
    t = threading.Thread(target=lambda: woke.append(log.wait_durable(0, CEILING, stop.is_set)))
    t.start()
    stop.set()
    log.wake_waiters()
    t.join(CEILING)
    assert woke == [False] and not t.is_alive()  # (nothing durable: not a True)
    log.close()


_CHILD = textwrap.dedent(
    """
    import sys
    from csnd.changelog import Changelog
    from tests.changelog.helpers import payload

    log = Changelog(sys.argv[1], segment_bytes=20000, index_interval=1024)
    csn = log.durable_csn
    print(f"start {csn}", flush=True)
    while True:
        for _ in range(csn % 13 + 1):
            csn += 1
            log.append(csn, payload(csn))
        print(f"synced {log.sync()}", flush=True)
    """
)


@pytest.mark.parametrize("rounds", [4])
def test_kill_9_keeps_every_synced_record(tmp_path: Path, rounds: int) -> None:
    """A child appends and syncs in a loop and is SIGKILLed once it has synced records (and again,
    after reopening): the log always holds every CSN the child reported synced, as a gapless prefix."""
    root = str(Path(__file__).resolve().parents[2])  # (the repository)
    reported = 0
    for r in range(rounds):
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(tmp_path)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": root},
        )
        assert child.stdout is not None
        start = int(child.stdout.readline().split()[1])
        assert start >= reported  # the reopened log kept what was reported synced
        target = start + 500 + 300 * r  # wait for this state, not a time
        while True:
            line = child.stdout.readline()
            assert line, "the child died before syncing"
            reported = int(line.split()[1])
            if reported >= target:
                break
        child.send_signal(signal.SIGKILL)
        child.wait(CEILING)
        child.stdout.close()
        with Changelog(str(tmp_path), segment_bytes=20000, index_interval=1024) as log:
            log._check()
            got = list(log.read(0))
            assert [c for c, _ in got] == list(range(1, len(got) + 1))
            assert len(got) >= reported
            assert all(line == payload(c) for c, line in got)
            reported = len(got)
    assert reported > 500 * rounds


_UNSYNCED_CHILD = textwrap.dedent(
    """
    import sys
    from csnd.changelog import Changelog
    from tests.changelog.helpers import payload

    log = Changelog(sys.argv[1], segment_bytes=2000, index_interval=256)
    for csn in range(1, 21):
        log.append(csn, payload(csn))
    log.sync()
    for csn in range(21, 121):  # (rolls over to new segments)
        log.append(csn, payload(csn))
    log.begin_sync()  # written, in the page cache only: the fsync never comes
    print("written", flush=True)
    sys.stdin.read()
    """
)


def test_reopening_after_kill_9_fsyncs_what_it_adopts_before_calling_it_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After kill -9 the unsynced writes survive in the page cache and a reopen adopts them: it must
    fsync them (and the directory entries of the segments they created) before counting them durable,
    or slots confirmed from that durable CSN lose those transactions in an OS crash."""
    root = str(Path(__file__).resolve().parents[2])  # (the repository)
    child = subprocess.Popen(
        [sys.executable, "-c", _UNSYNCED_CHILD, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root},
    )
    assert child.stdout is not None and child.stdin is not None
    try:
        assert child.stdout.readline() == "written\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(CEILING)
        child.stdout.close()
        child.stdin.close()

    fsynced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    log = Changelog(str(tmp_path), segment_bytes=2000, index_interval=256)
    monkeypatch.undo()
    try:
        assert log.durable_csn == 120  # (the unsynced records were adopted: kill -9 is no OS crash)
        directory = os.path.realpath(str(tmp_path))
        names = [n for n in os.listdir(directory) if n.endswith(".log")]
        assert len(names) > 2
        for name in names:
            assert os.path.join(directory, name) in fsynced, f"{name} adopted as durable without an fsync"
        assert directory in fsynced, "the segments' directory entries adopted without an fsync"
        assert log.fsyncs == 0  # (Status counts the group commit's fsyncs only)
    finally:
        log.close()
