"""Dates, times and intervals: binary send formats and ISO text -> docs/design.md section 7 forms.

date -> `YYYY-MM-DD`; timestamp -> `datetime.isoformat()` without offset;
timestamptz -> `isoformat()` in UTC (`+00:00`); +-infinity -> "infinity" /
"-infinity" (int32 / int64 max and min in binary); time, timetz and interval
-> their PostgreSQL text form, which the binary decoders render themselves
(`AppendSeconds`, `EncodeTimezone`, `EncodeInterval` with IntervalStyle
`postgres`).  The date and timestamp text decoders read the walsender's
default `DateStyle=ISO` and reject any other style, never misread it; time,
timetz and interval text pass through as PostgreSQL printed them.

psycopg's C loaders turn the common binary values into datetimes fastest, but
they cannot represent +-infinity or years outside 1..9999: those fall back to
the calendar arithmetic here.  PostgreSQL uses the proleptic Gregorian
calendar with astronomical years (year 0 is 1 BC) over its whole range, and
so does this arithmetic (H. Hinnant's days_from_civil / civil_from_days).
Years outside 0000..9999 are written as ISO 8601 expanded years in both
modes: `-000043-03-15` for 44 BC, `+010000-01-01`.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final

from psycopg import DataError
from psycopg.adapt import Transformer
from psycopg.pq import Format

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "US_PER_DAY",
    "clock_text",
    "date_binary",
    "date_text",
    "interval_binary",
    "pg_date_text",
    "time_binary",
    "timestamp_binary",
    "timestamp_iso",
    "timestamp_text",
    "timestamptz_binary",
    "timestamptz_text",
    "timetz_binary",
]

_I32 = struct.Struct("!i")
_I64 = struct.Struct("!q")
_TIMETZ = struct.Struct("!qi")  # time of day in us, zone in seconds WEST of UTC
_INTERVAL = struct.Struct("!qii")  # time in us, days, months

# int64 / int32 max and min are +-infinity in timestamps and dates
INT64_MAX: Final = (1 << 63) - 1
INT64_MIN: Final = -(1 << 63)
INT32_MAX: Final = (1 << 31) - 1
INT32_MIN: Final = -(1 << 31)
US_PER_DAY: Final = 86_400_000_000
_INT64_MAX: Final = INT64_MAX
_INT64_MIN: Final = INT64_MIN
_INT32_MAX: Final = INT32_MAX
_INT32_MIN: Final = INT32_MIN
_US_PER_DAY: Final = US_PER_DAY
_PG_EPOCH_DAYS: Final = 10_957  # 2000-01-01 in days since 1970-01-01
_EPOCH: Final = datetime(2000, 1, 1)
_EPOCH_UTC: Final = datetime(2000, 1, 1, tzinfo=UTC)

_loaders = Transformer()
_load_date = _loaders.get_loader(1082, Format.BINARY).load
_load_timestamp = _loaders.get_loader(1114, Format.BINARY).load


def _civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _days_from_civil(year: int, month: int, day: int) -> int:
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719_468


def _iso_date(pg_days: int) -> str:
    year, month, day = _civil_from_days(pg_days + _PG_EPOCH_DAYS)
    y = f"{year:04d}" if 0 <= year <= 9999 else f"{year:+07d}"
    return f"{y}-{month:02d}-{day:02d}"


def _clock(us: int, fraction: bool = True) -> str:
    """HH:MM:SS[.ffffff] with trailing fraction zeros dropped (AppendSeconds)."""
    hours, us = divmod(us, 3_600_000_000)
    minutes, us = divmod(us, 60_000_000)
    seconds, us = divmod(us, 1_000_000)
    text = f"{hours:02d}:{minutes:02d}:{seconds:02d}"
    if us:
        text += "." + f"{us:06d}".rstrip("0") if fraction else f".{us:06d}"
    return text


def pg_date_text(pg_days: int) -> str:
    """date_out's text of days since 2000-01-01 (DateStyle ISO): `YYYY-MM-DD`, ` BC` before year 1."""
    year, month, day = _civil_from_days(pg_days + _PG_EPOCH_DAYS)
    if year <= 0:
        return f"{1 - year:04d}-{month:02d}-{day:02d} BC"
    return f"{year:04d}-{month:02d}-{day:02d}"


def clock_text(us: int) -> str:
    """A time of day in microseconds as PostgreSQL prints it: HH:MM:SS[.ffffff], fraction zeros dropped."""
    return _clock(us)


def timestamp_iso(us: int, utc: bool) -> str:
    """Microseconds since 2000-01-01 -> `datetime.isoformat()` (UTC `+00:00` if `utc`)."""
    if us == _INT64_MAX:
        return "infinity"
    if us == _INT64_MIN:
        return "-infinity"
    try:
        return ((_EPOCH_UTC if utc else _EPOCH) + timedelta(microseconds=us)).isoformat()
    except OverflowError:
        days, rest = divmod(us, _US_PER_DAY)
        return f"{_iso_date(days)}T{_clock(rest, fraction=False)}{'+00:00' if utc else ''}"


