"""The grammar of GTM mode's `csn` markers (docs/design.md section 2), defined once.

Writers put these ASCII texts in each node's WAL with
`pg_logical_emit_message(transactional, 'csn', content)`:

    committing <gid> <csn>   non-transactional  gid entered its commit; its commit CSN will be > csn
    commit <gid> <csn>       transactional      this local transaction is gid, commit CSN csn
    abort <gid>              non-transactional  gid, which logged committing, will not commit
    cid <n>                  transactional      following changes here belong to command id n
    tick <csn>               non-transactional  every txn committing here later, not already
                                                committing, gets a CSN > csn

Why one strict grammar.  The writer side (the generator, the live writer in
`csnd.gtm`) and the reading side (the node sender) used to parse markers
each their own way, and disagreed: one took `commit  5` (an empty gid),
`tick -5` or `tick 1_000` (what Python's `int()` accepts), the other
refused them.  A marker is a contract between processes that may run
different versions, so there is one reading, the strict one:

- ASCII, fields separated by exactly one space, nothing before or after;
- a gid is one or more visible ASCII characters (no space, no control);
- a number is decimal digits only: no sign, no underscores, no spaces;
  a CSN fits in uint64, a command id in uint32 (pgoutput's CommandId).

The formatting functions refuse what the parser would refuse, so a writer
cannot put a marker in the WAL that a reader will reject later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal, NamedTuple

from csnd.core.errors import MalformedMarker
from csnd.core.ids import Csn

PREFIX: Final = "csn"
# An incremental snapshot's high watermark (csnd.snapshot.watermark): another prefix, not a marker.
WATERMARK_PREFIX: Final = "csnd.snapshot"
# Where a gtm-mode stream's start is settled (csnd.reader.settle): another prefix, not a marker.
START_PREFIX: Final = "csnd.start"

MarkerKind = Literal["committing", "commit", "abort", "cid", "tick"]
KINDS: Final[tuple[MarkerKind, ...]] = ("committing", "commit", "abort", "cid", "tick")
# Whether each kind is written as a transactional logical message.
TRANSACTIONAL: Final[dict[str, bool]] = {
    "committing": False,
    "commit": True,
    "abort": False,
    "cid": True,
    "tick": False,
}

CSN_MAX: Final = (1 << 64) - 1
CID_MAX: Final = (1 << 32) - 1
_NUM_DIGITS: Final = len(str(CSN_MAX))  # 20: a number with more (leading zeros aside) is past any limit

# Fields of each kind after the kind itself: whether it has a gid, whether a number.
_FIELDS: Final[dict[str, tuple[bool, bool]]] = {
    "committing": (True, True),
    "commit": (True, True),
    "abort": (True, False),
    "cid": (False, True),
    "tick": (False, True),
}
_ARITY: Final = {kind: 1 + gid + num for kind, (gid, num) in _FIELDS.items()}
# kind -> (fields with the kind, has a gid, the number's limit or 0 for none)
_SHAPES: Final = {
    kind: (_ARITY[kind], gid, (CID_MAX if kind == "cid" else CSN_MAX) if num else 0)
    for kind, (gid, num) in _FIELDS.items()
}
# A CSN parsed from its digits: `int` itself, typed -- `Csn(int(raw))` would add a Python-level call.
_as_csn: Final[Callable[[str], Csn]] = int  # type: ignore[assignment]
EXPECTED: Final = (
    "expected one of 'committing <gid> <csn>', 'commit <gid> <csn>', 'abort <gid>', 'cid <n>', 'tick <csn>'"
)


class Marker(NamedTuple):
    kind: MarkerKind
    gid: str | None  # committing, commit, abort
    value: int | None  # the CSN (committing, commit, tick) or the command id (cid)


def is_gid(gid: str) -> bool:
    """One or more visible ASCII characters: what a marker can carry as one field."""
    return bool(gid) and gid.isascii() and gid.isprintable() and " " not in gid


# --- formatting (the writer side) ----------------------------------------------------------


def _gid(gid: str) -> str:
    if not is_gid(gid):
        raise MalformedMarker(
            f"gid {gid!r} cannot be written in a csn marker: it must be visible ascii, no spaces"
        )
    return gid


def _num(n: int, limit: int, what: str) -> int:
    if type(n) is not int or not 0 <= n <= limit:  # (bool is an int; a marker never holds one)
        raise MalformedMarker(
            f"{what} {n!r} cannot be written in a csn marker: it must be an integer 0..{limit}"
        )
    return n


def committing(gid: str, csn: int) -> str:
    return f"committing {_gid(gid)} {_num(csn, CSN_MAX, 'csn')}"


def commit(gid: str, csn: int) -> str:
    return f"commit {_gid(gid)} {_num(csn, CSN_MAX, 'csn')}"


def abort(gid: str) -> str:
    return f"abort {_gid(gid)}"


def cid(n: int) -> str:
    return f"cid {_num(n, CID_MAX, 'command id')}"


def tick(csn: int) -> str:
    return f"tick {_num(csn, CSN_MAX, 'csn')}"


def format_marker(m: Marker) -> str:
    """The content of marker `m` (the inverse of `parse_marker`)."""
    if m.kind in ("committing", "commit"):
        assert m.gid is not None and m.value is not None
        return committing(m.gid, m.value) if m.kind == "committing" else commit(m.gid, m.value)
    if m.kind == "abort":
        assert m.gid is not None
        return abort(m.gid)
    assert m.value is not None
    return cid(m.value) if m.kind == "cid" else tick(m.value)


# --- parsing (the reading side) ------------------------------------------------------------


def parse_marker(
    content: bytes | str,
    *,
    node: str | None = None,
    lsn: int | None = None,
    xid: int | None = None,
) -> Marker:
    """Parse a marker's content; `MalformedMarker` naming the content (and node, LSN, xid) if it breaks the grammar."""
    return Marker(*parse_fields(content, node, lsn, xid))


