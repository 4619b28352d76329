"""Encoding every message and frame: the synthetic cluster generator and the tests build
streams with these functions, and the live reader its standby status updates."""

from __future__ import annotations

from typing import Final

from csnd.reader.pgoutput.layouts import (
    _BEGIN,
    _COLUMN_TAIL,
    _COMMIT,
    _I16,
    _I32,
    _KEEPALIVE,
    _STATUS_UPDATE,
    _STREAM_ABORT,
    _STREAM_COMMIT,
    _STREAM_START,
    _U8,
    _U32,
    _U64,
    _XLOGDATA,
)
from csnd.reader.pgoutput.messages import Column

TupleValue = None | bytes | str
"""One column of tuple data for encoding: None is SQL NULL, `UNCHANGED` unchanged
TOAST, `bytes` a binary value, `str` a text value."""

UNCHANGED: Final = "\x00unchanged-toast"


def encode_xlogdata(data_start: int, wal_end: int, send_time: int, message: bytes) -> bytes:
    return b"w" + _XLOGDATA.pack(data_start, wal_end, send_time) + message


def encode_keepalive(wal_end: int, send_time: int, reply_requested: bool = False) -> bytes:
    return b"k" + _KEEPALIVE.pack(wal_end, send_time, int(reply_requested))


def encode_status_update(write: int, flush: int, apply: int, now_pg_us: int, reply: bool = False) -> bytes:
    """Standby status update ('r'): the positions we have written, flushed, applied."""
    return _STATUS_UPDATE.pack(b"r", write, flush, apply, now_pg_us, int(reply))


def _xid_prefix(xid: int | None) -> bytes:
    return b"" if xid is None else _U32.pack(xid)


def _cstr(s: str) -> bytes:
    return s.encode("utf-8") + b"\0"


def encode_tuple(values: list[TupleValue] | tuple[TupleValue, ...]) -> bytes:
    out = [_I16.pack(len(values))]
    for v in values:
        if v is None:
            out.append(b"n")
        elif v is UNCHANGED or v == UNCHANGED:
            out.append(b"u")
        elif isinstance(v, bytes):
            out.append(b"b" + _I32.pack(len(v)) + v)
        else:
            raw = v.encode("utf-8")
            out.append(b"t" + _I32.pack(len(raw)) + raw)
    return b"".join(out)


def encode_begin(final_lsn: int, commit_time: int, xid: int) -> bytes:
    return b"B" + _BEGIN.pack(final_lsn, commit_time, xid)


def encode_commit(commit_lsn: int, end_lsn: int, commit_time: int, flags: int = 0) -> bytes:
    return b"C" + _COMMIT.pack(flags, commit_lsn, end_lsn, commit_time)


def encode_origin(commit_lsn: int, name: str) -> bytes:
    return b"O" + _U64.pack(commit_lsn) + _cstr(name)


def encode_relation(
    relid: int,
    namespace: str,
    name: str,
    replident: str,
    columns: list[Column] | tuple[Column, ...],
    xid: int | None = None,
) -> bytes:
    parts = [b"R", _xid_prefix(xid), _U32.pack(relid), _cstr(namespace), _cstr(name)]
    parts.append(replident.encode("ascii") + _I16.pack(len(columns)))
    for c in columns:
        parts.append(_U8.pack(c.flags) + _cstr(c.name) + _COLUMN_TAIL.pack(c.type_oid, c.typmod))
    return b"".join(parts)


def encode_type(type_oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return b"Y" + _xid_prefix(xid) + _U32.pack(type_oid) + _cstr(namespace) + _cstr(name)


def encode_insert(relid: int, new: list[TupleValue], xid: int | None = None) -> bytes:
    return b"I" + _xid_prefix(xid) + _U32.pack(relid) + b"N" + encode_tuple(new)


def encode_update(
    relid: int,
    new: list[TupleValue],
    old: list[TupleValue] | None = None,
    old_kind: str = "K",
    xid: int | None = None,
) -> bytes:
    head = b"U" + _xid_prefix(xid) + _U32.pack(relid)
    if old is not None:
        head += old_kind.encode("ascii") + encode_tuple(old)
    return head + b"N" + encode_tuple(new)


def encode_delete(relid: int, old: list[TupleValue], old_kind: str = "K", xid: int | None = None) -> bytes:
    return b"D" + _xid_prefix(xid) + _U32.pack(relid) + old_kind.encode("ascii") + encode_tuple(old)


def encode_truncate(relids: list[int], options: int = 0, xid: int | None = None) -> bytes:
    return (
        b"T"
        + _xid_prefix(xid)
        + _I32.pack(len(relids))
        + _U8.pack(options)
        + b"".join(_U32.pack(r) for r in relids)
    )


def encode_message(
    prefix: str, content: bytes, lsn: int, transactional: bool, xid: int | None = None
) -> bytes:
    return (
        b"M"
        + _xid_prefix(xid)
        + _U8.pack(1 if transactional else 0)
        + _U64.pack(lsn)
        + _cstr(prefix)
        + _U32.pack(len(content))
        + content
    )


def encode_stream_start(xid: int, first_segment: bool) -> bytes:
    return b"S" + _STREAM_START.pack(xid, int(first_segment))


def encode_stream_stop() -> bytes:
    return b"E"


def encode_stream_commit(xid: int, commit_lsn: int, end_lsn: int, commit_time: int, flags: int = 0) -> bytes:
    return b"c" + _STREAM_COMMIT.pack(xid, flags, commit_lsn, end_lsn, commit_time)


def encode_stream_abort(xid: int, subxid: int) -> bytes:
    return b"A" + _STREAM_ABORT.pack(xid, subxid)
