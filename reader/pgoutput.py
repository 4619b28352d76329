"""Sans-I/O framing of the logical replication CopyData stream (pgoutput v2).

A walsender sends CopyData payloads of two kinds:

    'w' XLogData   int64 dataStart, int64 walEnd, int64 sendTime, one pgoutput message
    'k' keepalive  int64 walEnd, int64 sendTime, byte replyRequested

and pgoutput protocol version 2 puts one message in each XLogData.  This module
only *frames and classifies*: it reads the fixed header fields of each message
(xid, relation id, positions) and leaves tuple data as raw bytes, because
turning tuple data into typed values is the CPU-heavy part and belongs to the
decoder processes (seed 002, section 3.4).  No sockets, files or clocks here.

Inside a Stream Start/Stop block every message that can belong to a
transaction carries an extra leading xid (the subtransaction's, for changes),
so parsing needs one bit of state: `PgOutputParser` keeps it and checks that
stream blocks nest properly.

The module also *encodes* every message.  The synthetic cluster generator and
the tests build streams with these functions, so the wire format is defined in
exactly one place.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final

from csnd.core.errors import FrameError as FrameError  # (re-exported: it was defined here)
from csnd.core.ids import Lsn, Xid

# --- struct unpackers, built once -------------------------------------------------

_U8 = struct.Struct("!B")
_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_I64 = struct.Struct("!q")
_XLOGDATA = struct.Struct("!QQq")  # dataStart, walEnd, sendTime
_KEEPALIVE = struct.Struct("!QqB")  # walEnd, sendTime, replyRequested
_BEGIN = struct.Struct("!QqI")  # final_lsn, commit_time, xid
_COMMIT = struct.Struct("!BQQq")  # flags, commit_lsn, end_lsn, commit_time
_STREAM_COMMIT = struct.Struct("!IBQQq")  # xid, flags, commit_lsn, end_lsn, commit_time
_STREAM_ABORT = struct.Struct("!II")  # xid, subxid
_STREAM_START = struct.Struct("!IB")  # xid, first_segment
_COLUMN_TAIL = struct.Struct("!Ii")  # type oid, typmod
_STATUS_UPDATE = struct.Struct("!cQQQqB")

XLOGDATA_HEADER_SIZE: Final = 1 + _XLOGDATA.size

# --- message classes ------------------------------------------------------------
# One small class per message kind with __slots__: a recorded stream holds
# millions of them and attribute access must stay cheap.


class XLogData:
    __slots__ = ("data_start", "wal_end", "send_time", "payload")

    def __init__(self, data_start: Lsn, wal_end: Lsn, send_time: int, payload: bytes) -> None:
        self.data_start = data_start
        self.wal_end = wal_end
        self.send_time = send_time
        self.payload = payload


class Keepalive:
    __slots__ = ("wal_end", "send_time", "reply_requested")

    def __init__(self, wal_end: Lsn, send_time: int, reply_requested: bool) -> None:
        self.wal_end = wal_end
        self.send_time = send_time
        self.reply_requested = reply_requested


Frame = XLogData | Keepalive


class Begin:
    __slots__ = ("final_lsn", "commit_time", "xid")
    tag = "B"

    def __init__(self, final_lsn: Lsn, commit_time: int, xid: Xid) -> None:
        self.final_lsn = final_lsn
        self.commit_time = commit_time
        self.xid = xid


class Commit:
    __slots__ = ("flags", "commit_lsn", "end_lsn", "commit_time")
    tag = "C"

    def __init__(self, flags: int, commit_lsn: Lsn, end_lsn: Lsn, commit_time: int) -> None:
        self.flags = flags
        self.commit_lsn = commit_lsn
        self.end_lsn = end_lsn
        self.commit_time = commit_time


class Origin:
    __slots__ = ("commit_lsn", "name")
    tag = "O"

    def __init__(self, commit_lsn: Lsn, name: str) -> None:
        self.commit_lsn = commit_lsn
        self.name = name


class Column:
    __slots__ = ("flags", "name", "type_oid", "typmod")

    def __init__(self, flags: int, name: str, type_oid: int, typmod: int) -> None:
        self.flags = flags
        self.name = name
        self.type_oid = type_oid
        self.typmod = typmod

    @property
    def is_key(self) -> bool:
        return bool(self.flags & 1)

    def __repr__(self) -> str:
        return f"Column({self.flags}, {self.name!r}, {self.type_oid}, {self.typmod})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Column) and (
            self.flags,
            self.name,
            self.type_oid,
            self.typmod,
        ) == (other.flags, other.name, other.type_oid, other.typmod)

    def __hash__(self) -> int:
        return hash((self.flags, self.name, self.type_oid, self.typmod))


class Relation:
    __slots__ = ("xid", "relid", "namespace", "name", "replident", "columns")
    tag = "R"

    def __init__(
        self,
        xid: Xid | None,
        relid: int,
        namespace: str,
        name: str,
        replident: str,
        columns: tuple[Column, ...],
    ) -> None:
        self.xid = xid
        self.relid = relid
        self.namespace = namespace
        self.name = name
        self.replident = replident  # 'd' default, 'n' nothing, 'f' full, 'i' index
        self.columns = columns


class TypeMsg:
    __slots__ = ("xid", "type_oid", "namespace", "name")
    tag = "Y"

    def __init__(self, xid: Xid | None, type_oid: int, namespace: str, name: str) -> None:
        self.xid = xid
        self.type_oid = type_oid
        self.namespace = namespace
        self.name = name


class Change:
    """Insert ('I'), Update ('U') or Delete ('D') with its tuple data left raw.

    `data` is everything after the relation id: for an insert `'N' tuple`, for
    an update `['K'|'O' tuple] 'N' tuple`, for a delete `'K'|'O' tuple`.  The
    decoder splits it (`decoder.tuples`).
    """

    __slots__ = ("kind", "xid", "relid", "data")
    tag = "change"

    def __init__(self, kind: str, xid: Xid | None, relid: int, data: bytes) -> None:
        self.kind = kind
        self.xid = xid
        self.relid = relid
        self.data = data


class Truncate:
    __slots__ = ("xid", "options", "relids")
    tag = "T"

    def __init__(self, xid: Xid | None, options: int, relids: tuple[int, ...]) -> None:
        self.xid = xid
        self.options = options  # 1: CASCADE, 2: RESTART IDENTITY
        self.relids = relids


class LogicalMessage:
    __slots__ = ("xid", "transactional", "lsn", "prefix", "content")
    tag = "M"

    def __init__(self, xid: Xid | None, transactional: bool, lsn: Lsn, prefix: str, content: bytes) -> None:
        self.xid = xid
        self.transactional = transactional
        self.lsn = lsn
        self.prefix = prefix
        self.content = content


class StreamStart:
    __slots__ = ("xid", "first_segment")
    tag = "S"

    def __init__(self, xid: Xid, first_segment: bool) -> None:
        self.xid = xid
        self.first_segment = first_segment


class StreamStop:
    __slots__ = ()
    tag = "E"


class StreamCommit:
    __slots__ = ("xid", "flags", "commit_lsn", "end_lsn", "commit_time")
    tag = "c"

    def __init__(self, xid: Xid, flags: int, commit_lsn: Lsn, end_lsn: Lsn, commit_time: int) -> None:
        self.xid = xid
        self.flags = flags
        self.commit_lsn = commit_lsn
        self.end_lsn = end_lsn
        self.commit_time = commit_time


class StreamAbort:
    __slots__ = ("xid", "subxid")
    tag = "A"

    def __init__(self, xid: Xid, subxid: Xid) -> None:
        self.xid = xid
        self.subxid = subxid


Message = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMsg
    | Change
    | Truncate
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
)

# Messages that carry the extra leading xid inside a stream block.
_XID_IN_STREAM: Final = frozenset(b"RYIUDTM")

MESSAGE_NAMES: Final = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
}

# --- parsing --------------------------------------------------------------------


def parse_frame(payload: bytes) -> Frame:
    """Split one CopyData payload into an XLogData or a primary keepalive."""
    if not payload:
        raise FrameError("empty CopyData payload")
    kind = payload[0]
    if kind == 0x77:  # 'w'
        if len(payload) < XLOGDATA_HEADER_SIZE:
            raise FrameError(f"XLogData frame of {len(payload)} bytes is shorter than its header")
        start, end, t = _XLOGDATA.unpack_from(payload, 1)
        return XLogData(start, end, t, payload[XLOGDATA_HEADER_SIZE:])
    if kind == 0x6B:  # 'k'
        if len(payload) != 1 + _KEEPALIVE.size:
            raise FrameError(f"keepalive frame of {len(payload)} bytes, expected {1 + _KEEPALIVE.size}")
        end, t, reply = _KEEPALIVE.unpack_from(payload, 1)
        return Keepalive(end, t, bool(reply))
    raise FrameError(f"unknown CopyData message type {chr(kind)!r} (0x{kind:02x})")


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.index(0, pos)
    return buf[pos:end].decode("utf-8"), end + 1


def parse_message(buf: bytes, in_stream: bool) -> Message:
    """Parse one pgoutput v2 message; `in_stream` says whether a stream block is open.

    Raises `FrameError` for an unknown message type or a message shorter than
    its fields; the caller adds node, LSN and file position.
    """
    if not buf:
        raise FrameError("empty pgoutput message")
    tag = buf[0]
    try:
        pos = 1
        xid: Xid | None = None
        if in_stream and tag in _XID_IN_STREAM:
            xid = _U32.unpack_from(buf, 1)[0]
            pos = 5
        if tag in (0x49, 0x55, 0x44):  # I U D
            relid = _U32.unpack_from(buf, pos)[0]
            data = bytes(buf[pos + 4 :])
            if not data:
                raise FrameError(f"{MESSAGE_NAMES[tag]} message without tuple data")
            return Change(chr(tag), xid, relid, data)
        if tag == 0x42:  # B
            final_lsn, commit_time, bxid = _BEGIN.unpack_from(buf, 1)
            return Begin(final_lsn, commit_time, bxid)
        if tag == 0x43:  # C
            return Commit(*_COMMIT.unpack_from(buf, 1))
        if tag == 0x4D:  # M
            flags = buf[pos]
            lsn = _U64.unpack_from(buf, pos + 1)[0]
            prefix, p = _cstring(buf, pos + 9)
            size = _U32.unpack_from(buf, p)[0]
            content = bytes(buf[p + 4 : p + 4 + size])
            if len(content) != size:
                raise FrameError(
                    f"corrupt Message message: content of {len(content)} bytes, header says {size}"
                )
            return LogicalMessage(xid, bool(flags & 1), lsn, prefix, content)
        if tag == 0x52:  # R
            relid = _U32.unpack_from(buf, pos)[0]
            namespace, p = _cstring(buf, pos + 4)
            name, p = _cstring(buf, p)
            replident = chr(buf[p])
            ncols = _I16.unpack_from(buf, p + 1)[0]
            p += 3
            cols = []
            for _ in range(ncols):
                flags = buf[p]
                cname, p = _cstring(buf, p + 1)
                type_oid, typmod = _COLUMN_TAIL.unpack_from(buf, p)
                p += 8
                cols.append(Column(flags, cname, type_oid, typmod))
            return Relation(xid, relid, namespace, name, replident, tuple(cols))
        if tag == 0x59:  # Y
            type_oid = _U32.unpack_from(buf, pos)[0]
            namespace, p = _cstring(buf, pos + 4)
            name, p = _cstring(buf, p)
            return TypeMsg(xid, type_oid, namespace, name)
        if tag == 0x54:  # T
            nrels = _I32.unpack_from(buf, pos)[0]
            options = buf[pos + 4]
            relids = struct.unpack_from(f"!{nrels}I", buf, pos + 5)
            return Truncate(xid, options, relids)
        if tag == 0x4F:  # O
            commit_lsn = _U64.unpack_from(buf, 1)[0]
            name, _ = _cstring(buf, 9)
            return Origin(commit_lsn, name)
        if tag == 0x53:  # S
            sxid, first = _STREAM_START.unpack_from(buf, 1)
            return StreamStart(sxid, bool(first))
        if tag == 0x45:  # E
            return StreamStop()
        if tag == 0x63:  # c
            return StreamCommit(*_STREAM_COMMIT.unpack_from(buf, 1))
        if tag == 0x41:  # A
            return StreamAbort(*_STREAM_ABORT.unpack_from(buf, 1))
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
        name = MESSAGE_NAMES.get(tag, "message")
        raise FrameError(f"corrupt {name} message of {len(buf)} bytes: {e}") from None
    raise FrameError(f"unknown pgoutput message type {chr(tag)!r} (0x{tag:02x})")


_CHANGE_KINDS: Final = {0x49: "I", 0x55: "U", 0x44: "D"}
_STREAM_CHANGE = struct.Struct("!QQqBII")  # header, tag, xid, relid
_PLAIN_CHANGE = struct.Struct("!QQqBI")  # header, tag, relid
_STREAM_DATA: Final = 1 + _STREAM_CHANGE.size  # where tuple data starts, after 'w'
_PLAIN_DATA: Final = 1 + _PLAIN_CHANGE.size


def parse_change_frame(payload: bytes, in_stream: bool) -> tuple[Lsn, Change] | None:
    """The hot path: `(dataStart, Change)` if `payload` is an XLogData frame of a row change, else None.

    Row changes are nearly every frame of a busy node, and the reader thread
    is the one serial step in front of the decoder processes, so they skip
    the `XLogData` object and the second copy `parse_frame` + `parse_message`
    would make.  Anything else (or a change too short to hold its fields)
    returns None and takes the general path, which also reports errors.
    """
    if len(payload) <= _STREAM_DATA or payload[0] != 0x77:
        return None
    kind = _CHANGE_KINDS.get(payload[XLOGDATA_HEADER_SIZE])
    if kind is None:
        return None
    if in_stream:
        start, _, _, _, xid, relid = _STREAM_CHANGE.unpack_from(payload, 1)
        return start, Change(kind, xid, relid, payload[_STREAM_DATA:])
    start, _, _, _, relid = _PLAIN_CHANGE.unpack_from(payload, 1)
    return start, Change(kind, None, relid, payload[_PLAIN_DATA:])


_BEGIN_FRAME = struct.Struct("!QQqBQqI")  # header, tag, final LSN, commit time, xid
_COMMIT_FRAME = struct.Struct("!QQqBBQQq")  # header, tag, flags, commit LSN, end LSN, commit time


TXN_TAGS: Final = frozenset((0x42, 0x43))  # the tags `parse_txn_frame` takes: 'B'egin, 'C'ommit


def parse_txn_frame(payload: bytes) -> tuple[Lsn, Begin | Commit] | None:
    """`(dataStart, Begin | Commit)` if `payload` is an XLogData frame of one, else None.

    After row changes, a transaction's Begin and Commit are the frames of a
    busy node -- with one-row transactions, two of every three -- so they
    skip `parse_frame`'s object and `parse_message`'s dispatch too.  Only for
    a parser outside a stream block (inside one they are errors, which the
    general path reports); a frame too short for its fields returns None
    and the general path reports that as well.
    """
    n = len(payload)
    if n <= XLOGDATA_HEADER_SIZE or payload[0] != 0x77:
        return None
    tag = payload[XLOGDATA_HEADER_SIZE]
    if tag == 0x42 and n >= 1 + _BEGIN_FRAME.size:
        start, _, _, _, final_lsn, commit_time, xid = _BEGIN_FRAME.unpack_from(payload, 1)
        return start, Begin(final_lsn, commit_time, xid)
    if tag == 0x43 and n >= 1 + _COMMIT_FRAME.size:
        start, _, _, _, flags, commit_lsn, end_lsn, commit_time = _COMMIT_FRAME.unpack_from(payload, 1)
        return start, Commit(flags, commit_lsn, end_lsn, commit_time)
    return None


# For a reader that leaves row-change frames in its buffer (`ChangeFrames`):
# the payload bytes a frame must have beyond this to count as a change (as in
# `parse_change_frame`: a shorter one takes the general path, which reports
# it), the tags, and where a streamed change's xid sits in the payload.
CHANGE_FRAME_MIN: Final = _STREAM_DATA
CHANGE_TAGS: Final = frozenset(_CHANGE_KINDS)
CHANGE_XID_OFFSET: Final = XLOGDATA_HEADER_SIZE + 1


class ChangeFrames:
    """Consecutive row-change frames of one (sub)transaction, left in their recorded framing.

    What a recorded file's reader hands the decoder pool in place of one
    `Change` per frame: `blob` is the frames exactly as stored (`uint32
    length | XLogData payload`, each an Insert, Update or Delete), one slice
    of the file's buffer, so the serial reader thread only finds where the
    run starts and ends and the decoder workers parse the frames
    (`iter_change_frames`).  `lsns` are the frames' dataStarts; `xid` is as
    in `Change` (the subtransaction inside a stream block, else None), and
    `in_stream` says which of the two change layouts the frames have.
    """

    __slots__ = ("blob", "in_stream", "xid", "lsns")
    tag = "changes"

    def __init__(self, blob: bytes, in_stream: bool, xid: Xid | None, lsns: list[Lsn]) -> None:
        self.blob = blob
        self.in_stream = in_stream
        self.xid = xid
        self.lsns = lsns

    def __repr__(self) -> str:
        return f"ChangeFrames(n={len(self.lsns)}, xid={self.xid}, in_stream={self.in_stream})"


# A change as `ChangeFrames.blob` holds it: the frame's length and 'w' before
# the XLogData layouts above.  The head (through the tag) is what the reader
# checks; the full layouts are what the workers unpack.
FRAMED_CHANGE_HEAD: Final = struct.Struct("!IBQ16xB")  # walEnd and sendTime skipped: no ints made for them
assert FRAMED_CHANGE_HEAD.size == struct.calcsize("!IB" + _PLAIN_CHANGE.format[1:-1])
_FRAMED_STREAM_CHANGE: Final = struct.Struct("!IB" + _STREAM_CHANGE.format[1:])
_FRAMED_PLAIN_CHANGE: Final = struct.Struct("!IB" + _PLAIN_CHANGE.format[1:])


def iter_change_frames(blob: bytes, in_stream: bool) -> Iterator[tuple[Lsn, str, Xid | None, int, bytes]]:
    """`(dataStart, kind, xid, relid, tuple data)` of each frame of a `ChangeFrames.blob`.

    The reader checked each frame's length and tag before it put the frame
    in the run, so this only unpacks: length, 'w', dataStart, walEnd,
    sendTime, tag, [xid,] relid.
    """
    layout = _FRAMED_STREAM_CHANGE if in_stream else _FRAMED_PLAIN_CHANGE
    unpack, data_at = layout.unpack_from, layout.size
    pos, end = 0, len(blob)
    while pos < end:
        fields = unpack(blob, pos)
        nxt = pos + 4 + fields[0]
        xid = fields[6] if in_stream else None
        yield fields[2], _CHANGE_KINDS[fields[5]], xid, fields[-1], blob[pos + data_at : nxt]
        pos = nxt


class PgOutputParser:
    """Parses the messages of one replication stream, tracking stream blocks.

    Checks the one structural rule the framing layer can see: Stream Start and
    Stream Stop alternate, and Stream Commit / Abort come outside a block.
    """

    __slots__ = ("in_stream", "stream_xid")

    def __init__(self) -> None:
        self.in_stream = False
        self.stream_xid: Xid | None = None

    def parse(self, buf: bytes) -> Message:
        msg = parse_message(buf, self.in_stream)
        if isinstance(msg, StreamStart):
            if self.in_stream:
                raise FrameError(
                    f"Stream Start for transaction {msg.xid} inside the open stream block "
                    f"of transaction {self.stream_xid}"
                )
            self.in_stream = True
            self.stream_xid = msg.xid
        elif isinstance(msg, StreamStop):
            if not self.in_stream:
                raise FrameError("Stream Stop without a Stream Start")
            self.in_stream = False
            self.stream_xid = None
        elif isinstance(msg, (StreamCommit, StreamAbort, Begin, Commit)) and self.in_stream:
            raise FrameError(
                f"{type(msg).__name__} inside the open stream block of transaction {self.stream_xid}"
            )
        return msg


# --- encoding -------------------------------------------------------------------
# Used by the synthetic cluster generator and the tests, and by the live reader
# for standby status updates.

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
