"""PostgreSQL column types of the synthetic cluster: wire forms and JSON forms.

Every generated value is held as a plain Python value and turned, once, into
a *cell*:

    (wire, json, size)

- `wire` is what pgoutput puts in tuple data: `bytes` in the type's binary send
  format (`"binary": true` streams) or `str` in its text output form
  (`"binary": false`), exactly as PostgreSQL 15 writes them with `DateStyle=ISO`
  and `TimeZone=UTC` (tests compare them with a real server's `*_send` and
  output functions);
- `json` is the value as docs/design.md section 7 renders it in the transaction JSON
  lines -- the oracle's side, computed from the Python value, never from the
  wire bytes;
- `size` is a mode-independent estimate of the value's size in the heap tuple.
  WAL positions are derived from it, so a text and a binary recording of the
  same seed have the same LSNs and the same expected output.

The encoders are written out here instead of borrowed from psycopg's dumpers:
psycopg cannot dump +-infinity timestamps or dates, or multi-dimensional
arrays with NULLs without a connection, and these run once per generated
value, so they are kept to a `struct.pack` where possible.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from datetime import date, timedelta
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

from csnd.core.ids import PG_EPOCH

Json = Any
Wire = bytes | str | None  # None is SQL NULL (reader.pgoutput.TupleValue)
Cell = tuple[Wire, Json, int]

TIMESTAMP_INFINITY: Final = (1 << 63) - 1
TIMESTAMP_NEG_INFINITY: Final = -(1 << 63)
DATE_INFINITY: Final = (1 << 31) - 1
DATE_NEG_INFINITY: Final = -(1 << 31)
PG_EPOCH_DATE: Final = date(2000, 1, 1)

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_I64 = struct.Struct("!q")
_F64 = struct.Struct("!d")
_NUMERIC_HEAD = struct.Struct("!hhHh")  # ndigits, weight, sign, dscale
_NUMERIC_NAN: Final = _NUMERIC_HEAD.pack(0, 0, 0xC000, 0)

NULL_CELL: Final[Cell] = (None, None, 0)


class PgType:
    """One PostgreSQL type: pg_type OID, name, and its three renderings."""

    __slots__ = ("name", "oid", "binary", "text", "json", "size", "varlena")

    def __init__(
        self,
        name: str,
        oid: int,
        binary: Callable[[Any], bytes],
        text: Callable[[Any], str],
        to_json: Callable[[Any], Json],
        size: Callable[[Any], int],
        varlena: bool,
    ) -> None:
        self.name = name
        self.oid = oid
        self.binary = binary
        self.text = text
        self.json = to_json
        self.size = size
        self.varlena = varlena  # only varlena values can be TOASTed out of line

    def cell(self, value: Any, binary: bool) -> Cell:
        if value is None:
            return NULL_CELL
        wire = self.binary(value) if binary else self.text(value)
        return (wire, self.json(value), self.size(value))

    def __repr__(self) -> str:
        return f"PgType({self.name}, {self.oid})"


def _const(n: int) -> Callable[[Any], int]:
    return lambda _v: n


def _same(v: Any) -> Any:
    return v


# --- scalars ------------------------------------------------------------------


def _bool_bin(v: bool) -> bytes:
    return b"\x01" if v else b"\x00"


def _text_bin(v: str) -> bytes:
    return v.encode("utf-8")


def _text_size(v: str) -> int:
    return len(v) + 4


def float8_text(v: float) -> str:
    """float8out with extra_float_digits=1: the shortest exact decimal, PG's layout.

    Python's repr() finds the same shortest digits; PostgreSQL writes fixed
    notation for decimal exponents -4..14 and `d.ddde+XX` otherwise.
    """
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    sign, digit_tuple, exp = Decimal(repr(v)).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exp, int)
    exp10 = exp + len(digit_tuple) - 1  # position of the first digit
    neg = "-" if sign else ""
    if -4 <= exp10 < 15:
        if exp10 < 0:
            body = "0." + "0" * (-exp10 - 1) + digits
        elif len(digits) <= exp10 + 1:
            body = digits + "0" * (exp10 + 1 - len(digits))
        else:
            body = digits[: exp10 + 1] + "." + digits[exp10 + 1 :]
        return neg + body
    mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{neg}{mant}e{'-' if exp10 < 0 else '+'}{abs(exp10):02d}"


def _float8_json(v: float) -> Json:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def numeric_binary(v: Decimal) -> bytes:
    """numeric_send: base-10000 digits without leading/trailing zero groups, dscale kept."""
    if v.is_nan():
        return _NUMERIC_NAN
    exp = v.as_tuple().exponent
    assert isinstance(exp, int)
    dscale = max(0, -exp)
    text = format(abs(v), "f")
    int_part, _, frac_part = text.partition(".")
    int_part = int_part.lstrip("0")
    int_part = "0" * (-len(int_part) % 4) + int_part
    frac_part = frac_part + "0" * (-len(frac_part) % 4)
    groups = [int(int_part[i : i + 4]) for i in range(0, len(int_part), 4)]
    weight = len(groups) - 1
    groups += [int(frac_part[i : i + 4]) for i in range(0, len(frac_part), 4)]
    start = 0
    while start < len(groups) and groups[start] == 0:
        start += 1
        weight -= 1
    end = len(groups)
    while end > start and groups[end - 1] == 0:
        end -= 1
    digits = groups[start:end]
    if not digits:
        return _NUMERIC_HEAD.pack(0, 0, 0, dscale)
    sign = 0x4000 if v < 0 else 0
    return _NUMERIC_HEAD.pack(len(digits), weight, sign, dscale) + struct.pack(f"!{len(digits)}h", *digits)


def numeric_text(v: Decimal) -> str:
    return "NaN" if v.is_nan() else format(v, "f")


def _numeric_size(v: Decimal) -> int:
    return 8 + len(v.as_tuple().digits) // 2


def _timestamptz_bin(us: int) -> bytes:
    return _I64.pack(us)


def timestamptz_text(us: int) -> str:
    """timestamptz_out in DateStyle ISO, TimeZone UTC: fraction without trailing zeros."""
    if us == TIMESTAMP_INFINITY:
        return "infinity"
    if us == TIMESTAMP_NEG_INFINITY:
        return "-infinity"
    dt = PG_EPOCH + timedelta(microseconds=us)
    frac = f".{dt.microsecond:06d}".rstrip("0") if dt.microsecond else ""
    return f"{dt:%Y-%m-%d %H:%M:%S}{frac}+00"


def timestamptz_json(us: int) -> str:
    if us == TIMESTAMP_INFINITY:
        return "infinity"
    if us == TIMESTAMP_NEG_INFINITY:
        return "-infinity"
    return (PG_EPOCH + timedelta(microseconds=us)).isoformat()


def date_text(days: int) -> str:
    if days == DATE_INFINITY:
        return "infinity"
    if days == DATE_NEG_INFINITY:
        return "-infinity"
    return (PG_EPOCH_DATE + timedelta(days=days)).isoformat()


def _uuid_bin(v: UUID) -> bytes:
    return v.bytes


def _uuid_text(v: UUID) -> str:
    return str(v)


def bytea_text(v: bytes) -> str:
    return "\\x" + v.hex()


def _bytea_size(v: bytes) -> int:
    return len(v) + 4


# jsonb: PostgreSQL keeps object keys sorted (shorter first, then bytewise) and
# prints `{"k": v, "k2": [1, 2]}` -- exactly json.dumps' default separators and
# escapes when the generator builds objects in that key order and uses no floats.


def jsonb_key_order(keys: list[str]) -> list[str]:
    return sorted(set(keys), key=lambda k: (len(k.encode("utf-8")), k.encode("utf-8")))


class _JsonbNull:
    """A jsonb `null` scalar, distinct from SQL NULL (which is Python None)."""

    def __repr__(self) -> str:
        return "JSONB_NULL"


JSONB_NULL: Final = _JsonbNull()


def jsonb_text(v: Json) -> str:
    return "null" if v is JSONB_NULL else json.dumps(v, ensure_ascii=False)


def _jsonb_bin(v: Json) -> bytes:
    return b"\x01" + jsonb_text(v).encode("utf-8")


def _jsonb_json(v: Json) -> Json:
    return None if v is JSONB_NULL else v


def _jsonb_size(v: Json) -> int:
    return len(jsonb_text(v)) + 8


# --- arrays -------------------------------------------------------------------
# An array value is a Python list, nested for several dimensions (rectangular),
# with None for NULL elements.


def _array_dims(v: list[Any]) -> list[int]:
    dims = []
    cur: Any = v
    while isinstance(cur, list):
        dims.append(len(cur))
        if not cur:
            return []  # '{}': zero dimensions
        cur = cur[0]
    return dims


def _flatten(v: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in v:
        if isinstance(x, list):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return out


def _array_binary(elem_oid: int, elem_bin: Callable[[Any], bytes]) -> Callable[[list[Any]], bytes]:
    def encode(v: list[Any]) -> bytes:
        dims = _array_dims(v)
        flat = _flatten(v) if dims else []
        has_null = any(x is None for x in flat)
        parts = [_I32.pack(len(dims)), _I32.pack(1 if has_null else 0), _I32.pack(elem_oid)]
        for d in dims:
            parts.append(_I32.pack(d) + _I32.pack(1))  # size, lower bound 1
        for x in flat:
            if x is None:
                parts.append(_I32.pack(-1))
            else:
                raw = elem_bin(x)
                parts.append(_I32.pack(len(raw)) + raw)
        return b"".join(parts)

    return encode


_ARRAY_SPECIAL = frozenset('{},"\\ \t\n\r\v\f')


def _array_elem_text(s: str) -> str:
    """array_out's quoting: quote empty, NULL-looking, or special-character elements."""
    if s == "" or s.upper() == "NULL" or any(c in _ARRAY_SPECIAL for c in s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


def _array_text(elem_text: Callable[[Any], str]) -> Callable[[Any], str]:
    def encode(v: Any) -> str:
        if isinstance(v, list):
            return "{" + ",".join(encode(x) for x in v) + "}"
        return "NULL" if v is None else _array_elem_text(elem_text(v))

    return encode


def _array_size(v: list[Any]) -> int:
    return 24 + 8 * len(_flatten(v)) + sum(len(x) for x in _flatten(v) if isinstance(x, str))


# --- the catalogue ------------------------------------------------------------

BOOL: Final = PgType("bool", 16, _bool_bin, lambda v: "t" if v else "f", _same, _const(1), False)
BYTEA: Final = PgType("bytea", 17, bytes, bytea_text, bytea_text, _bytea_size, True)
INT8: Final = PgType("int8", 20, _I64.pack, str, _same, _const(8), False)
INT4: Final = PgType("int4", 23, _I32.pack, str, _same, _const(4), False)
TEXT: Final = PgType("text", 25, _text_bin, _same, _same, _text_size, True)
FLOAT8: Final = PgType("float8", 701, _F64.pack, float8_text, _float8_json, _const(8), False)
INT4_ARRAY: Final = PgType(
    "_int4", 1007, _array_binary(23, _I32.pack), _array_text(str), _same, _array_size, True
)
TEXT_ARRAY: Final = PgType(
    "_text", 1009, _array_binary(25, _text_bin), _array_text(_same), _same, _array_size, True
)
VARCHAR: Final = PgType("varchar", 1043, _text_bin, _same, _same, _text_size, True)
DATE: Final = PgType("date", 1082, _I32.pack, date_text, date_text, _const(4), False)
TIMESTAMPTZ: Final = PgType(
    "timestamptz", 1184, _timestamptz_bin, timestamptz_text, timestamptz_json, _const(8), False
)
NUMERIC: Final = PgType("numeric", 1700, numeric_binary, numeric_text, numeric_text, _numeric_size, True)
UUID_T: Final = PgType("uuid", 2950, _uuid_bin, _uuid_text, _uuid_text, _const(16), False)
JSONB: Final = PgType("jsonb", 3802, _jsonb_bin, jsonb_text, _jsonb_json, _jsonb_size, True)

TYPES: Final = {
    t.name: t
    for t in (
        BOOL,
        BYTEA,
        INT8,
        INT4,
        TEXT,
        FLOAT8,
        INT4_ARRAY,
        TEXT_ARRAY,
        VARCHAR,
        DATE,
        TIMESTAMPTZ,
        NUMERIC,
        UUID_T,
        JSONB,
    )
}


def numeric_typmod(precision: int, scale: int) -> int:
    """atttypmod of numeric(p, s): ((p << 16) | s) + VARHDRSZ."""
    return ((precision << 16) | scale) + 4


def varchar_typmod(length: int) -> int:
    """atttypmod of varchar(n): n + VARHDRSZ."""
    return length + 4