def date_binary(data: bytes) -> str:
    if len(data) == 4:
        try:
            return str(_load_date(data).isoformat())
        except DataError:
            pass
    days = _I32.unpack(data)[0]
    if days == _INT32_MAX:
        return "infinity"
    if days == _INT32_MIN:
        return "-infinity"
    return _iso_date(days)


def timestamp_binary(data: bytes) -> str:
    if len(data) == 8:
        try:
            return str(_load_timestamp(data).isoformat())
        except DataError:
            pass
    return timestamp_iso(_I64.unpack(data)[0], utc=False)


def timestamptz_binary(data: bytes) -> str:
    if len(data) == 8:
        try:
            # the naive datetime and a written offset: a third faster than an aware one
            return str(_load_timestamp(data).isoformat()) + "+00:00"
        except DataError:
            pass
    return timestamp_iso(_I64.unpack(data)[0], utc=True)


_DATE_TEXT = re.compile(r"(\d{4,})-(\d\d)-(\d\d)( BC)?")
_TIMESTAMP_TEXT = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?( BC)?"
)
_INFINITIES: Final = frozenset(("infinity", "-infinity"))


def date_text(text: str) -> str:
    if (len(text) == 10 and text[4] == "-" and text[7] == "-") or text in _INFINITIES:
        return text
    m = _DATE_TEXT.fullmatch(text)
    if m is None:
        raise ValueError(f"date {text!r} is not in DateStyle ISO form")
    year, month, day, bc = m.groups()
    return _iso_date(
        _days_from_civil(1 - int(year) if bc else int(year), int(month), int(day)) - _PG_EPOCH_DAYS
    )


def _timestamp_text_decoder(utc: bool) -> Callable[[str], str]:
    kind = "timestamptz" if utc else "timestamp"

    def decode(text: str) -> str:
        if text in _INFINITIES:
            return text
        m = _TIMESTAMP_TEXT.fullmatch(text)
        if m is None:
            raise ValueError(f"{kind} {text!r} is not in DateStyle ISO form")
        year, month, day, hh, mm, ss, frac, sign, oh, om, osec, bc = m.groups()
        if (sign is None) == utc:
            raise ValueError(f"{kind} {text!r} {'lacks' if utc else 'has'} a time zone offset")
        offset = 0
        if sign is not None:
            offset = int(oh) * 3600 + int(om or 0) * 60 + int(osec or 0)
            if sign == "-":
                offset = -offset
        if offset == 0 and len(year) == 4 and not bc:
            # the common case: already ISO, only the separator and fraction differ
            iso = f"{text[:10]}T{text[11:19]}"
            if frac:
                iso += "." + frac.ljust(6, "0")
            return iso + "+00:00" if utc else iso
        days = _days_from_civil(1 - int(year) if bc else int(year), int(month), int(day)) - _PG_EPOCH_DAYS
        seconds = (days * 24 + int(hh)) * 3600 + int(mm) * 60 + int(ss) - offset
        return timestamp_iso(seconds * 1_000_000 + int((frac or "0").ljust(6, "0")), utc)

    return decode


def time_binary(data: bytes) -> str:
    return _clock(_I64.unpack(data)[0])


def _zone(seconds_west: int) -> str:
    """EncodeTimezone: +HH, +HH:MM or +HH:MM:SS (the zone is stored negated)."""
    sign = "+" if seconds_west <= 0 else "-"
    minutes, seconds = divmod(abs(seconds_west), 60)
    hours, minutes = divmod(minutes, 60)
    if seconds:
        return f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
    if minutes:
        return f"{sign}{hours:02d}:{minutes:02d}"
    return f"{sign}{hours:02d}"


def timetz_binary(data: bytes) -> str:
    us, zone = _TIMETZ.unpack(data)
    return _clock(us) + _zone(zone)


def _trunc_div(a: int, b: int) -> int:
    """C integer division (toward zero), as PostgreSQL's interval2itm does it."""
    q = abs(a) // b
    return q if a >= 0 else -q


def interval_binary(data: bytes) -> str:
    """EncodeInterval with IntervalStyle 'postgres': `1 year 2 mons -3 days +04:05:06.7`."""
    us, days, months = _INTERVAL.unpack(data)
    years = _trunc_div(months, 12)
    parts = []
    is_zero = True
    is_before = False
    for value, unit in ((years, "year"), (months - years * 12, "mon"), (days, "day")):
        if value:
            plus = "+" if is_before and value > 0 else ""
            parts.append(f"{plus}{value} {unit}{'' if value == 1 else 's'}")
            is_before = value < 0
            is_zero = False
    if is_zero or us:
        sign = "-" if us < 0 else "+" if is_before else ""
        parts.append(sign + _clock(abs(us)))
    return " ".join(parts)


timestamp_text: Final = _timestamp_text_decoder(utc=False)
timestamptz_text: Final = _timestamp_text_decoder(utc=True)
