"""Column values: PostgreSQL wire forms -> the JSON values of docs/design.md section 7.

pgoutput sends each column either in the type's *binary send format* (`'b'`,
binary streams) or as the type's *text output* (`'t'`, text streams -- and,
even in a binary stream, the few types without a send function, such as
`aclitem`).  So every type has a text decoder (str -> JSON value) and, when
csnd can render it exactly, a binary decoder (bytes -> JSON value); the row
decoder picks one per value by its wire kind.

Both decoders of a type must give the same JSON value, because a binary and a
text recording of a stream must give the same output.  Where the JSON rule is
"the PostgreSQL text form" (interval, time, inet, bit strings, ...), the binary
decoder renders that text form itself, exactly as PostgreSQL 15 does with its
default `DateStyle=ISO` and `IntervalStyle=postgres`.  A type whose binary form
cannot be rendered exactly (money: its text depends on the server's
`lc_monetary`; tstzrange: its bounds are printed in the server's TimeZone;
geometric types, tsvector) has no binary decoder: `binary_readable()` is
false, and its Relation message fails with an error that says to use text
mode -- never a wrong value.  The built-in ranges and multiranges of other
bounds are rendered to their text form (`decoder.pgtext`), and so are the
fields, bounds and elements inside composites, ranges and arrays (`pg_text`).  Text in a
binary value (text, varchar, xml, enum labels) is in the connection's client
encoding, which must be UTF-8, psycopg's default.

Dates, times and intervals live in `decoder.temporal`.  psycopg's C loaders
decode binary numeric here and timestamps there fastest; they do not check
lengths, so each fixed-size value is length-checked first.  The catalogue of
built-in type names, OIDs and array types is psycopg's too.

Rows do not go through these values on the hot path: `decoder.jsontext` turns
each column into JSON text with builders held to these decoders (and passes
jsonb's text through, so its numbers keep every digit).  Known limit: a `json`
(not jsonb) number beyond double precision loses digits, since json's text is
parsed and re-encoded.
"""

from __future__ import annotations

import decimal
import json
import re
import struct
from decimal import Decimal
from typing import Final

from psycopg import postgres
from psycopg.adapt import Transformer
from psycopg.pq import Format
from psycopg.types.multirange import MultirangeInfo
from psycopg.types.range import RangeInfo

from csnd.core.ids import lsn_to_str
from csnd.decoder import pgtext
from csnd.decoder import temporal as T

# (re-exported: the other decoder modules and the tests name these through `values`)
from csnd.decoder.arrays import BinaryDecoder as BinaryDecoder
from csnd.decoder.arrays import JsonValue as JsonValue
from csnd.decoder.arrays import TextDecoder as TextDecoder
from csnd.decoder.arrays import array_items as array_items
from csnd.decoder.arrays import binary_array as binary_array
from csnd.decoder.arrays import text_array as text_array

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_I64 = struct.Struct("!q")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_F32 = struct.Struct("!f")
_F64 = struct.Struct("!d")
_NUMERIC_HEAD = struct.Struct("!HhHH")  # ndigits, weight, sign, dscale
_TID = struct.Struct("!IH")

_load_numeric = Transformer().get_loader(1700, Format.BINARY).load


def _fixed(size: int, what: str, data: bytes) -> None:
    if len(data) != size:
        raise ValueError(f"{what} value of {len(data)} bytes, expected {size}")


# --- numbers ---------------------------------------------------------------------

_FLOAT_SPECIAL: Final[dict[str, str]] = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}
_INF: Final = float("inf")
_INF_DECIMAL: Final = Decimal("Infinity")
_FLOAT4_MAX_BITS: Final = 0x7F7FFFFF


def _float_json(x: float) -> JsonValue:
    if x != x:
        return "NaN"
    if x in (_INF, -_INF):
        return "Infinity" if x > 0 else "-Infinity"
    return x


# Exact decimal arithmetic for float4 bounds: a float4 and the midpoints around it
# have at most ~110 significant decimal digits.
_EXACT: Final = decimal.Context(prec=200)


