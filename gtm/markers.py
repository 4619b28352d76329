"""The `csn` logical-message markers of GTM mode (DESIGN section 2).

Writers put these ASCII texts in each node's WAL with
`pg_logical_emit_message(transactional, 'csn', content)`:

    committing <gid> <csn>   non-transactional  gid entered its commit; its commit CSN will be > csn
    commit <gid> <csn>       transactional      this local transaction is gid, commit CSN csn
    abort <gid>              non-transactional  gid, which logged committing, will not commit
    cid <n>                  transactional      following changes here belong to command id n
    tick <csn>               non-transactional  every txn committing here later, not already
                                                committing, gets a CSN > csn

Both the synthetic generator and the live writer format markers here, so the
text is defined once.  `parse_marker` is the strict inverse, used by tests and
tools that inspect streams.
"""

from __future__ import annotations

from typing import Final, NamedTuple

PREFIX: Final = "csn"

KINDS: Final = ("committing", "commit", "abort", "cid", "tick")
TRANSACTIONAL: Final = {"committing": False, "commit": True, "abort": False, "cid": True, "tick": False}


def committing(gid: str, csn: int) -> str:
    return f"committing {gid} {csn}"


def commit(gid: str, csn: int) -> str:
    return f"commit {gid} {csn}"


def abort(gid: str) -> str:
    return f"abort {gid}"


def cid(n: int) -> str:
    return f"cid {n}"


def tick(csn: int) -> str:
    return f"tick {csn}"


class Marker(NamedTuple):
    kind: str
    gid: str | None
    value: int | None  # the CSN (committing, commit, tick) or command id (cid)


def parse_marker(content: bytes | str) -> Marker:
    """Parse a marker's content; raises ValueError naming the bad text.

    A gid never contains spaces (writers choose it), so splitting on spaces is
    exact.
    """
    text = content.decode("ascii") if isinstance(content, bytes) else content
    parts = text.split(" ")
    kind = parts[0]
    try:
        if kind in ("committing", "commit") and len(parts) == 3:
            return Marker(kind, parts[1], int(parts[2]))
        if kind == "abort" and len(parts) == 2:
            return Marker(kind, parts[1], None)
        if kind in ("cid", "tick") and len(parts) == 2:
            return Marker(kind, None, int(parts[1]))
    except ValueError:
        pass
    raise ValueError(f"malformed csn marker {text!r}")
