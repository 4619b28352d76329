"""Column values straight to JSON text: the decoder's hot path.

`decoder.values` turns a wire value into a Python value (str, int, float,
bool, list, dict); a row's body is the JSON text of those values.  Building a
dict per row and handing it to the json module cost about as much as decoding
the values themselves (the stdlib's `JSONEncoder.encode` even builds a new C
encoder per call), so each column gets a *JSON-text builder* here instead --
wire value in, the value's JSON text out -- and a row is a join of
`"name": <text>` pieces.

A builder must write exactly what `json.dumps(decoder(value),
ensure_ascii=False, allow_nan=False)` writes; `check_builders` in
`tests/decoder/test_values.py` checks that for every type and both wire
forms.  Builders exist for the shapes that are common and cheap to get right:

    integers          str() of the int                       int2, int4, int8, oid
    float8            repr(); NaN / +-Infinity as strings    float8
    bool              true / false
    strings           the decoder's str, quoted by json's     text, numeric, timestamptz,
                      C escaper                               uuid, inet, interval, ...
    jsonb             jsonb_out's text as it came, once its   jsonb
                      first and last characters look like
                      one JSON value (a literal: all of it)
    arrays            the element builder per element, nested by dimension
    anything else     the decoder's value through one prebuilt C encoder

jsonb is passed through because PostgreSQL already wrote it as canonical
JSON (`, ` and `: ` separators, keys in jsonb order, the escapes json uses)
in both wire forms; parsing and re-encoding it only lost digits of numbers
beyond double precision (`1.10` stays `1.10`, `1e400` no longer fails).  `json`
(not jsonb) keeps its input's spacing and duplicate keys, so it is parsed and
re-encoded like any other value.
"""

from __future__ import annotations

import json.encoder
import struct
from collections.abc import Callable
from typing import Any, Final

from csnd.decoder import values as V

__all__ = ["BinaryJson", "TextJson", "binary_json", "encode_value", "text_json"]

BinaryJson = Callable[[bytes], str]
TextJson = Callable[[str], str]


def _not_json(o: Any) -> Any:
    raise TypeError(f"a decoder returned {type(o).__name__}, which has no JSON form")


# One C encoder for the whole process (json.JSONEncoder.encode builds one per call).
_c_encode: Final = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, _not_json, json.encoder.encode_basestring, None, ": ", ", ", False, False, False
)
quote: Final[Callable[[str], str]] = json.encoder.encode_basestring


def encode_value(value: Any) -> str:
    """json.dumps(value, ensure_ascii=False, allow_nan=False), without building an encoder."""
    return "".join(_c_encode(value, 0))


_F64 = struct.Struct("!d").unpack
_ARRAY_HEAD = struct.Struct("!iiI")  # ndim, has-null flag, element type oid
_ARRAY_DIM = struct.Struct("!ii")  # size, lower bound

_FLOAT_SPECIAL: Final = {"NaN": '"NaN"', "Infinity": '"Infinity"', "-Infinity": '"-Infinity"'}
_FLOAT_NAMES: Final = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _float8_bin(data: bytes) -> str:
    text = repr(_F64(data)[0])
    # a finite float's repr ends in a digit; "nan" and "inf" do not
    return text if text[-1] <= "9" else _FLOAT_SPECIAL[_FLOAT_NAMES[text]]


def _float8_text(text: str) -> str:
    special = _FLOAT_SPECIAL.get(text)
    return special if special is not None else repr(float(text))


def _jsonb_bin(data: bytes) -> str:
    return _jsonb_text(V.jsonb_payload(data))


# What jsonb_out's text of one JSON value starts and ends with; a literal is whole.
_JSON_ENDS: Final = {"{": "}", "[": "]", '"': '"'}
_JSON_WORDS: Final = frozenset(("true", "false", "null"))
_DIGITS: Final = frozenset("0123456789")


def _jsonb_text(text: str) -> str:
    """jsonb_out's text is already the JSON value: checked only at its two ends (a literal whole)."""
    first, last = text[:1], text[-1:]
    if (
        (_JSON_ENDS.get(first) == last and len(text) > 1)
        or text in _JSON_WORDS
        or ((first == "-" or first in _DIGITS) and last in _DIGITS)
    ):
        return text
    raise ValueError(f"jsonb text {text[:40]!r} is not one JSON value")


_BOOL_BIN: Final = {b"\x01": "true", b"\x00": "false"}
_BOOL_TEXT: Final = {"t": "true", "f": "false"}