def float4_shortest(x: float) -> JsonValue:
    """The decimal float4out (PostgreSQL's Ryu) prints for float4 `x`, as a Python float.

    Ryu's choice, checked against the server bit pattern by bit pattern in the
    tests: the fewest significant digits strictly inside x's rounding interval
    (the bounds themselves excluded), the nearest to x of those, a tie going to
    the even last digit.  For each length the candidates are the correctly
    rounded decimal and its two neighbours.  The float64 of that decimal
    prints as the same digits, so the JSON shows what PostgreSQL shows.
    """
    if x != x or x in (_INF, -_INF):
        return _float_json(x)
    if x == 0:
        return x  # keeps -0.0
    a = abs(x)
    bits = _U32.unpack(_F32.pack(a))[0]
    below = _F32.unpack(_U32.pack(bits - 1))[0]
    above = a + (a - below) if bits == _FLOAT4_MAX_BITS else _F32.unpack(_U32.pack(bits + 1))[0]
    exact, lo, hi = Decimal(a), Decimal((a + below) / 2), Decimal((a + above) / 2)
    for p in range(9):
        mantissa, _, exp = f"{a:.{p}e}".partition("e")
        rounded = int(mantissa.replace(".", ""))
        best: Decimal | None = None
        best_gap = _INF_DECIMAL
        for digits in (rounded - 1, rounded, rounded + 1):
            d = Decimal(digits).scaleb(int(exp) - p, _EXACT)
            if lo < d < hi:
                gap = _EXACT.abs(_EXACT.subtract(d, exact))
                if gap < best_gap or (gap == best_gap and digits % 2 == 0):
                    best, best_gap = d, gap
        if best is not None:
            return float(best) if x > 0 else -float(best)
    raise AssertionError(f"no decimal of 9 digits reads back as float4 {x!r}")  # 9 digits always do


def _float4_bin(data: bytes) -> JsonValue:
    return float4_shortest(_F32.unpack(data)[0])


def _float4_text(text: str) -> JsonValue:
    # float4out already printed the shortest decimal (extra_float_digits >= 1,
    # the default since PostgreSQL 12): read it as it is.
    special = _FLOAT_SPECIAL.get(text)
    if special is not None:
        return special
    x = float(text)
    _F32.pack(x)  # OverflowError beyond float4's range: not a float4out text
    return x


def _float8_bin(data: bytes) -> JsonValue:
    return _float_json(_F64.unpack(data)[0])


def _float8_text(text: str) -> JsonValue:
    special = _FLOAT_SPECIAL.get(text)
    return special if special is not None else float(text)


def _numeric_bin(data: bytes) -> str:
    ndigits = _NUMERIC_HEAD.unpack_from(data)[0]
    _fixed(8 + 2 * ndigits, "numeric", data)
    value = _load_numeric(data)
    text = str(value)  # a third of format(value, "f"), and the same text unless in E notation
    return text if "E" not in text else format(value, "f")


def _int2_bin(data: bytes) -> int:
    return int(_I16.unpack(data)[0])


def _int4_bin(data: bytes) -> int:
    return int(_I32.unpack(data)[0])


def _int8_bin(data: bytes) -> int:
    return int(_I64.unpack(data)[0])


def _uint32_bin(data: bytes) -> int:
    return int(_U32.unpack(data)[0])


def _uint32_str(data: bytes) -> str:
    return str(_U32.unpack(data)[0])


def _uint64_str(data: bytes) -> str:
    return str(_U64.unpack(data)[0])


def _identity(text: str) -> str:
    return text


# The text decoder of every type whose JSON value is its text form as it came.
text_form: Final[TextDecoder] = _identity


# --- strings, bytes, json -----------------------------------------------------------


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


_BOOL_BIN: Final = {b"\x01": True, b"\x00": False}
_BOOL_TEXT: Final = {"t": True, "f": False}  # boolout; `true` is only bool::text's form


def _char_bin(data: bytes) -> str:
    """charout: the byte itself, `\\ooo` for a high-bit byte, '' for NUL."""
    _fixed(1, '"char"', data)
    ch = data[0]
    if ch == 0:
        return ""
    return f"\\{ch:03o}" if ch & 0x80 else chr(ch)


def _bytea_bin(data: bytes) -> str:
    return "\\x" + data.hex()


_BYTEA_ESCAPE = re.compile(rb"\\([0-3][0-7][0-7]|\\)")


def _bytea_text(text: str) -> str:
    if text.startswith("\\x"):
        return "\\x" + bytes.fromhex(text[2:]).hex()
    # bytea_output = 'escape': printable ASCII as is, `\\` and `\ooo` octal escapes
    raw = _BYTEA_ESCAPE.sub(
        lambda m: b"\\" if m.group(1) == b"\\" else bytes((int(m.group(1), 8),)), text.encode("ascii")
    )
    if b"\\" in _BYTEA_ESCAPE.sub(b"", text.encode("ascii")):
        raise ValueError(f"bad escape in bytea text {text[:40]!r}")
    return "\\x" + raw.hex()


