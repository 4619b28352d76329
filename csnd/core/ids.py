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


def pg_time_to_datetime(us: int) -> datetime:
    """Microseconds since the PostgreSQL epoch -> aware UTC datetime."""
    return PG_EPOCH + timedelta(microseconds=us)


def pg_time_to_iso(us: int) -> str:
    """Microseconds since the PostgreSQL epoch -> ISO 8601 with `+00:00`, as `datetime.isoformat`.

    Once per transaction in the coordinator's one thread: the date and time
    of a second come from a cache (commits cluster in time), the
    microseconds are appended.
    """
    seconds, micros = divmod(us, 1_000_000)
    if micros:
        return f"{_iso_second(seconds)}.{micros:06d}+00:00"
    return f"{_iso_second(seconds)}+00:00"


@lru_cache(maxsize=1024)
def _iso_second(seconds: int) -> str:
    return (PG_EPOCH + timedelta(seconds=seconds)).replace(tzinfo=None).isoformat()


def unix_us_to_pg_time(unix_us: int) -> int:
    return unix_us - PG_EPOCH_UNIX_US
