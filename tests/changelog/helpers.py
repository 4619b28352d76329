"""Shared by the changelog tests: building a log from records and the brute-force oracle of a read."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path

from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.changelog import record as rec
from csnd.changelog.sync import SyncPoint

Records = list[tuple[int, bytes]]


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def payload(csn: int) -> bytes:
    """A JSON-looking line of varied length, a function of the csn (so a reader can check the bytes)."""
    return b'{"csn": %d, "pad": "%s"}' % (csn, b"x" * (csn * 7 % 97))


def write_log(directory: str, records: Records, *, sync_every: int = 3, **kw: object) -> Changelog:
    """A changelog holding `records`; reads come from its segments unless `tail_bytes` is given.

    (Its tail would otherwise serve every read of a log this small from memory:
    tests/changelog/test_tail.py holds the two to the same records.)
    """
    kw.setdefault("tail_bytes", 0)
    log = Changelog(directory, **kw)  # type: ignore[arg-type]
    for i, (csn, line) in enumerate(records):
        log.append(csn, line)
        if i % sync_every == sync_every - 1:
            log.sync()
            log._check()
    log.sync()
    log._check()
    return log


def expected(records: Records, after: int, until: int | None = None) -> Records:
    return [(c, p) for c, p in records if c > after and (until is None or c <= until)]


def segments(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if rec.parse_segment_name(n) is not None)


def record_offsets(directory: str, records: Records) -> dict[int, tuple[str, int]]:
    """csn -> (segment path, byte offset) of each record, worked out from the names and the frame sizes."""
    names = segments(directory)
    firsts = [rec.parse_segment_name(n)[1] for n in names]  # type: ignore[index]
    out: dict[int, tuple[str, int]] = {}
    seg, off = -1, 0
    for csn, line in records:
        if seg + 1 < len(firsts) and csn >= firsts[seg + 1]:
            seg, off = seg + 1, rec.SEGMENT_HEAD
        out[csn] = (os.path.join(directory, names[seg]), off)
        off += rec.FRAME_HEAD + len(line)
    return out


@st.composite
def record_lists(draw: st.DrawFn, min_size: int = 1, max_size: int = 25) -> Records:
    gaps = draw(st.lists(st.integers(1, 1000), min_size=min_size, max_size=max_size))
    out: Records = []
    csn = draw(st.integers(0, 2**40))
    for g in gaps:
        csn += g
        out.append((csn, draw(st.binary(max_size=80))))
    return out


# Records appended two ways and compared (`append_both_ways`): (payload, the other way?, where to cut it).
TwoWayRecords = list[tuple[bytes, bool, list[int]]]
two_way_records = st.lists(
    st.tuples(st.binary(min_size=0, max_size=900), st.booleans(), st.lists(st.integers(0, 900), max_size=4)),
    min_size=1,
    max_size=12,
)


def cut(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at `cuts` (each taken modulo its length + 1): consecutive pieces, none empty."""
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def segment_files(directory: str) -> dict[str, bytes]:
    """The bytes of every segment and index file of a changelog directory, by name."""
    return {
        n: Path(directory, n).read_bytes()
        for n in sorted(os.listdir(directory))
        if n.endswith((".log", ".idx"))
    }


def append_both_ways(
    plain: Changelog,
    other: Changelog,
    records: TwoWayRecords,
    sync_every: int,
    append_other: Callable[[Changelog, int, bytes, list[int]], None],
) -> None:
    """Each record `append`ed to `plain`, and to `other` by `append_other` where marked; both read back whole."""
    for i, (payload, the_other_way, cuts) in enumerate(records, start=1):
        plain.append(i, payload)
        if the_other_way:
            append_other(other, i, payload, cuts)
        else:
            other.append(i, payload)
        if i % sync_every == 0:
            plain.sync()
            other.sync()
            other._check()
    plain.sync()
    other.sync()
    other._check()
    assert list(other.read(0)) == [(i, p) for i, (p, _, _) in enumerate(records, start=1)]


class FailingDisk(Changelog):
    """A changelog whose every fsync fails with `error` (a full disk, an I/O error), through its guard."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(path)
        self.error = error

    def fsync(self, point: SyncPoint) -> None:
        def fail() -> None:
            raise self.error

        self._guard(fail)
