"""Opening a changelog directory: its segments found, checked as a chain, and made durable.

    DIR/*.log ─► names parsed, sorted by sequence ─► gaps refused
             ─► each sealed segment scanned (segment.open_sealed), the last one's torn tail cut
                (segment.open_last), each naming the one before it ─► fsync of them all, then DIR

As etcd's WAL does on open (`Repair`), the newest segment is read whole
and cut after its last good record; an older one that does not end where
the next begins is damage no open can repair, and is refused with the
file and offset.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from csnd.changelog import record as rec
from csnd.changelog import segment as sg
from csnd.changelog.sync import SyncPoint, fsync_covered
from csnd.core.durable import sync_directory
from csnd.core.errors import ChangelogCorrupt


def open_segments(directory: str, interval: int) -> list[sg.Segment]:
    """The segments of `directory`, oldest first, each checked against the one before it."""
    found: list[tuple[int, int, str]] = []
    for name in os.listdir(directory):
        parsed = rec.parse_segment_name(name)
        if parsed is not None:
            found.append((*parsed, name))
    found.sort()
    for (s1, _, _), (s2, _, n2) in itertools.pairwise(found):
        if s2 != s1 + 1:
            what = f"segments {s1 + 1} to {s2 - 1} are missing" if s2 > s1 else f"another segment is {s1}"
            raise ChangelogCorrupt(
                f"{what} before this one; restore the changelog directory from a copy",
                path=os.path.join(directory, n2),
                offset=0,
            )
    segments: list[sg.Segment] = []
    for i, (seq, first, name) in enumerate(found):
        # (each segment's first record names the last of the one before: checked when it is there)
        prev_crc = segments[-1].link if segments else None
        if i == len(found) - 1:
            last = sg.open_last(directory, name, seq, first, interval, prev_crc)
            if last is None:
                sync_directory(os.path.join(directory, name))
                break
            seg = last
        else:
            seg = sg.open_sealed(directory, name, seq, first, interval, prev_crc)
        if segments and seg.prev_csn != segments[-1].last_csn:
            raise ChangelogCorrupt(
                f"segment says the record before it is csn {seg.prev_csn}, "
                f"but the segment before it ends at csn {segments[-1].last_csn}",
                path=seg.path,
                offset=0,
            )
        segments.append(seg)
    return segments


def make_adopted_durable(
    segments: list[sg.Segment], active_fd: int, guard: Callable[[Callable[[], None]], None]
) -> None:
    """fsync every segment found on open, then their directory, before any of it is called durable.

    What the last process wrote is adopted whole, fsynced or not: after
    a kill -9 its unsynced writes (a group commit between write and
    fsync, a segment rolled over since the last sync, its directory
    entry) are still in the page cache, so they read back intact.  The
    service resumes its senders after, and confirms slots up to, the
    durable CSN this open sets; were those pages left to the kernel, an
    OS crash or power failure afterwards would lose transactions no
    source re-sends.  PostgreSQL fsyncs its data directory at crash
    recovery for the same reason.  A clean file costs one quick fsync;
    the index files are hints rebuilt when they do not fit, so they are
    left alone.  (Not counted in `fsyncs`: those are the group commit's.)
    """

    def step() -> None:
        for seg in segments[:-1]:  # (one at a time: there may be more segments than open files allowed)
            fd = os.open(seg.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_covered(
            SyncPoint(
                sealed_fds=[], fd=active_fd, directory_of=segments[-1].path, segments=[], csns=[], lines=[]
            )
        )

    guard(step)
