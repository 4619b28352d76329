"""PostgreSQL arrays, both forms: array_send's binary elements and array_out's text.

Split from `decoder.values` (which builds every type's rules and re-exports
these): an array's rule is its element type's rule applied to each element,
nested by dimension, so one module holds the walking of both forms and the
element rules stay with their types.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Any

JsonValue = Any
BinaryDecoder = Callable[[bytes], JsonValue]
TextDecoder = Callable[[str], JsonValue]

_I32 = struct.Struct("!i")
_ARRAY_HEAD = struct.Struct("!iiI")  # ndim, has-null flag, element type oid
_ARRAY_DIM = struct.Struct("!ii")  # size, lower bound

__all__ = ["BinaryDecoder", "JsonValue", "TextDecoder", "array_items", "binary_array", "text_array"]


# --- arrays --------------------------------------------------------------------------


def array_items(
    data: bytes, elem_oid: int, elem: Callable[[bytes], Any], null: Any
) -> tuple[list[Any], list[int]]:
    """array_send's elements, flat, each through `elem` (`null` for a NULL), and the dimension sizes.

    array_send: ndim, has-null flag, element oid, (size, lower bound) per
    dimension, then each element as an int32 length (-1 for NULL) and its
    bytes.  Every length is checked; a zero-dimensional array gives ([], []).
    """
    ndim, _flags, oid = _ARRAY_HEAD.unpack_from(data)
    if oid != elem_oid:
        raise ValueError(f"array of element type {oid}, expected {elem_oid}")
    if ndim == 0:
        return [], []
    if not 0 < ndim <= 6:
        raise ValueError(f"array of {ndim} dimensions")
    pos = _ARRAY_HEAD.size
    dims = []
    count = 1
    for _ in range(ndim):
        size = _ARRAY_DIM.unpack_from(data, pos)[0]
        dims.append(size)
        count *= size
        pos += _ARRAY_DIM.size
    end = len(data)
    unpack = _I32.unpack_from
    items: list[Any] = []
    append = items.append
    for _ in range(count):
        size = unpack(data, pos)[0]
        pos += 4
        if size < 0:
            append(null)
        else:
            if pos + size > end:
                raise ValueError("array element runs past the end of the value")
            append(elem(data[pos : pos + size]))
            pos += size
    if pos != end:
        raise ValueError(f"{end - pos} bytes after the last array element")
    return items, dims


def binary_array(elem_oid: int, elem: BinaryDecoder) -> BinaryDecoder:
    """array_send -> nested JSON arrays of the element rule."""

    def decode(data: bytes) -> JsonValue:
        items, dims = array_items(data, elem_oid, elem, None)
        for size in reversed(dims[1:]):
            items = [items[i : i + size] for i in range(0, len(items), size)]
        return items

    return decode


_ARRAY_UNESCAPE = re.compile(r"\\(.)", re.S)
_ARRAY_TOKENS: dict[str, re.Pattern[str]] = {}


def text_array(elem: TextDecoder, delimiter: str = ",") -> TextDecoder:
    """array_out's form: `{a,"b c",NULL,{..}}`, optional `[lo:hi]=` bounds, quoted with `\\`."""
    tokens = _ARRAY_TOKENS.get(delimiter)
    if tokens is None:
        d = re.escape(delimiter)
        tokens = re.compile(rf'\{{|\}}|{d}|"((?:[^"\\]|\\.)*)"|([^{{}}"{d}]+)', re.S)
        _ARRAY_TOKENS[delimiter] = tokens

    def decode(text: str) -> JsonValue:
        if text[:1] == "{" and '"' not in text and text.count("{") == 1 and text[-1:] == "}":
            # one dimension, nothing quoted: the common case, split at once
            inner = text[1:-1]
            if not inner:
                return []
            return [None if len(v) == 4 and v.upper() == "NULL" else elem(v) for v in inner.split(delimiter)]
        pos = 0
        if text[:1] == "[":  # dimension decoration of non-default lower bounds
            pos = text.index("=") + 1
        stack: list[list[JsonValue]] = []
        result: list[JsonValue] | None = None
        for m in tokens.finditer(text, pos):
            if m.start() != pos or result is not None:
                raise ValueError(f"malformed array text at offset {pos}")
            pos = m.end()
            tok = m.group()
            if tok == "{":
                stack.append([])
            elif tok == "}":
                done = stack.pop()
                if stack:
                    stack[-1].append(done)
                else:
                    result = done
            elif tok != delimiter:
                quoted = m.group(1)
                if quoted is not None:
                    stack[-1].append(elem(_ARRAY_UNESCAPE.sub(r"\1", quoted) if "\\" in quoted else quoted))
                else:
                    stack[-1].append(None if len(tok) == 4 and tok.upper() == "NULL" else elem(tok))
        if result is None or pos != len(text):
            raise ValueError("unterminated array text")
        return result

    return decode