_INT_TYPES: Final = frozenset(("int2", "int4", "int8", "oid"))
# Types whose decoders return a str in both forms (quoted here as JSON strings).
_STRING_TYPES: Final = frozenset(
    (
        "bytea", "char", "name", "text", "tid", "xid", "cid", "xid8", "xml", "macaddr", "macaddr8",
        "inet", "cidr", "bpchar", "varchar", "date", "time", "timestamp", "timestamptz", "interval",
        "timetz", "bit", "varbit", "numeric", "uuid", "pg_lsn",
        # ranges and multiranges: their text output, rendered from binary by `decoder.pgtext`
        "int4range", "int8range", "numrange", "daterange", "tsrange", "tstzrange",
        "int4multirange", "int8multirange", "nummultirange", "datemultirange", "tsmultirange",
        "tstzmultirange",
    )
)  # fmt: skip


def _int_bin(decode: V.BinaryDecoder) -> BinaryJson:
    def build(data: bytes) -> str:
        return str(decode(data))

    return build


def _int_text(text: str) -> str:
    return str(int(text))


def _quoted(decode: Callable[[Any], Any]) -> Callable[[Any], str]:
    def build(raw: Any) -> str:
        return quote(decode(raw))

    return build


def _generic(decode: Callable[[Any], Any]) -> Callable[[Any], str]:
    def build(raw: Any) -> str:
        return "".join(_c_encode(decode(raw), 0))

    return build


_SPECIAL_BINARY: Final[dict[str, BinaryJson]] = {
    "float8": _float8_bin,
    "jsonb": _jsonb_bin,
    "bool": _BOOL_BIN.__getitem__,
}
_SPECIAL_TEXT: Final[dict[str, TextJson]] = {
    "float8": _float8_text,
    "jsonb": _jsonb_text,
    "bool": _BOOL_TEXT.__getitem__,
}


def _scalar_binary(name: str, decode: V.BinaryDecoder) -> BinaryJson:
    if name in _INT_TYPES:
        return _int_bin(decode)
    if name in _STRING_TYPES:
        return _quoted(decode)
    return _SPECIAL_BINARY.get(name) or _generic(decode)


def _scalar_text(name: str, decode: V.TextDecoder) -> TextJson:
    if decode is V.text_form:
        return quote
    if name in _INT_TYPES:
        return _int_text
    if name in _STRING_TYPES:
        return _quoted(decode)
    return _SPECIAL_TEXT.get(name) or _generic(decode)


# Integer elements: struct code of their (length, value) pair in array_send, and the value's size.
_INT_ELEMENTS: Final = {"int2": ("ih", 2), "int4": ("ii", 4), "int8": ("iq", 8), "oid": ("iI", 4)}


# Integer arrays of up to this many elements take the fast path of `_binary_array`.
_INT_ARRAY_FAST_MAX: Final = 256
_I32_AT = struct.Struct("!i").unpack_from


def _int_array_reader(code: str, count: int) -> tuple[struct.Struct, str]:
    """The struct of `count` (length, value) pairs of struct code `code`, and the %-format of their JSON text."""
    return struct.Struct("!" + code * count), "[" + ", ".join(["%d"] * count) + "]"


def _binary_array(elem_oid: int, elem: BinaryJson, elem_name: str) -> BinaryJson:
    """array_send -> JSON text: `values.array_items` with JSON-text elements, nested by dimension.

    A one-dimensional integer array without NULLs of up to
    `_INT_ARRAY_FAST_MAX` elements, the common case, is one prefix compare
    (ndim 1, no NULLs, the element type), one struct call for all its
    elements and one %-format; anything else (or anything that does not add
    up) takes the checked walk.
    """
    int_code, int_size = _INT_ELEMENTS.get(elem_name, ("", 0))
    one_dim_bytes = _ARRAY_HEAD.size + _ARRAY_DIM.size
    head = _ARRAY_HEAD.pack(1, 0, elem_oid)
    readers: dict[int, tuple[struct.Struct, str]] = {}  # by element count, made as met
    pair_bytes = 4 + int_size

    def build(data: bytes) -> str:
        if int_code and data.startswith(head) and len(data) >= one_dim_bytes:
            count = _I32_AT(data, _ARRAY_HEAD.size)[0]
            if 0 <= count <= _INT_ARRAY_FAST_MAX and len(data) == one_dim_bytes + count * pair_bytes:
                reader = readers.get(count)
                if reader is None:
                    reader = readers[count] = _int_array_reader(int_code, count)
                pairs = reader[0].unpack_from(data, one_dim_bytes)
                if pairs[0::2].count(int_size) == count:
                    return reader[1] % pairs[1::2]
        items, dims = V.array_items(data, elem_oid, elem, "null")
        for size in reversed(dims[1:]):
            items = ["[" + ", ".join(items[i : i + size]) + "]" for i in range(0, len(items), size)]
        return "[" + ", ".join(items) + "]"

    return build