def _json_bin(data: bytes) -> JsonValue:
    return json.loads(data.decode("utf-8"))


def _jsonb_text(text: str) -> JsonValue:
    # its own function, not json.loads: decoder.jsontext tells json and jsonb apart by decoder
    return json.loads(text)


def jsonb_payload(data: bytes) -> str:
    """jsonb_send's text: a version byte (1) and jsonb_out's text."""
    if data[:1] != b"\x01":
        raise ValueError(f"unsupported jsonb binary version {data[:1]!r}, expected 1")
    return data[1:].decode("utf-8")


def _jsonb_bin(data: bytes) -> JsonValue:
    return json.loads(jsonb_payload(data))


def _uuid_bin(data: bytes) -> str:
    _fixed(16, "uuid", data)
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _bits_bin(data: bytes) -> str:
    nbits = _I32.unpack_from(data)[0]
    body = data[4:]
    _fixed((nbits + 7) // 8, "bit string", body)
    if not nbits:
        return ""
    return format(int.from_bytes(body, "big"), f"0{len(body) * 8}b")[:nbits]


def _macaddr_bin(data: bytes) -> str:
    _fixed(6, "macaddr", data)
    return data.hex(":")


def _macaddr8_bin(data: bytes) -> str:
    _fixed(8, "macaddr8", data)
    return data.hex(":")


def _ipv6_text(addr: bytes) -> str:
    """inet_net_ntop_ipv6: longest zero run (>= 2 words, first wins) as `::`, IPv4 tails."""
    words = struct.unpack("!8H", addr)
    best_base, best_len, cur_base, cur_len = -1, 0, -1, 0
    for i, w in enumerate(words):
        if w == 0:
            if cur_base < 0:
                cur_base, cur_len = i, 0
            cur_len += 1
            if cur_len > best_len:
                best_base, best_len = cur_base, cur_len
        else:
            cur_base = -1
    if best_len < 2:
        best_base = -1
    out = []
    for i in range(8):
        if best_base >= 0 and best_base <= i < best_base + best_len:
            if i == best_base:
                out.append(":")
            continue
        if i:
            out.append(":")
        if i == 6 and best_base == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
            out.append(".".join(map(str, addr[12:])))
            break
        out.append(f"{words[i]:x}")
    if best_base >= 0 and best_base + best_len == 8:
        out.append(":")
    return "".join(out)


def _inet_bin(data: bytes) -> str:
    """inet_send / cidr_send: family, bits, is_cidr, length, address -> network_out's text."""
    family, bits, is_cidr, size = data[:4]
    addr = data[4:]
    if family == 2 and size == 4 and len(addr) == 4:
        text, max_bits = ".".join(map(str, addr)), 32
    elif family == 3 and size == 16 and len(addr) == 16:
        text, max_bits = _ipv6_text(addr), 128
    else:
        raise ValueError(f"bad inet value: family {family}, {size} address bytes, {len(data)} bytes in all")
    return f"{text}/{bits}" if is_cidr or bits != max_bits else text


def _pg_lsn_bin(data: bytes) -> str:
    return lsn_to_str(_U64.unpack(data)[0])


def _tid_bin(data: bytes) -> str:
    block, offset = _TID.unpack(data)
    return f"({block},{offset})"


# --- enums -----------------------------------------------------------------------------
# enum_send writes the label as text, enum_out prints the label.

enum_binary: Final[BinaryDecoder] = _utf8
enum_text: Final[TextDecoder] = _identity

# --- the catalogue ---------------------------------------------------------------------

_SCALARS: Final[dict[str, tuple[BinaryDecoder | None, TextDecoder]]] = {
    "bool": (_BOOL_BIN.__getitem__, _BOOL_TEXT.__getitem__),
    "bytea": (_bytea_bin, _bytea_text),
    "char": (_char_bin, _identity),
    "name": (_utf8, _identity),
    "int8": (_int8_bin, int),
    "int2": (_int2_bin, int),
    "int4": (_int4_bin, int),
    "text": (_utf8, _identity),
    "oid": (_uint32_bin, int),
    "tid": (_tid_bin, _identity),
    "xid": (_uint32_str, _identity),
    "cid": (_uint32_str, _identity),
    "xid8": (_uint64_str, _identity),
    "json": (_json_bin, json.loads),
    "xml": (_utf8, _identity),  # xml_send is xml_out's text in the client encoding (UTF-8)
    "float4": (_float4_bin, _float4_text),
    "float8": (_float8_bin, _float8_text),
    "macaddr": (_macaddr_bin, _identity),
    "macaddr8": (_macaddr8_bin, _identity),
    "inet": (_inet_bin, _identity),
    "cidr": (_inet_bin, _identity),
    "bpchar": (_utf8, _identity),
    "varchar": (_utf8, _identity),
    "date": (T.date_binary, T.date_text),
    "time": (T.time_binary, _identity),
    "timestamp": (T.timestamp_binary, T.timestamp_text),
    "timestamptz": (T.timestamptz_binary, T.timestamptz_text),
    "interval": (T.interval_binary, _identity),
    "timetz": (T.timetz_binary, _identity),
    "bit": (_bits_bin, _identity),
    "varbit": (_bits_bin, _identity),
    "numeric": (_numeric_bin, _identity),
    "uuid": (_uuid_bin, _identity),
    "pg_lsn": (_pg_lsn_bin, _identity),
    "jsonb": (_jsonb_bin, _jsonb_text),
}

# --- PostgreSQL's text output from binary: fields, bounds and elements of containers --------
# A composite's field, a range's bound and an array's element inside them are
# written in their type's text output (`decoder.pgtext`), not in the JSON rule.
# For most types the JSON value *is* that text (the string types above); these
# are the others, rendered as PostgreSQL 15-18 print them with DateStyle ISO.
# float4 and float8 are left out: float8out's switch to exponent notation is not
# Python's, and a guess is never written.


def _date_out(data: bytes) -> str:
    """date_out: `YYYY-MM-DD`, ` BC` for years before 1, the infinities."""
    days = _I32.unpack(data)[0]
    if days in (T.INT32_MAX, T.INT32_MIN):
        return "infinity" if days > 0 else "-infinity"
    return T.pg_date_text(days)


def _timestamp_out(data: bytes) -> str:
    """timestamp_out: `YYYY-MM-DD HH:MM:SS[.ffffff]` (fraction zeros dropped), ` BC`, the infinities."""
    us = _I64.unpack(data)[0]
    if us in (T.INT64_MAX, T.INT64_MIN):
        return "infinity" if us > 0 else "-infinity"
    days, rest = divmod(us, T.US_PER_DAY)
    day = T.pg_date_text(days)
    clock = T.clock_text(rest)
    return f"{day[:-3]} {clock} BC" if day.endswith(" BC") else f"{day} {clock}"


def _bool_out(data: bytes) -> str:
    return "t" if _BOOL_BIN[data] else "f"


_PG_TEXT_OTHERS: Final[dict[str, pgtext.PgText]] = {
    "bool": _bool_out,
    "int2": lambda data: str(_int2_bin(data)),
    "int4": lambda data: str(_int4_bin(data)),
    "int8": lambda data: str(_int8_bin(data)),
    "oid": lambda data: str(_uint32_bin(data)),
    "json": _utf8,
    "jsonb": jsonb_payload,
    "date": _date_out,
    "timestamp": _timestamp_out,
}
# Types whose JSON value is their text output (a str from the binary decoder above).
_PG_TEXT_AS_JSON: Final = frozenset(
    (
        "bytea", "char", "name", "text", "tid", "xid", "cid", "xid8", "xml", "macaddr", "macaddr8",
        "inet", "cidr", "bpchar", "varchar", "time", "interval", "timetz", "bit", "varbit", "numeric",
        "uuid", "pg_lsn",
    )
)  # fmt: skip
# Ranges whose bounds' text does not depend on the session: tstzrange's bounds are
# printed in the server's TimeZone, which a binary value does not carry.
_TIME_ZONE_RANGES: Final = frozenset(("tstzrange", "tstzmultirange"))

# Types without a send function (aclitem, gtsvector): PostgreSQL 15's pgoutput
# sends them as text even in a binary stream, so a binary stream can carry them.
_TEXT_IN_BINARY_STREAMS: Final = frozenset((1033, 3642))

_OID_BY_NAME: Final[dict[str, int]] = {"char": 18, "_char": 1002}
_BINARY: Final[dict[int, BinaryDecoder]] = {}
_TEXT: Final[dict[int, TextDecoder]] = {}
_NAMES: Final[dict[int, str]] = {18: "char", 1002: "_char"}
_PG_TEXT: Final[dict[int, pgtext.PgText]] = {}
# Why a built-in type has no binary decoder, where the reason is not "csnd has none".
_NO_BINARY_WHY: Final[dict[int, str]] = {790: "its text depends on the server's lc_monetary"}
# (oid, name, element oid or None, array delimiter) of every built-in type, scalars first
_CATALOGUE: Final[list[tuple[int, str, int | None, str]]] = []


def _build_catalogue() -> None:
    infos = [(t.name, t.oid, t.array_oid, t.delimiter) for t in postgres.types if t.oid]
    for name, oid, array_oid, delimiter in [*infos, ("char", 18, 1002, ",")]:
        if name.startswith("_") or name.endswith("[]"):
            continue
        _OID_BY_NAME[name] = oid
        _NAMES[oid] = name
        binary, text = _SCALARS.get(name, (None, _identity))
        _TEXT[oid] = text
        if binary is not None:
            _BINARY[oid] = binary
        _CATALOGUE.append((oid, name, None, delimiter))
        if name in _PG_TEXT_OTHERS:
            _PG_TEXT[oid] = _PG_TEXT_OTHERS[name]
        elif name in _PG_TEXT_AS_JSON and binary is not None:
            _PG_TEXT[oid] = binary
        if array_oid:
            _CATALOGUE.append((array_oid, "_" + name, oid, delimiter))
            _OID_BY_NAME["_" + name] = array_oid
            _NAMES[array_oid] = "_" + name
            _TEXT[array_oid] = text_array(text, delimiter)
            if binary is not None:
                _BINARY[array_oid] = binary_array(oid, binary)
            if oid in _PG_TEXT:
                _PG_TEXT[array_oid] = pg_array_text(oid, _PG_TEXT[oid], delimiter)
    for info in postgres.types:  # the built-in ranges and multiranges, once their bounds' types are known
        if not isinstance(info, (RangeInfo, MultirangeInfo)):
            continue
        subtype = info.subtype_oid
        if info.name in _TIME_ZONE_RANGES:
            _NO_BINARY_WHY[info.oid] = "its bounds' text depends on the server's TimeZone"
            continue
        bound = _PG_TEXT.get(subtype)
        if bound is None:
            continue
        decode = multirange_binary(bound) if "multirange" in info.name else range_binary(bound)
        _BINARY[info.oid] = _PG_TEXT[info.oid] = decode
        if info.array_oid:
            _BINARY[info.array_oid] = binary_array(info.oid, decode)
            _PG_TEXT[info.array_oid] = pg_array_text(info.oid, decode, info.delimiter)


def range_binary(bound: pgtext.PgText) -> BinaryDecoder:
    """range_send -> range_out's text (a range's JSON value), each bound through `bound`."""
    return lambda data: pgtext.range_out(data, bound)


def multirange_binary(bound: pgtext.PgText) -> BinaryDecoder:
    """multirange_send -> multirange_out's text (a multirange's JSON value)."""
    return lambda data: pgtext.multirange_out(data, bound)


def pg_array_text(elem_oid: int, elem: pgtext.PgText, delimiter: str = ",") -> pgtext.PgText:
    """array_send -> array_out's text: an array inside a composite or as a range's bound."""
    return lambda data: pgtext.array_out(data, elem_oid, elem, delimiter)


_build_catalogue()


def catalogue() -> list[tuple[int, str, int | None, str]]:
    """(oid, name, element oid or None, array delimiter) of every built-in type csnd knows."""
    return list(_CATALOGUE)


def binary_decoder(type_oid: int) -> BinaryDecoder | None:
    """The decoder of a built-in type's binary send format, or None if csnd has none."""
    return _BINARY.get(type_oid)


def text_decoder(type_oid: int) -> TextDecoder:
    """The decoder of a built-in type's text output; any other type keeps its text form."""
    return _TEXT.get(type_oid, _identity)


def pg_text(type_oid: int) -> pgtext.PgText | None:
    """The renderer of a built-in type's text output from its binary form, or None if csnd has none."""
    return _PG_TEXT.get(type_oid)


def no_binary_reason(type_oid: int) -> str | None:
    """Why a built-in type has no exact binary decoder, when there is more to say than that it has none."""
    return _NO_BINARY_WHY.get(type_oid)


def binary_readable(type_oid: int) -> bool:
    """Whether a binary stream can carry this built-in type in a form csnd decodes exactly."""
    return type_oid in _BINARY or type_oid in _TEXT_IN_BINARY_STREAMS


def builtin_type_oid(name: str) -> int | None:
    """A built-in type's OID by its pg_type name (`int4`, `_int4`), for domains over it."""
    return _OID_BY_NAME.get(name)


def builtin_type_name(type_oid: int) -> str | None:
    """A built-in type's pg_type name, for messages."""
    return _NAMES.get(type_oid)
