"""What retention drops: the oldest whole segments, but not those a consumer still needs, up to the hold limits.

    segments, oldest first ─┐
    holds {holder: csn} ────┼─► plan() ─► Plan(drop, held, passed)
    limits, now ────────────┘

Retention by size (`retention_bytes`) and age (`retention_hours`) drops the
oldest segments while the changelog is over either limit (Kafka's log).  A
consumer that has not read a segment's records yet -- a named
subscription's mark, the Parquet export's last exported csn -- *holds* it:
the segment stays while the changelog is within the hold limits
(`retention_hold_bytes`, `retention_hold_hours`), so a consumer that is
down for a while resumes without a gap.  Past a hold limit the segment
goes anyway, since a disk must not fill for a consumer that may never come
back, and the plan names the holders it passed: their next read is
OUT_OF_RANGE, naming them, never a silent move to the oldest retained.

Pure (no clock, no files): the changelog passes its segments' sizes, last
csns and times, and the time now by its steady clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

# The hold limits, unless set, are this many times the retention limits: a
# named consumer may be away for as long again as retention keeps records
# (a day's retention: two days away) before it loses any; the disk holds at
# most this many times `retention_bytes`.  Larger: longer outages survived,
# more disk; 1: consumers hold nothing.
DEFAULT_HOLD_FACTOR: Final = 2


@dataclass(frozen=True)
class Limits:
    """Retention's limits (None: none of that kind); a hold limit is at least its retention limit."""

    bytes: int | None = None
    age_us: int | None = None
    hold_bytes: int | None = None
    hold_age_us: int | None = None


@dataclass(frozen=True)
class SegmentInfo:
    last_csn: int  # its newest record
    size: int  # bytes on disk
    last_time_us: int  # its newest record's time
    durable: bool  # fully durable (a segment rolled over since the last sync is not)


@dataclass(frozen=True)
class Plan:
    drop: int  # how many of the oldest segments go
    # holder -> bytes retention would drop but keeps for it (segments it has not read)
    held: Mapping[str, int] = field(default_factory=dict)
    # holder -> its csn, for every holder whose unread records go (past a hold limit)
    passed: Mapping[str, int] = field(default_factory=dict)


def hold_limits(
    retention_bytes: int | None,
    retention_hours: float | None,
    hold_bytes: int | None,
    hold_hours: float | None,
) -> Limits:
    """The limits, with each hold limit not given set to DEFAULT_HOLD_FACTOR times its retention limit.

    ValueError for a hold limit below its retention limit (it could never hold anything).
    """
    if hold_bytes is not None and retention_bytes is not None and hold_bytes < retention_bytes:
        raise ValueError(
            f"retention_hold_bytes ({hold_bytes}) is below retention_bytes ({retention_bytes}): "
            "consumers could hold nothing; set it at or above"
        )
    if hold_hours is not None and retention_hours is not None and hold_hours < retention_hours:
        raise ValueError(
            f"retention_hold_hours ({hold_hours:g}) is below retention_hours ({retention_hours:g}): "
            "consumers could hold nothing; set it at or above"
        )
    if hold_bytes is None and retention_bytes is not None:
        hold_bytes = DEFAULT_HOLD_FACTOR * retention_bytes
    if hold_hours is None and retention_hours is not None:
        hold_hours = DEFAULT_HOLD_FACTOR * retention_hours
    return Limits(
        bytes=retention_bytes,
        age_us=None if retention_hours is None else _us(retention_hours),
        hold_bytes=hold_bytes,
        hold_age_us=None if hold_hours is None else _us(hold_hours),
    )


def plan(segments: Sequence[SegmentInfo], limits: Limits, now_us: int, holds: Mapping[str, int]) -> Plan:
    """Which of the oldest segments retention drops now, whom the rest are kept for, and whom it passed.

    A segment goes while the changelog is over a retention limit (its size,
    or this segment's age), it is fully durable and not the newest, and no
    holder still needs it (a holder at csn c needs every segment with
    records after c) -- or one does, but the changelog is over the hold
    limit of the same kind.  Only a run from the oldest goes: the first
    segment kept keeps every one after it.
    """
    total = sum(s.size for s in segments)
    drop = 0
    keeping = False  # (a segment was kept: none after it goes)
    held: dict[str, int] = {}
    passed: dict[str, int] = {}
    for seg in segments[:-1]:
        if not seg.durable:
            break
        age = now_us - seg.last_time_us
        too_big = limits.bytes is not None and total > limits.bytes
        too_old = limits.age_us is not None and age > limits.age_us
        if not (too_big or too_old):
            break
        needing = [h for h, csn in holds.items() if csn < seg.last_csn]
        if needing and not keeping:
            over = (too_big and limits.hold_bytes is not None and total > limits.hold_bytes) or (
                too_old and limits.hold_age_us is not None and age > limits.hold_age_us
            )
            keeping = not over
        if keeping:
            for h in needing:
                held[h] = held.get(h, 0) + seg.size
        else:
            for h in needing:
                passed[h] = holds[h]
            drop += 1
        total -= seg.size  # (kept or not: what retention alone would have left, for the next's size test)
    return Plan(drop, held, passed)


def _us(hours: float) -> int:
    return int(hours * 3600 * 1_000_000)
