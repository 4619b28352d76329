"""Changelog durability: a tailing reader sees each record once and only once it is durable; kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from csnd.coordinator.changelog import Changelog
from tests.coordinator.changelog_helpers import payload

CEILING = 120.0  # seconds: a generous bound on waiting for a state, never a timing assertion


def test_tailing_reader_sees_each_record_once_after_it_is_durable(tmp_path: str) -> None:
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


def test_wait_durable_wakes_on_sync_and_close(tmp_path: str) -> None:
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


_CHILD = textwrap.dedent(
    """
    import sys
    from csnd.coordinator.changelog import Changelog
    from tests.coordinator.changelog_helpers import payload

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
def test_kill_9_keeps_every_synced_record(tmp_path: str, rounds: int) -> None:
    """A child appends and syncs in a loop and is SIGKILLed once it has synced records (and again,
    after reopening): the log always holds every CSN the child reported synced, as a gapless prefix."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