def parse_fields(
    content: bytes | str, node: str | None = None, lsn: int | None = None, xid: int | None = None
) -> tuple[MarkerKind, str | None, Csn | None]:
    """`parse_marker` as a plain tuple: the node sender's path, once per marker (often several a transaction).

    One decode, one split, a few C-level string tests, no Python call on the
    way (a NamedTuple costs one).  The number is typed `Csn`; for a cid
    marker it is the command id.
    """
    if content.__class__ is bytes:
        try:
            text = content.decode("ascii")
        except UnicodeDecodeError:
            raise _malformed(content, "it is not ascii", node, lsn, xid) from None
    else:
        text = content  # type: ignore[assignment]
    parts = text.split(" ")
    kind = parts[0]
    shape = _SHAPES.get(kind)
    if shape is None:
        raise _malformed(content, f"unknown kind {kind[:40]!r}", node, lsn, xid)
    arity, has_gid, limit = shape
    if len(parts) != arity:
        raise _malformed(content, f"{kind} takes {arity - 1} field(s), each after one space", node, lsn, xid)
    gid = None
    if has_gid:
        gid = parts[1]
        # (split on " " leaves no space in a field; isprintable refuses the other blanks)
        if not (gid and gid.isascii() and gid.isprintable()):
            raise _malformed(content, "a gid is one or more visible ascii characters", node, lsn, xid)
    value = None
    if limit:
        raw = parts[-1]
        if len(raw) > _NUM_DIGITS:
            # (int() refuses more than 4300 digits with a ValueError of its
            # own: no more than the limit's 20 reach it, leading zeros aside.)
            raw = raw.lstrip("0") or "0"
        if not (raw.isascii() and raw.isdigit()) or len(raw) > _NUM_DIGITS or (value := _as_csn(raw)) > limit:
            raise _malformed(content, f"a number is decimal digits only, at most {limit}", node, lsn, xid)
    return kind, gid, value  # type: ignore[return-value]  # (kind is one of KINDS: _SHAPES said so)


def check_transactional(
    marker: Marker,
    transactional: bool,
    *,
    node: str | None = None,
    lsn: int | None = None,
    xid: int | None = None,
) -> None:
    """`MalformedMarker` if `marker` came as the other kind of logical message than its kind is written as."""
    want = TRANSACTIONAL[marker.kind]
    if transactional != want:
        raise MalformedMarker(
            f"csn marker {format_marker(marker)!r} is {'' if transactional else 'non-'}transactional; "
            f"{marker.kind} markers are written {'transactionally' if want else 'non-transactionally'}",
            node=node,
            lsn=lsn,
            xid=xid,
        )


def _malformed(
    content: bytes | str, why: str, node: str | None, lsn: int | None, xid: int | None
) -> MalformedMarker:
    return MalformedMarker(
        f"malformed csn marker {content[:120]!r}: {why}; {EXPECTED}", node=node, lsn=lsn, xid=xid
    )
