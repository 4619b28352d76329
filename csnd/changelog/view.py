"""What readers see of the changelog: the durable segments, served from any thread.

    finish_sync(point) ──► segments (a tuple, replaced whole) ─┐   read_pieced(after_csn)
    retention: retire() ─► durable_csn, RecentCsns, DurableTail ┼─►   tail in memory, or bisect the
    hold_readers(at) ────► a limit no reader passes             │     segments' first CSNs, then the
                                                              │     segment's index, pread, CRC
                                  wait_durable ◄── notify ────┘   count_after: RecentCsns, else read

The writer thread replaces the view under the condition's lock; a reader
takes what it needs under that lock (the tuple, each segment's durable end
and index length) and reads the files without it.  What is in the view is
durable, and a record past it is never read.  A sealed segment whose index
points at the wrong bytes has its index rebuilt once, by one reader.
"""

from __future__ import annotations

import itertools
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence

from csnd.changelog import record as rec
from csnd.changelog import segment as sg
from csnd.changelog.recent import RecentCsns
from csnd.changelog.sync import SyncPoint
from csnd.changelog.tail import DurableTail
from csnd.core.errors import ChangelogCorrupt, CsnOutOfRange, IndexMismatch


class ReaderView:
    """The durable segments and the newest durable CSNs, as readers are shown them (replaced under `cond`)."""

    def __init__(
        self,
        segments: Sequence[sg.Segment],
        durable_csn: int,
        *,
        interval: int,
        recent_csns: int,
        tail_bytes: int,
        newest_segment: Callable[[], sg.Segment],
    ) -> None:
        self.cond = threading.Condition(threading.Lock())
        self._rebuild_lock = threading.Lock()  # one reader at a time rebuilds a sealed segment's index
        self._interval = interval
        # (the one being appended to: damage there is not mended by rebuilding its index)
        self._newest_segment = newest_segment
        self.closed = False  # (set by close: wait_durable returns)
        self.segments: tuple[sg.Segment, ...] = tuple(segments)
        self.durable_csn = durable_csn
        # The newest durable CSNs, for consumers' lag (count_after), from the newest segment's scan on.
        self.tail = DurableTail(tail_bytes, durable_csn)
        last = segments[-1] if segments else None
        seed = last.opened_csns if last else []
        self.recent = RecentCsns(recent_csns, seed[0] - 1 if seed else 0, seed)
        self.reader_limit: int | None = None  # readers see no record past it (hold_readers)

    # -- replaced by the writer thread -------------------------------------------

    def publish(self, point: SyncPoint, segments: Sequence[sg.Segment]) -> int:
        """Shows readers what `point` covered (`segments`: the writer's, oldest first); returns durable_csn."""
        with self.cond:
            for seg, written, last_csn, last_time, index_n in point.segments:
                seg.end = written
                seg.last_csn, seg.last_time = last_csn, last_time
                seg.durable_n = index_n
            self.segments = tuple(s for s in segments if s.last_csn)
            if self.segments:  # (empty while the first record ever is still being written in pieces)
                self.durable_csn = self.segments[-1].last_csn
            self.recent.extend(point.csns)
            self.tail.extend(point.csns, point.lines)
            self.cond.notify_all()
        return self.durable_csn

    def retire(self, keep: Sequence[sg.Segment], through_csn: int) -> None:
        """Retention dropped every segment before `keep`, whose records end at `through_csn`."""
        with self.cond:
            self.segments = tuple(s for s in keep if s.last_csn)
            # (a lag counts retained records only: one behind the dropped ones is a lower bound)
            self.recent.drop_through(through_csn)
            self.tail.drop_through(through_csn)

    def reset(self) -> None:
        """Nothing is durable: the changelog was cleared."""
        with self.cond:
            self.segments = ()
            self.durable_csn = 0
            self.recent = RecentCsns(self.recent.keep)
            self.tail.clear()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    # -- holding readers back ----------------------------------------------------

    @property
    def visible_csn(self) -> int:
        """The newest record readers are shown: durable_csn, unless readers are held back."""
        limit = self.reader_limit
        return self.durable_csn if limit is None else min(limit, self.durable_csn)

    def hold_readers(self, at: int | None = None) -> None:
        with self.cond:
            self.reader_limit = self.durable_csn if at is None else at

    def release_readers(self) -> None:
        with self.cond:
            self.reader_limit = None
            self.cond.notify_all()

    # -- reading (any thread) ----------------------------------------------------

    @property
    def oldest_csn(self) -> int:
        view = self.segments
        return view[0].first_csn if view else 0

    @property
    def oldest_after_csn(self) -> int:
        view = self.segments
        return view[0].prev_csn if view else self.durable_csn

    @property
    def size_bytes(self) -> int:
        with self.cond:
            return sum(s.end for s in self.segments)

    def count_after(self, csn: int, cap: int) -> tuple[int, bool]:
        """Durable records after `csn`, counted up to `cap`: (count, whether it is only a lower bound).

        The newest RECENT_CSNS are counted by bisection; only a count
        reaching further back, below what they cover and under the cap,
        reads the records in between (their heads, not their payloads).
        """
        with self.cond:
            durable = self.visible_csn
            recent = self.recent
            n = recent.count_after(csn)
            floor, kept = recent.floor, len(recent.csns)
            held = self.reader_limit is not None
        if csn >= durable:
            return 0, False
        if held:  # (an initial snapshot being taken: rare and short, so counted by reading)
            counted = sum(1 for _ in itertools.islice(self.read_pieced(csn, whole_up_to=0), cap))
            return counted, counted >= cap
        if n is not None:
            return min(n, cap), n >= cap
        if kept >= cap:
            return cap, True
        counted = kept
        try:
            for _ in self.read_pieced(csn, floor, whole_up_to=0):
                counted += 1
                if counted >= cap:
                    return cap, True
        except CsnOutOfRange:  # (behind retention: at least everything retained)
            return max(counted, self.count_after(0, cap)[0]), True
        return counted, False

    def wait_durable(
        self, after_csn: int, timeout: float, interrupted: Callable[[], bool] | None = None
    ) -> bool:
        def done() -> bool:
            return self.visible_csn > after_csn or self.closed or (interrupted is not None and interrupted())

        with self.cond:
            return self.cond.wait_for(done, timeout) and self.visible_csn > after_csn

    def wake_waiters(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def read_pieced(
        self,
        after_csn: int,
        until_csn: int | None = None,
        whole_up_to: int | None = None,
        *,
        strict: bool = False,
    ) -> Iterator[tuple[int, bytes | sg.RecordPieces]]:
        """The durable records after `after_csn` (through `until_csn`); longer than `whole_up_to`: RecordPieces."""
        with self.cond:
            view = self.segments
            limit = self.reader_limit
            if limit is not None:  # (held back: nothing past the limit is shown)
                until_csn = limit if until_csn is None else min(until_csn, limit)
                if after_csn >= limit:
                    return iter(())
            check_retained(view, after_csn, strict)
            tail = self.tail.after(after_csn, until_csn, whole_up_to)
            if tail is not None:  # (all of it in memory: as the segments hold it, unread)
                return zip(tail[0], tail[1], strict=True)
            bounds = [(s.end, s.durable_n) for s in view]
        return self._iterate(view, bounds, after_csn, until_csn, whole_up_to)

    def _iterate(
        self,
        view: tuple[sg.Segment, ...],
        bounds: list[tuple[int, int]],
        after_csn: int,
        until_csn: int | None,
        whole_up_to: int | None,
    ) -> Iterator[tuple[int, bytes | sg.RecordPieces]]:
        i = max(bisect_right([s.first_csn for s in view], after_csn) - 1, 0)
        for seg, (end, n) in zip(view[i:], bounds[i:], strict=True):
            if until_csn is not None and seg.first_csn > until_csn:
                return
            if seg.last_csn <= after_csn:
                continue
            for attempt in (0, 1):
                with self.cond:
                    csns, offs = seg.index_csns, seg.index_offs
                start, expect = sg.seek(csns, offs, n, after_csn)
                try:
                    yield from sg.read_records(
                        seg.path, start, end, expect, after_csn, until_csn, whole_up_to, seg.frames
                    )
                    break
                except FileNotFoundError:
                    raise CsnOutOfRange(
                        f"changelog: {seg.path} was dropped by retention while it was read "
                        f"(reading after csn {after_csn}); the oldest retained csn is now {self.oldest_csn}",
                        csn=after_csn,
                        oldest_csn=self.oldest_csn,
                    ) from None
                except IndexMismatch:
                    if attempt or seg is self._newest_segment() or start == rec.SEGMENT_HEAD:
                        raise ChangelogCorrupt(
                            f"no record of csn {expect} where the index puts it", path=seg.path, offset=start
                        ) from None
                    self._rebuild_index(seg)
                    n = len(seg.index_csns)
                except ChangelogCorrupt:
                    if seg is not self._newest_segment():
                        # (damaged since open: said in the words open, and `csnd changelog --check`, use)
                        sg.scan_sealed(seg.path, seg.header, self._interval)
                    raise

    def _rebuild_index(self, seg: sg.Segment) -> None:
        """A sealed segment's index pointed at the wrong bytes: scan the segment and write it anew."""
        with self._rebuild_lock:
            sg.log.warning(
                "changelog: rebuilding the index of %s: an entry does not point at its record", seg.path
            )
            _, (csns, offs) = sg.scan_sealed(seg.path, seg.header, self._interval)
            with self.cond:
                seg.index_csns, seg.index_offs, seg.durable_n = csns, offs, len(csns)
            sg.write_index(seg)

    def _check(self) -> None:
        view = self.segments
        assert self.durable_csn == (view[-1].last_csn if view else 0) or (not view and not self.durable_csn)
        self.recent._check()
        assert not self.recent.csns or self.recent.csns[-1] == self.durable_csn


def check_retained(view: tuple[sg.Segment, ...], after_csn: int, strict: bool = False) -> None:
    """CsnOutOfRange when retention dropped records after `after_csn` (0, unless `strict`: the oldest retained)."""
    if view and (after_csn or strict) and after_csn < view[0].prev_csn:
        raise CsnOutOfRange(
            f"changelog: records after csn {after_csn} were dropped by retention; "
            f"the oldest retained csn is {view[0].first_csn}; read after csn {view[0].prev_csn} or later, "
            "or from 0 for the oldest retained",
            csn=after_csn,
            oldest_csn=view[0].first_csn,
        )


def whole_records(records: Iterator[tuple[int, bytes | sg.RecordPieces]]) -> Iterator[tuple[int, bytes]]:
    """`records` with every RecordPieces read whole."""
    for csn, payload in records:
        yield csn, payload if isinstance(payload, bytes) else payload.read()