def _text_array(decode: V.TextDecoder, elem: TextJson, delimiter: str) -> TextJson:
    """array_out's text -> JSON text: one dimension with nothing quoted at once, else via the decoder."""
    slow = _generic(decode)

    def build(text: str) -> str:
        if text[:1] == "{" and '"' not in text and text.count("{") == 1 and text[-1:] == "}":
            inner = text[1:-1]
            if not inner:
                return "[]"
            return (
                "["
                + ", ".join(
                    [
                        "null" if len(v) == 4 and v.upper() == "NULL" else elem(v)
                        for v in inner.split(delimiter)
                    ]
                )
                + "]"
            )
        return slow(text)

    return build


# Builders by the decoder they stand for: a domain, an enum or a type resolved
# through a Type message reuses a built-in decoder and so finds its builder.
# Decoders shared by several types (utf-8 text, `int`) give those types the same
# JSON shape, so one builder serves them all.
_BY_BINARY: Final[dict[Any, BinaryJson]] = {}
_BY_TEXT: Final[dict[Any, TextJson]] = {}


def _build_catalogue() -> None:
    elements: dict[int, tuple[TextJson, BinaryJson | None]] = {}
    for oid, name, elem_oid, delimiter in V.catalogue():
        binary, text = V.binary_decoder(oid), V.text_decoder(oid)
        if elem_oid is None:
            text_build = _BY_TEXT.setdefault(text, _scalar_text(name, text))
            binary_build = (
                None if binary is None else _BY_BINARY.setdefault(binary, _scalar_binary(name, binary))
            )
            elements[oid] = (text_build, binary_build)
            continue
        elem_text, elem_binary = elements[elem_oid]
        _BY_TEXT[text] = _text_array(text, elem_text, delimiter)
        if binary is not None and elem_binary is not None:
            _BY_BINARY[binary] = _binary_array(elem_oid, elem_binary, name[1:])


def binary_json(decode: V.BinaryDecoder) -> BinaryJson:
    """The JSON-text builder standing for binary decoder `decode` (any decoder: unknown ones are encoded)."""
    return _BY_BINARY.get(decode) or _generic(decode)


def text_json(decode: V.TextDecoder) -> TextJson:
    """The JSON-text builder standing for text decoder `decode` (see `binary_json`)."""
    return _BY_TEXT.get(decode) or _generic(decode)


_build_catalogue()


# The types whose values the compiled row reader (`_rows.c`) writes itself, by
# the code it knows them by.  Keyed by a column's pair of builders: a column
# whose builders are these writes the same text as the compiled reader.  Any
# other column is written by its own builders, called from the compiled reader:
# code 'S' when its text form is its JSON string (the text builder is `quote`,
# which the reader applies itself), '?' otherwise.
_COMPILED_TYPES: Final = {
    "int2": "h", "int4": "i", "int8": "q", "bool": "b",
    "text": "s", "varchar": "s", "bpchar": "s", "name": "s",
    "numeric": "N", "timestamptz": "T", "timestamp": "t", "date": "d", "uuid": "u",
    "bytea": "x", "float8": "f", "float4": "F", "jsonb": "J", "time": "C", "interval": "V",
    "_int2": "a", "_int4": "A", "_int8": "L",
}  # fmt: skip
_COMPILED_CODES: Final[dict[tuple[BinaryJson, TextJson], str]] = {}
for _name, _code in _COMPILED_TYPES.items():
    _oid = V.builtin_type_oid(_name)
    assert _oid is not None, _name
    _binary = V.binary_decoder(_oid)
    assert _binary is not None, _name
    _COMPILED_CODES[(binary_json(_binary), text_json(V.text_decoder(_oid)))] = _code

Builders = tuple[tuple[BinaryJson, TextJson], ...]


def compiled_codes(columns: list[tuple[str, BinaryJson, TextJson]]) -> tuple[bytes, Builders]:
    """The compiled row reader's code of each column (`key, binary builder, text builder`), and their builders."""
    codes = [
        _COMPILED_CODES.get((binary, text)) or ("S" if text is quote else "?") for _, binary, text in columns
    ]
    return "".join(codes).encode(), tuple((binary, text) for _, binary, text in columns)
