"""Retention by age when the wall clock jumps: nothing dropped early, nothing held forever.

The changelog's record times and retention by hours are wall time (they
outlive the process), but the system clock can be set forward or back while
the service runs.  The injected wall clock jumps here; the injected
monotonic clock is the time that really passed.
"""

from __future__ import annotations

from pathlib import Path

from csnd.changelog import Changelog
from csnd.changelog import record as rec
from csnd.changelog.clock import CLOCK_NAME, SteadyWall
from tests.changelog.helpers import FakeClock

HOUR = 3600.0


def _fill(log: Changelog, first: int, n: int) -> None:
    for c in range(first, first + n):
        log.append(c, b"r" * 200)
        log.sync()


def _times(path: Path) -> list[int]:
    """The append time of every record of every segment, in order."""
    times: list[int] = []
    for name in sorted(p.name for p in path.iterdir() if p.suffix == ".log"):
        seg_path = str(path / name)
        with open(seg_path, "rb") as f:
            data = f.read()
        off = rec.SEGMENT_HEAD
        while off < len(data):
            status, _csn, t, off, *_ = rec.frame_at(data, off)
            assert status == rec.OK
            times.append(t)
    return times


def test_a_wall_clock_set_forward_drops_nothing_early(tmp_path: Path) -> None:
    wall, mono = FakeClock(), FakeClock(100.0)
    with Changelog(str(tmp_path), segment_bytes=500, retention_hours=1.0, clock=wall, monotonic=mono) as log:
        _fill(log, 1, 20)
        segments = log.segment_count
        assert segments > 2
        wall.now += 10 * 24 * HOUR  # set forward ten days; a second really passes
        mono.now += 1
        assert log.apply_retention() == 0
        assert log.segment_count == segments and log.oldest_csn == 1
        mono.now += 2 * HOUR  # two hours really pass: now the old segments go
        assert log.apply_retention() > 0
        assert log.segment_count == 1
        log._check()


def test_a_wall_clock_set_back_neither_holds_retention_nor_reorders_times(tmp_path: Path) -> None:
    wall, mono = FakeClock(), FakeClock(100.0)
    with Changelog(str(tmp_path), segment_bytes=500, retention_hours=1.0, clock=wall, monotonic=mono) as log:
        _fill(log, 1, 10)
        wall.now -= 10 * 24 * HOUR  # set back ten days
        mono.now += 1
        _fill(log, 11, 10)
        segments = log.segment_count
        mono.now += 2 * HOUR
        _fill(log, 21, 1)
        assert log.apply_retention() > 0  # two hours passed: the old segments are old
        assert log.segment_count < segments
        log._check()
    times = _times(tmp_path)
    assert times == sorted(times)  # append times never go backwards


# Across a restart on the same boot the injected monotonic clock runs on, as the kernel's does.


def test_a_wall_clock_set_forward_across_a_restart_drops_nothing_early(tmp_path: Path) -> None:
    wall, mono = FakeClock(), FakeClock(100.0)
    kw = {"segment_bytes": 500, "retention_hours": 1.0, "clock": wall, "monotonic": mono}
    with Changelog(str(tmp_path), **kw) as log:  # type: ignore[arg-type]
        _fill(log, 1, 20)
        segments = log.segment_count
    wall.now += 10 * 24 * HOUR  # set forward ten days while the service is down for a second
    mono.now += 1
    with Changelog(str(tmp_path), **kw) as log:  # type: ignore[arg-type]
        assert log.apply_retention() == 0
        assert log.segment_count == segments and log.oldest_csn == 1
        mono.now += 2 * HOUR
        assert log.apply_retention() > 0
        assert log.segment_count == 1


def test_a_wall_clock_set_back_across_a_restart_neither_holds_retention_nor_reorders_times(
    tmp_path: Path,
) -> None:
    wall, mono = FakeClock(), FakeClock(100.0)
    kw = {"segment_bytes": 500, "retention_hours": 1.0, "clock": wall, "monotonic": mono}
    with Changelog(str(tmp_path), **kw) as log:  # type: ignore[arg-type]
        _fill(log, 1, 10)
    wall.now -= 10 * 24 * HOUR
    mono.now += 1
    with Changelog(str(tmp_path), **kw) as log:  # type: ignore[arg-type]
        _fill(log, 11, 10)
        segments = log.segment_count
        mono.now += 2 * HOUR
        _fill(log, 21, 1)
        assert log.apply_retention() > 0  # two hours passed: the old segments are old
        assert log.segment_count < segments
    times = _times(tmp_path)
    assert times == sorted(times)


def test_after_a_reboot_the_wall_clock_is_taken_but_never_before_the_newest_record(tmp_path: Path) -> None:
    anchor = str(tmp_path / CLOCK_NAME)
    wall, mono = FakeClock(), FakeClock(100.0)
    first = SteadyWall(wall, mono)
    first.resume(anchor, "boot-1", 0)
    mono.now += 50
    newest_us = int(first() * 1_000_000)
    # same boot, the wall clock set back an hour: the anchor's time goes on
    wall.now -= HOUR
    same = SteadyWall(wall, mono)
    same.resume(anchor, "boot-1", newest_us)
    assert same() == first()
    # another boot (its monotonic clock starts again): the wall clock, but not before the newest record
    rebooted_mono = FakeClock(5.0)
    later = SteadyWall(wall, rebooted_mono)
    later.resume(anchor, "boot-2", newest_us)
    assert int(later() * 1_000_000) == newest_us
    rebooted_mono.now += 10
    assert later() == newest_us / 1_000_000 + 10
    # and one whose wall clock is ahead takes it (a forward jump while down looks like time passed)
    wall.now += 5 * HOUR
    ahead = SteadyWall(wall, FakeClock(1.0))
    ahead.resume(anchor, "boot-3", newest_us)
    assert ahead() == wall.now
