"""Binary send formats of containers -> their PostgreSQL text output, exactly.

A composite, a range and a multirange have no JSON shape of their own in
docs/design.md section 7: their JSON value is their PostgreSQL text form, the
text a text stream carries (`(1,"a b")`, `[1,5)`, `{[1,3),[5,7)}`).  A binary
stream sends them in their send formats instead, which hold each field or
bound in *its* send format; this module renders those as the server's output
functions would:

    record_send      int32 ncols, then per field: oid, int32 len (-1 NULL), bytes
                     -> record_out: `(f1,f2,...)`, NULL empty, a field quoted when
                        empty or holding `"` `\\` `(` `)` `,` or white space,
                        `"` and `\\` doubled inside the quotes
    range_send       flags byte, then the lower and upper bound (int32 len, bytes)
                     when present -> range_out: `empty`, or `[lo,hi)` with the
                     brackets the flags say, a bound quoted like a record field
                     (and also when holding `[` `]`)
    multirange_send  int32 count, then each range (int32 len, range_send bytes)
                     -> multirange_out: `{r1,r2,...}`
    array_send       as in `values.array_items` -> array_out: `{a,"b c",NULL}`,
                     `[0:1]=` for other lower bounds, an element quoted when empty,
                     `NULL`, or holding `"` `\\` `{` `}` the delimiter or white space,
                     with `\\` before `"` and `\\`

Each function takes the renderer of the values inside (bytes -> their text
output), looked up by type OID for a record's fields; a field of a type with
no exact text renderer is a `ValueError` naming the type, never a guess.
Pure: bytes in, text out.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Final

__all__ = [
    "PgText",
    "array_out",
    "multirange_out",
    "range_out",
    "record_out",
]

PgText = Callable[[bytes], str]

_I32 = struct.Struct("!i")
_FIELD = struct.Struct("!Ii")  # a record field's type oid and length
_ARRAY_HEAD = struct.Struct("!iiI")  # ndim, has-null flag, element type oid
_ARRAY_DIM = struct.Struct("!ii")  # size, lower bound

# range flags (rangetypes.h)
_EMPTY: Final = 0x01
_LB_INC: Final = 0x02
_UB_INC: Final = 0x04
_LB_INF: Final = 0x08
_UB_INF: Final = 0x10
_KNOWN_FLAGS: Final = 0x1F

_SPACE: Final = frozenset(" \t\n\r\v\f")  # isspace() in the C locale
_RECORD_SPECIAL: Final = frozenset('"\\(),') | _SPACE
_RANGE_SPECIAL: Final = _RECORD_SPECIAL | frozenset("[]")


def _quote_doubled(text: str, special: frozenset[str]) -> str:
    """record_out's and range_bound_escape's quoting: `"..."` with `"` and `\\` doubled."""
    if text and special.isdisjoint(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'


def record_out(data: bytes, field_text: Callable[[int], PgText | None]) -> str:
    """record_send -> record_out's text; `field_text(oid)` renders a field of that type, or None if it cannot."""
    end = len(data)
    ncols = _I32.unpack_from(data)[0]
    if ncols < 0:
        raise ValueError(f"record of {ncols} columns")
    pos = 4
    parts = []
    for _ in range(ncols):
        oid, size = _FIELD.unpack_from(data, pos)
        pos += 8
        if size < 0:
            parts.append("")
            continue
        if pos + size > end:
            raise ValueError("record field runs past the end of the value")
        render = field_text(oid)
        if render is None:
            raise ValueError(
                f"record field of type oid {oid}, whose text form csnd cannot render from binary"
            )
        parts.append(_quote_doubled(render(data[pos : pos + size]), _RECORD_SPECIAL))
        pos += size
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last record field")
    return "(" + ",".join(parts) + ")"


