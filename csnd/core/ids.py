"""Distinct id types and the PostgreSQL LSN text form.

LSNs, CSNs and xids are all plain integers on the wire; giving each its own
`NewType` lets mypy catch the classic mix-up of confirming a CSN to a slot or
ordering by an LSN in GTM mode.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import NewType

Lsn = NewType("Lsn", int)
Csn = NewType("Csn", int)
Xid = NewType("Xid", int)

INVALID_LSN = Lsn(0)
MAX_LSN = Lsn(0xFFFF_FFFF_FFFF_FFFF)

_LSN_RE = re.compile(r"^([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})$")

# PostgreSQL counts time in microseconds since 2000-01-01 00:00:00 UTC.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
PG_EPOCH_UNIX_US = 946_684_800_000_000


def lsn_to_str(lsn: int) -> str:
    """`0x16B3748` -> `'0/16B3748'`, as PostgreSQL prints it (uppercase hex)."""
    # %-format: a third faster than the f-string (the decoder's hot path inlines the same format)
    return "%X/%X" % (lsn >> 32, lsn & 0xFFFFFFFF)  # noqa: UP031


def lsn_from_str(text: str) -> Lsn:
    """`'0/16B3748'` -> `Lsn(0x16B3748)`; raises ValueError on anything else."""
    m = _LSN_RE.match(text.strip())
    if m is None:
        raise ValueError(f"invalid LSN {text!r}: expected the form X/X in hex, e.g. 0/16B3748")
    return Lsn((int(m.group(1), 16) << 32) | int(m.group(2), 16))


CSN_EXPECTED = "a csn (a whole number >= 0) or an LSN like 0/16B3748"


def csn_from_str(text: str) -> Csn:
    """A CSN given by a user: `129477016`, or the same spelt as an LSN, `0/7B7A998`; ValueError otherwise.

    On a plain PostgreSQL node a transaction's CSN is its commit LSN, which
    PostgreSQL and csnd's own lines print as X/X; in GTM mode the CSN is the
    GTM's number, and X/X is just another way to write an integer (the
    service cannot tell which was meant, so it takes the form everywhere).
    """
    t = text.strip()
    if t.isascii() and t.isdigit():
        return Csn(int(t))
    if _LSN_RE.match(t) is not None:
        return Csn(lsn_from_str(t))
    raise ValueError(f"expected {CSN_EXPECTED}, got {text!r}")


# The commit timestamps the output can write: Python's dates, years 1 to 9999
# (PostgreSQL's own range is wider, but a commit time outside this one is a
# corrupt stream, not a real commit).
PG_TIME_MIN_US = (datetime(1, 1, 1, tzinfo=UTC) - PG_EPOCH) // timedelta(microseconds=1)
PG_TIME_MAX_US = (datetime.max.replace(tzinfo=UTC) - PG_EPOCH) // timedelta(microseconds=1)


def pg_time_in_range(us: int) -> bool:
    return PG_TIME_MIN_US <= us <= PG_TIME_MAX_US


def pg_time_error(
    us: int, node: str | None = None, lsn: int | None = None, xid: int | None = None
) -> Exception:
    """The `TimestampError` for a commit time outside `PG_TIME_MIN_US`..`PG_TIME_MAX_US`, with what is known."""
    from csnd.core.errors import TimestampError  # (errors imports this module)

    return TimestampError(us, node=node, lsn=lsn, xid=xid)


def pg_time_to_datetime(us: int) -> datetime:
    """Microseconds since the PostgreSQL epoch -> aware UTC datetime (a `TimestampError` out of range)."""
    try:
        return PG_EPOCH + timedelta(microseconds=us)
    except OverflowError:
        raise pg_time_error(us) from None


def pg_time_to_iso(us: int) -> str:
    """Microseconds since the PostgreSQL epoch -> ISO 8601 with `+00:00`, as `datetime.isoformat`.

    Once per transaction in the coordinator's one thread: the date and time
    of a second come from a cache (commits cluster in time), the
    microseconds are appended.
    """
    seconds, micros = divmod(us, 1_000_000)
    if not PG_TIME_MIN_US <= us <= PG_TIME_MAX_US:
        raise pg_time_error(us)
    if micros:
        return f"{_iso_second(seconds)}.{micros:06d}+00:00"
    return f"{_iso_second(seconds)}+00:00"


@lru_cache(maxsize=1024)
def _iso_second(seconds: int) -> str:
    return (PG_EPOCH + timedelta(seconds=seconds)).replace(tzinfo=None).isoformat()


def unix_us_to_pg_time(unix_us: int) -> int:
    return unix_us - PG_EPOCH_UNIX_US
