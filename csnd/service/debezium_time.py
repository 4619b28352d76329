"""Temporal values as Debezium's PostgreSQL connector writes them with `time.precision.mode=adaptive` (pure).

A transaction line carries dates, times and intervals as text (docs/design.md
section 7, "Values"); Debezium's default mode writes most of them as
numbers, chosen by the column's type and precision (its typmod):

    date                      "2026-11-22"                 ─► 20414             days since 1970-01-01 (io.debezium.time.Date)
    time(0..3)                "10:00:00.123"               ─► 36000123          ms of the day (io.debezium.time.Time)
    time, time(4..6)          "10:00:00.123456"            ─► 36000123456       µs of the day (io.debezium.time.MicroTime)
    timestamp(0..3)           "2026-11-22T10:00:00.123"    ─► 1795341600123     ms since the epoch (io.debezium.time.Timestamp)
    timestamp, timestamp(4..6) ...                         ─► 1795341600123456  µs since the epoch (io.debezium.time.MicroTimestamp)
    timestamptz               "2026-11-22T10:00:00.5+00:00" ─► "2026-11-22T10:00:00.5Z"  (io.debezium.time.ZonedTimestamp)
    timetz                    "10:00:00+02"                ─► "08:00:00Z"       in UTC (io.debezium.time.ZonedTime)
    interval                  "1 mon 2 days 03:00:00"      ─► 2813400000000     µs, a month 30.4375 days (io.debezium.time.MicroDuration)

An array of one of these types converts each element.  "infinity" and
"-infinity" stay strings: Debezium writes numbers of its own choosing for
them, which csnd does not imitate.  Every conversion is exact integer
arithmetic on the text (no float, no datetime range limit: years beyond
0001..9999 convert too).  A value not in the form the decoder writes is a
ValueError naming it, never a guess.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Final

# (c) a value's converter; None: the type is not temporal, values pass as they are
Convert = Callable[[Any], Any]

_US_PER_S: Final = 1_000_000
_US_PER_DAY: Final = 86_400 * _US_PER_S
# Debezium's average month (MicroDuration's DAYS_PER_MONTH_AVG, 365.25 / 12 days), in µs: exact
_US_PER_MONTH: Final = 2_629_800 * _US_PER_S
# Up to this precision a time or timestamp is in milliseconds, beyond it in microseconds
MILLIS_UP_TO: Final = 3
_INFINITIES: Final = frozenset(("infinity", "-infinity"))

_DATE: Final = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)")
_TIMESTAMP: Final = re.compile(r"([+-]?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(\+00:00)?")
_CLOCK: Final = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?")
_TIMETZ: Final = re.compile(r"(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?")
_INTERVAL_PART: Final = re.compile(
    r"([+-]?\d+) (years?|mons?|days?)|([+-])?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
)


def converter(type_name: str, typmod: int) -> Convert | None:
    """What a column of `type_name` (a relation line's `type`) and `typmod` becomes; None: left as it is."""
    return _converter(type_name, typmod)


@lru_cache(maxsize=256)
def _converter(type_name: str, typmod: int) -> Convert | None:
    if type_name.startswith("_"):
        element = _converter(type_name[1:], typmod)
        return None if element is None else _array(element)
    precision = typmod if typmod >= 0 else 6  # (no typmod: PostgreSQL keeps microseconds)
    millis = precision <= MILLIS_UP_TO
    if type_name == "date":
        return _text_rule(days_since_epoch)
    if type_name == "time":
        return _text_rule(_per(time_of_day_us, millis))
    if type_name == "timestamp":
        return _text_rule(_per(timestamp_us, millis))
    if type_name == "timestamptz":
        return _text_rule(zoned_timestamp)
    if type_name == "timetz":
        return _text_rule(zoned_time)
    if type_name == "interval":
        return _text_rule(interval_us)
    return None


def _text_rule(rule: Callable[[str], int | str]) -> Convert:
    def convert(value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError(f"{value!r} is not a temporal value's text")
        return value if value in _INFINITIES else rule(value)

    return convert


def _array(element: Convert) -> Convert:
    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return [convert(v) for v in value]
        return None if value is None else element(value)

    return convert


def _per(rule: Callable[[str], int], millis: bool) -> Callable[[str], int]:
    if not millis:
        return rule
    return lambda text: rule(text) // 1000  # (exact: such a column holds no finer digit)


def _days(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar, astronomical years (H. Hinnant)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


def _fraction_us(digits: str | None) -> int:
    return int(digits.ljust(6, "0")) if digits else 0


def _bad(kind: str, text: str) -> ValueError:
    return ValueError(f"{kind} {text!r} is not in the form of docs/design.md section 7")


def days_since_epoch(text: str) -> int:
    m = _DATE.fullmatch(text)
    if m is None:
        raise _bad("date", text)
    return _days(int(m[1]), int(m[2]), int(m[3]))


def timestamp_us(text: str) -> int:
    """Microseconds since 1970-01-01T00:00 of a timestamp (a `+00:00` offset allowed: timestamptz's form)."""
    m = _TIMESTAMP.fullmatch(text)
    if m is None:
        raise _bad("timestamp", text)
    seconds = (_days(int(m[1]), int(m[2]), int(m[3])) * 24 + int(m[4])) * 3600 + int(m[5]) * 60 + int(m[6])
    return seconds * _US_PER_S + _fraction_us(m[7])


def time_of_day_us(text: str) -> int:
    m = _CLOCK.fullmatch(text)
    if m is None:
        raise _bad("time", text)
    return ((int(m[1]) * 60 + int(m[2])) * 60 + int(m[3])) * _US_PER_S + _fraction_us(m[4])


def _clock(us: int) -> str:
    """HH:MM:SS[.f] with the fraction's trailing zeros dropped, as Java's ISO formatters write it."""
    seconds, us = divmod(us, _US_PER_S)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    return text + "." + f"{us:06d}".rstrip("0") if us else text


def zoned_timestamp(text: str) -> str:
    """A timestamptz's ISO text (UTC, `+00:00`) as ZonedTimestamp writes it: `Z`, no trailing fraction zeros."""
    m = _TIMESTAMP.fullmatch(text)
    if m is None or m[8] is None:
        raise _bad("timestamptz", text)
    us = timestamp_us(text) % _US_PER_DAY
    return f"{text[: m.end(3)]}T{_clock(us)}Z"


def zoned_time(text: str) -> str:
    """A timetz's text (`10:00:00+02`) as ZonedTime writes it: the same instant's time of day in UTC, `Z`."""
    m = _TIMETZ.fullmatch(text)
    if m is None:
        raise _bad("timetz", text)
    offset = (int(m[6]) * 60 + int(m[7] or 0)) * 60 + int(m[8] or 0)
    local = ((int(m[1]) * 60 + int(m[2])) * 60 + int(m[3])) * _US_PER_S + _fraction_us(m[4])
    utc = local - (offset if m[5] == "+" else -offset) * _US_PER_S
    return _clock(utc % _US_PER_DAY) + "Z"


def interval_us(text: str) -> int:
    """An interval's text (IntervalStyle postgres) in µs as MicroDuration counts it: a month is 30.4375 days."""
    total = 0
    pos = 0
    text = text.strip()
    clock_seen = False
    while pos < len(text):
        m = _INTERVAL_PART.match(text, pos)
        if m is None or clock_seen:
            raise _bad("interval", text)
        if m[1] is not None:
            n, unit = int(m[1]), m[2]
            total += n * (
                12 * _US_PER_MONTH if unit[0] == "y" else _US_PER_MONTH if unit[0] == "m" else _US_PER_DAY
            )
        else:
            us = ((int(m[4]) * 60 + int(m[5])) * 60 + int(m[6])) * _US_PER_S + _fraction_us(m[7])
            total += -us if m[3] == "-" else us
            clock_seen = True
        pos = m.end()
        if pos < len(text):
            if text[pos] != " ":
                raise _bad("interval", text)
            pos += 1
    if not text:
        raise _bad("interval", text)
    return total