def _range_at(data: bytes, pos: int, end: int, bound_text: PgText) -> str:
    """range_send's value in data[pos:end] -> range_out's text."""
    if pos >= end:
        raise ValueError("range value without its flags")
    flags = data[pos]
    pos += 1
    if flags & ~_KNOWN_FLAGS & 0xFF:
        raise ValueError(f"range flags 0x{flags:02x}")
    if flags & _EMPTY:
        if pos != end:
            raise ValueError("bytes after an empty range")
        return "empty"
    bounds = []
    for infinite in (flags & _LB_INF, flags & _UB_INF):
        if infinite:
            bounds.append("")
            continue
        size = _I32.unpack_from(data, pos)[0]
        pos += 4
        if size < 0 or pos + size > end:
            raise ValueError("range bound runs past the end of the value")
        bounds.append(_quote_doubled(bound_text(data[pos : pos + size]), _RANGE_SPECIAL))
        pos += size
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the range's bounds")
    lower = "[" if flags & _LB_INC else "("
    upper = "]" if flags & _UB_INC else ")"
    return f"{lower}{bounds[0]},{bounds[1]}{upper}"


def range_out(data: bytes, bound_text: PgText) -> str:
    """range_send -> range_out's text, each bound rendered by `bound_text`."""
    return _range_at(data, 0, len(data), bound_text)


def multirange_out(data: bytes, bound_text: PgText) -> str:
    """multirange_send -> multirange_out's text."""
    end = len(data)
    count = _I32.unpack_from(data)[0]
    if count < 0:
        raise ValueError(f"multirange of {count} ranges")
    pos = 4
    ranges = []
    for _ in range(count):
        size = _I32.unpack_from(data, pos)[0]
        pos += 4
        if size < 0 or pos + size > end:
            raise ValueError("range runs past the end of the multirange")
        ranges.append(_range_at(data, pos, pos + size, bound_text))
        pos += size
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last range")
    return "{" + ",".join(ranges) + "}"


def _quote_array_element(text: str, delimiter: str) -> str:
    """array_out's quoting of one element: `"..."` with `\\` before `"` and `\\`."""
    if (
        text
        and not (len(text) == 4 and text.upper() == "NULL")
        and _SPACE.isdisjoint(text)
        and not any(c in text for c in ('"', "\\", "{", "}", delimiter))
    ):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def array_out(data: bytes, elem_oid: int, elem_text: PgText, delimiter: str = ",") -> str:
    """array_send -> array_out's text (the form an array has inside a record or a range)."""
    ndim, _flags, oid = _ARRAY_HEAD.unpack_from(data)
    if oid != elem_oid:
        raise ValueError(f"array of element type {oid}, expected {elem_oid}")
    if ndim == 0:
        return "{}"
    if not 0 < ndim <= 6:
        raise ValueError(f"array of {ndim} dimensions")
    pos = _ARRAY_HEAD.size
    dims: list[int] = []
    lowers: list[int] = []
    for _ in range(ndim):
        size, lower = _ARRAY_DIM.unpack_from(data, pos)
        dims.append(size)
        lowers.append(lower)
        pos += _ARRAY_DIM.size
    end = len(data)
    items: list[str] = []
    count = 1
    for size in dims:
        count *= size
    for _ in range(count):
        size = _I32.unpack_from(data, pos)[0]
        pos += 4
        if size < 0:
            items.append("NULL")
            continue
        if pos + size > end:
            raise ValueError("array element runs past the end of the value")
        items.append(_quote_array_element(elem_text(data[pos : pos + size]), delimiter))
        pos += size
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last array element")
    for size in reversed(dims[1:]):
        items = ["{" + delimiter.join(items[i : i + size]) + "}" for i in range(0, len(items), size)]
    text = "{" + delimiter.join(items) + "}"
    if any(lower != 1 for lower in lowers):
        bounds = "".join(f"[{lo}:{lo + size - 1}]" for lo, size in zip(lowers, dims, strict=True))
        text = f"{bounds}={text}"
    return text
