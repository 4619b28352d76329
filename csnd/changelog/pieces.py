"""A record appended in pieces: a transaction too large to hold whole goes to its segment as it is produced.

    start(csn) ─► pending flushed ─► a head of zeroes written where the record starts
    write(piece) ... ─► straight to the segment; the payload's length and CRC kept as it goes
    end() ─► the real head written over the zeroes ─► appended, as `append` would have (visible after a sync)
    abort() ─► its bytes cut off (or its segment removed, when it was started for this record)

Until `end` the record is neither visible nor counted in what a sync
covers, and nothing else may be appended; a crash in the middle leaves a
torn tail that the next open cuts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from csnd.changelog import record as rec
from csnd.changelog import segment as sg
from csnd.changelog.crc import crc32
from csnd.changelog.writer import SegmentWriter


@dataclass
class OpenRecord:
    """A record being appended in pieces: where its head goes, and its payload's length and CRC so far."""

    csn: int
    time_us: int
    segment: sg.Segment
    offset: int  # of its head in the segment
    length: int = 0
    crc: int = 0


class PiecedRecords:
    """Appends one record at a time in pieces, through the segment writer (the writer thread)."""

    def __init__(
        self,
        writer: SegmentWriter,
        *,
        clock: Callable[[], float],
        guard: Callable[[Callable[[], None]], None],
    ) -> None:
        self._writer = writer
        self._clock = clock
        self._guard = guard
        self.open: OpenRecord | None = None

    def start(self, csn: int) -> None:
        """Begin the record of `csn`, its payload to come in pieces; no append until `end`."""
        w = self._writer
        w.check_next(csn)  # (an open record here is the writer's open_csn)
        t = int(self._clock() * 1_000_000)

        def step() -> None:
            w.flush()  # (what is pending goes first: it comes before this record)
            seg = w.segment_for(csn)
            w.write(seg, [bytes(rec.FRAME_HEAD)], len(seg.index_csns))
            self.open = OpenRecord(csn, t, seg, seg.written)
            w.open_csn = csn

        self._guard(step)

    def write(self, piece: bytes) -> None:
        """Append a piece of the open record's payload (written at once, not yet visible)."""
        r = self.open
        if r is None:
            raise ValueError("no changelog record is open")
        if r.length + len(piece) > rec.MAX_PAYLOAD:
            raise ValueError(f"changelog record of csn {r.csn} is over {rec.MAX_PAYLOAD} bytes")
        w = self._writer

        def step() -> None:
            view = memoryview(piece)
            try:
                while view:
                    view = view[os.write(w.fd, view) :]
            except OSError as e:
                raise OSError(e.errno, e.strerror, r.segment.path) from e

        self._guard(step)
        r.crc = crc32(piece, r.crc)
        r.length += len(piece)

    def end(self) -> None:
        """Write the open record's head: it is appended, as `append` would have (visible after a sync)."""
        r = self.open
        if r is None:
            raise ValueError("no changelog record is open")
        w = self._writer
        seg = r.segment
        head = rec.encode_head(r.csn, r.time_us, r.length, r.crc, w.link)

        def step() -> None:
            fd = os.open(seg.path, os.O_WRONLY)  # (pwrite on an O_APPEND file appends, on Linux)
            try:
                os.pwrite(fd, head, r.offset)
            finally:
                os.close(fd)
            first_new = len(seg.index_csns)
            if not seg.index_offs or r.offset - seg.index_offs[-1] >= w.interval:
                seg.index_csns.append(r.csn)
                seg.index_offs.append(r.offset)
            seg.written = r.offset + rec.FRAME_HEAD + r.length
            seg.w_last_csn, seg.w_last_time = r.csn, r.time_us
            w.write(seg, [], first_new)  # (its index entry, and the segment marked for the next sync)

        self._guard(step)
        self.open = w.open_csn = None
        w.appended_csn = r.csn
        w.link = rec.frame_crc(head)
        w.unsynced_csns.append(r.csn)
        w.unsynced_lines.append(None)

    def abort(self) -> None:
        """Drop the open record (its transaction was given up): cut its bytes off the segment."""
        r = self.open
        if r is None:
            return
        self.open = self._writer.open_csn = None
        w = self._writer
        if r.segment.w_last_csn:
            self._guard(lambda: os.ftruncate(w.fd, r.offset))
        else:
            # The segment was started for this record, and is named after its csn: no other
            # record may be its first.  It goes, and the one before it is appended to again.
            self._guard(lambda: w.unroll(r.segment))
