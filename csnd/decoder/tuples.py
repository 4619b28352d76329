"""Splitting pgoutput TupleData into columns.

The reader leaves a change's tuple data raw (`reader.pgoutput.Change.data`);
the decoder processes split it here, because on a busy node that is most of
the bytes of the stream.  The wire form of one tuple:

    int16 ncols, then per column one of
      'n'                       SQL NULL
      'u'                       unchanged TOASTed value (not sent)
      't' int32 len, len bytes  the value's text output (UTF-8)
      'b' int32 len, len bytes  the value's binary send format

and of a change's data after the relation id:

    insert  'N' tuple
    update  ['K' | 'O' tuple] 'N' tuple     (old key / whole old row, if logged)
    delete  'K' | 'O' tuple

A column comes back exactly as `reader.pgoutput.encode_tuple` takes it: None
for NULL, the `UNCHANGED` marker object, `bytes` for a binary value and `str`
for a text value -- so encode and split are inverses, and the row decoder can
pick the binary or the text decoder by the value's type alone (a binary
stream still carries some columns as text).

The split walks the buffer with an offset and `struct.unpack_from`; every
length is checked, so truncated or corrupt data is a `DecodeError`, never a
short value.  The caller adds the relation, LSN and xid to the message.
"""

from __future__ import annotations

import struct
from typing import Final

from csnd.core.errors import DecodeError
from csnd.reader.pgoutput import UNCHANGED, TupleValue

__all__ = ["UNCHANGED", "TupleValue", "split_delete", "split_insert", "split_tuple", "split_update"]

_unpack_i16 = struct.Struct("!h").unpack_from
_unpack_i32 = struct.Struct("!i").unpack_from

# Column kinds, and the tag before a new tuple (public: `decoder.rows` reads
# an insert's tuple straight off the wire on its hot path).
KIND_NULL: Final = 0x6E  # 'n'
KIND_UNCHANGED: Final = 0x75  # 'u'
KIND_TEXT: Final = 0x74  # 't'
KIND_BINARY: Final = 0x62  # 'b'
_WITH_VALUE: Final = frozenset((KIND_TEXT, KIND_BINARY))
NEW_TUPLE: Final = 0x4E  # 'N'
_KEY: Final = 0x4B  # 'K'
_OLD: Final = 0x4F  # 'O'


def split_tuple(data: bytes, pos: int) -> tuple[list[TupleValue], int]:
    """Split the tuple starting at `data[pos]`; returns the columns and the end offset."""
    end = len(data)
    if pos + 2 > end:
        raise DecodeError(f"tuple data truncated at offset {pos}: no column count")
    (ncols,) = _unpack_i16(data, pos)
    if ncols < 0:
        raise DecodeError(f"corrupt tuple data at offset {pos}: negative column count {ncols}")
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    for i in range(ncols):
        if pos >= end:
            raise DecodeError(f"tuple data truncated after {i} of {ncols} columns at offset {pos}")
        kind = data[pos]
        if kind in _WITH_VALUE:
            if pos + 5 > end:
                raise DecodeError(f"tuple data truncated in the length of column {i + 1} at offset {pos}")
            (size,) = _unpack_i32(data, pos + 1)
            start = pos + 5
            pos = start + size
            if size < 0 or pos > end:
                raise DecodeError(
                    f"tuple data truncated: column {i + 1} of {ncols} needs {size} bytes at offset "
                    f"{start}, {end - start} left"
                )
            raw = data[start:pos]
            if kind == KIND_BINARY:
                append(raw)
            else:
                try:
                    append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise DecodeError(f"text value of column {i + 1} is not valid utf-8: {e}") from None
        elif kind == KIND_NULL:
            append(None)
            pos += 1
        elif kind == KIND_UNCHANGED:
            append(UNCHANGED)
            pos += 1
        else:
            raise DecodeError(
                f"corrupt tuple data: column {i + 1} of {ncols} has unknown kind {chr(kind)!r} "
                f"(0x{kind:02x}) at offset {pos}"
            )
    return values, pos


def _expect(data: bytes, pos: int, tag: int, what: str) -> None:
    if pos >= len(data):
        raise DecodeError(f"{what} truncated at offset {pos}: expected {chr(tag)!r}")
    if data[pos] != tag:
        raise DecodeError(f"corrupt {what}: expected {chr(tag)!r} at offset {pos}, found {chr(data[pos])!r}")


def _finish(data: bytes, pos: int, what: str) -> None:
    if pos != len(data):
        raise DecodeError(f"corrupt {what}: {len(data) - pos} bytes after the last tuple")


def split_insert(data: bytes) -> list[TupleValue]:
    """`'N' tuple` -> the new row's columns."""
    _expect(data, 0, NEW_TUPLE, "insert data")
    new, pos = split_tuple(data, 1)
    _finish(data, pos, "insert data")
    return new


def split_update(data: bytes) -> tuple[str | None, list[TupleValue] | None, list[TupleValue]]:
    """`['K'|'O' tuple] 'N' tuple` -> (old kind or None, old columns or None, new columns)."""
    old_kind: str | None = None
    old: list[TupleValue] | None = None
    pos = 0
    if data[:1] in (b"K", b"O"):
        old_kind = chr(data[0])
        old, pos = split_tuple(data, 1)
    _expect(data, pos, NEW_TUPLE, "update data")
    new, pos = split_tuple(data, pos + 1)
    _finish(data, pos, "update data")
    return old_kind, old, new


def split_delete(data: bytes) -> tuple[str, list[TupleValue]]:
    """`'K'|'O' tuple` -> (old kind, old columns)."""
    if not data or data[0] not in (_KEY, _OLD):
        found = repr(chr(data[0])) if data else "nothing"
        raise DecodeError(f"corrupt delete data: expected 'K' or 'O' at offset 0, found {found}")
    old, pos = split_tuple(data, 1)
    _finish(data, pos, "delete data")
    return chr(data[0]), old
