"""The group commit's fsync: what one covers (`SyncPoint`), and making it durable.

    writer: begin_sync ─► SyncPoint ─► Fsyncer.fsync (slow, no lock) ─► view: finish_sync
            (pending written,           sealed segments, the active       (readers shown what
             what is new noted)         one, then the directory           the point covered)

`Changelog.sync()` runs the three steps in a row; the service's sink runs
the middle one on its own thread, so appends go on while the disk works
(one fsync pays for every record that piled up meanwhile).  The order of
the fsyncs is what a power loss may tear: a rolled-over segment before the
active one, and the directory last, once a new segment's entry is in it
(tests/changelog/test_power_loss.py holds every crash point to it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from csnd.changelog import segment as sg
from csnd.core.durable import sync_directory


@dataclass
class SyncPoint:
    """What one fsync covers: begin_sync notes it, fsync makes it durable, finish_sync shows it."""

    sealed_fds: list[int]  # rolled-over segments, closed once fsynced
    fd: int  # the segment being appended to at begin_sync
    directory_of: str | None  # a new segment's path, when the directory needs an fsync
    # (segment, bytes written, last csn, its time, index entries) at begin_sync
    segments: list[tuple[sg.Segment, int, int, int, int]]
    csns: list[int]  # of the records it covers, in order
    lines: list[bytes | None]  # their payloads (None: one appended in pieces)


def fsync_covered(point: SyncPoint) -> None:
    """fsync (and close) the sealed segments, then the active one, then the directory when it changed."""
    for fd in point.sealed_fds:
        os.fsync(fd)
        os.close(fd)
    point.sealed_fds = []
    os.fsync(point.fd)
    if point.directory_of is not None:
        sync_directory(point.directory_of)


class Fsyncer:
    """Makes sync points durable, through the changelog's guard, and counts the fsyncs for Status."""

    __slots__ = ("_guard", "fsyncs", "fsync_seconds_total", "last_fsync_seconds")

    def __init__(self, guard: Callable[[Callable[[], None]], None]) -> None:
        self._guard = guard
        # The fsyncs of sync(), for Status: how many, their total and the last's seconds.
        self.fsyncs = 0
        self.fsync_seconds_total = 0.0
        self.last_fsync_seconds = 0.0

    def fsync(self, point: SyncPoint) -> None:
        """Makes what `point` covers durable (the segments appended to, then a new one's directory)."""
        started = time.monotonic()
        self._guard(lambda: fsync_covered(point))
        took = time.monotonic() - started
        self.fsyncs += 1
        self.fsync_seconds_total += took
        self.last_fsync_seconds = took
