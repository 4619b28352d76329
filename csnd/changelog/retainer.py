"""Applying retention: the plan of retention.py carried out on the segments, the view and the files.

    holders() ─► {holder: csn} ─┐
    segments' sizes, times ─────┼─► retention.plan ─► drop the oldest `drop` segments:
    limits, steady clock now ───┘     writer's list, then the reader view, then unlink + dir fsync;
                                      a warning naming every holder passed

retention.py decides (pure); this module does it, on the writer thread.
The segments leave the reader view before their files are unlinked, so a
new reader never starts on a file about to go; one already reading it gets
OUT_OF_RANGE when the file is gone (csnd.changelog.view).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType

from csnd.changelog import retention
from csnd.changelog import segment as sg
from csnd.changelog.view import ReaderView
from csnd.changelog.writer import SegmentWriter
from csnd.core.durable import sync_directory

Holder = Callable[[], Mapping[str, int]]


class Retainer:
    """Drops whole old segments past the limits, keeping what holders still need up to the hold limits."""

    def __init__(
        self,
        writer: SegmentWriter,
        view: ReaderView,
        *,
        limits: Callable[[], retention.Limits],
        clock: Callable[[], float],
        guard: Callable[[Callable[[], None]], None],
    ) -> None:
        self._writer = writer
        self._view = view
        self._limits = limits
        self._clock = clock
        self._guard = guard
        # What consumers still need holds retention (csnd.changelog.retention):
        # each holder is asked at every pass, so a mark that moved is seen there.
        self._holders: tuple[Holder, ...] = ()
        # holder -> bytes retention would have dropped but keeps for it, as of the last pass
        self.held: Mapping[str, int] = MappingProxyType({})

    def add_holder(self, holds: Holder) -> None:
        self._holders = (*self._holders, holds)

    def remove_holder(self, holds: Holder) -> None:
        self._holders = tuple(h for h in self._holders if h != holds)

    def apply(self) -> int:
        """One pass: drop what the plan drops (never the active segment); returns bytes freed."""
        holds: dict[str, int] = {}
        for holder in self._holders:
            holds.update(holder())
        segs = self._writer.segments
        infos = [retention.SegmentInfo(s.last_csn, s.written, s.last_time, s.end == s.written) for s in segs]
        limits = self._limits()
        p = retention.plan(infos, limits, int(self._clock() * 1_000_000), holds)
        self.held = MappingProxyType(dict(p.held))
        drop = p.drop
        if not drop:
            return 0
        gone, keep = segs[:drop], segs[drop:]
        _warn_passed(p.passed, gone, keep, limits)
        self._writer.segments = keep
        self._view.retire(keep, max(s.last_csn for s in gone))

        def unlink() -> None:
            for seg in gone:
                os.unlink(seg.path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(seg.index_path)
            sync_directory(keep[0].path)

        self._guard(unlink)
        return sum(seg.written for seg in gone)


def _warn_passed(
    passed: Mapping[str, int], gone: list[sg.Segment], keep: list[sg.Segment], limits: retention.Limits
) -> None:
    for who, csn in sorted(passed.items()):
        sg.log.warning(
            "changelog: retention dropped the records through csn %d that %s had not read (it is at "
            "csn %d): the changelog was past its hold limits (retention_hold_bytes %s, retention_hold_hours "
            "%s); its next read is refused as out of range (the oldest retained csn is now %d)",
            gone[-1].last_csn,
            who,
            csn,
            limits.hold_bytes,
            None if limits.hold_age_us is None else f"{limits.hold_age_us / 3.6e9:g}",
            keep[0].first_csn,
        )
