"""COPY rows -> the tuple data of a pgoutput Insert, so the stream's decoder renders them.

A binary COPY (`COPY ... TO STDOUT (FORMAT binary)`) row is an int16 field
count, then per field an int32 length (-1: NULL) and the value in its type's
binary send format -- the form a binary pgoutput stream carries.  pgoutput's
TupleData is the same with a kind byte before each field (`n` NULL, `b`
binary, `t` text).  So a snapshot row becomes the data of an Insert message
(`N` + TupleData) and goes through `decoder.rows.row_change_body`, the very
code that renders the stream: a read's values equal a streamed insert's,
type for type (docs/design.md invariant 5).

A text COPY (the default format) row is its fields' output-function text,
tab-separated, `\\N` for NULL, with backslash escapes; unescaped, each field
is a `t` value, as a text stream (`--text`) sends it.

Both parsers are incremental and pure: `feed()` takes what the server sent
(blocks need not end on row boundaries) and returns the rows it completed;
`finish()` says whether the stream ended where it may.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Final

from csnd.core.compiled import compiled_module

SIGNATURE: Final = b"PGCOPY\n\xff\r\n\x00"
_HEAD: Final = struct.Struct("!II")  # flags, header extension length
_I16: Final = struct.Struct("!h")
_I32: Final = struct.Struct("!i")
_unpack_i16: Final = _I16.unpack_from
_unpack_i32: Final = _I32.unpack_from

_NULL: Final = b"n"
_BINARY: Final = b"b"
_TEXT: Final = b"t"
_NEW: Final = b"N"


# The signature and the fixed part of a binary COPY's header (flags, extension length).
HEADER_SIZE: Final = len(SIGNATURE) + _HEAD.size


def binary_header_end(data: bytes | bytearray) -> int | None:
    """Where a binary COPY's rows start (after its header and extension), or None when the header is not whole
    or not PGCOPY's (`BinaryCopyRows` names the error)."""
    if len(data) < HEADER_SIZE or bytes(data[: len(SIGNATURE)]) != SIGNATURE:
        return None
    _flags, ext = _HEAD.unpack_from(data, len(SIGNATURE))
    end = HEADER_SIZE + ext
    return end if end <= len(data) else None


class CopyFormatError(ValueError):
    """The COPY data does not follow its format (the caller names node and table)."""


class BinaryCopyRows:
    """`COPY ... (FORMAT binary)` data -> one Insert tuple (`N` + TupleData) per row."""

    __slots__ = ("_buf", "_header_done", "_ended", "rows")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._header_done = False
        self._ended = False
        self.rows = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf
        buf += data
        pos = 0
        end = len(buf)
        if not self._header_done:
            if end < len(SIGNATURE) + _HEAD.size:
                return []
            if bytes(buf[: len(SIGNATURE)]) != SIGNATURE:
                raise CopyFormatError("binary COPY data without the PGCOPY signature")
            _flags, ext = _HEAD.unpack_from(buf, len(SIGNATURE))
            pos = len(SIGNATURE) + _HEAD.size + ext
            if pos > end:
                return []
            self._header_done = True
        if not self._ended:
            out, pos, state = _split_rows(buf, pos, end)
            if state < 0:
                raise CopyFormatError(f"binary COPY row with {_unpack_i16(buf, pos)[0]} fields")
            self._ended = state == 1
        else:
            out = []
        del buf[:pos]
        if self._ended and buf:
            raise CopyFormatError(f"{len(buf)} bytes after the binary COPY trailer")
        self.rows += len(out)
        return out

    def finish(self) -> None:
        """The stream ended: it must have ended with the trailer and nothing left over."""
        if not self._ended or self._buf:
            raise CopyFormatError("binary COPY data ended inside a row or without its trailer")


def _split_rows_py(buf: bytes | bytearray, pos: int, end: int) -> tuple[list[bytes], int, int]:
    """The rows of `buf[pos:end]` as Insert tuples: `(rows, pos of the first incomplete one, state)`.

    state 0: more may come; 1: the trailer was read (pos is after it); -1: a
    row with a negative field count other than the trailer's starts at pos.
    The twin and specification of `_copysplit.split_rows`.
    """
    out: list[bytes] = []
    append = out.append
    while pos + 2 <= end:
        count = _unpack_i16(buf, pos)[0]
        if count == -1:  # the trailer
            return out, pos + 2, 1
        if count < 0:
            return out, pos, -1
        row = bytearray(_NEW)
        row += buf[pos : pos + 2]
        p = pos + 2
        for _ in range(count):
            if p + 4 > end:
                return out, pos, 0
            n = _unpack_i32(buf, p)[0]
            if n < 0:
                row += _NULL
                p += 4
                continue
            if p + 4 + n > end:
                return out, pos, 0
            row += _BINARY
            row += buf[p : p + 4 + n]
            p += 4 + n
        append(bytes(row))
        pos = p
    return out, pos, 0


_copysplit = compiled_module("csnd.snapshot._copysplit")
_split_rows: Callable[[bytes | bytearray, int, int], tuple[list[bytes], int, int]] = (
    _split_rows_py if _copysplit is None else _copysplit.split_rows
)


_ESCAPE: Final = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|(.))", re.DOTALL)
_SIMPLE: Final = {
    ord("b"): b"\b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("v"): b"\v",
}


def _unescape_one(m: re.Match[bytes]) -> bytes:
    octal, hexa, other = m.groups()
    if octal is not None:
        return bytes((int(octal, 8) & 0xFF,))
    if hexa is not None:
        return bytes((int(hexa, 16),))
    c = other[0]
    return _SIMPLE.get(c, other)


def unescape_text_field(field: bytes) -> bytes:
    """A text COPY field's bytes with its backslash escapes undone (not `\\N`: the caller checks it)."""
    return _ESCAPE.sub(_unescape_one, field) if b"\\" in field else field


class TextCopyRows:
    """Text-format COPY data -> one Insert tuple per row, every value a `t` value."""

    __slots__ = ("_buf", "rows")

    def __init__(self) -> None:
        self._buf = b""
        self.rows = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        buf = self._buf + bytes(data)
        lines = buf.split(b"\n")
        self._buf = lines.pop()  # (an unfinished row, or b"")
        out: list[bytes] = []
        pack_i32 = _I32.pack
        for line in lines:
            fields = line.split(b"\t")
            row = [_NEW, _I16.pack(len(fields))]
            for f in fields:
                if f == b"\\N":
                    row.append(_NULL)
                else:
                    value = unescape_text_field(f)
                    row += (_TEXT, pack_i32(len(value)), value)
            out.append(b"".join(row))
        self.rows += len(out)
        return out

    def finish(self) -> None:
        if self._buf:
            raise CopyFormatError("text COPY data ended inside a row")
