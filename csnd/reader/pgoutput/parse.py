"""Parsing: CopyData payloads -> frames -> pgoutput messages, and the hot paths that skip steps.

`parse_frame` and `parse_message` are the general path, which also reports
every malformed frame (`FrameError`); `parse_change_frame` and
`parse_txn_frame` take the frames of a busy node -- row changes, Begin and
Commit -- in one unpack; `ChangeFrames` / `iter_change_frames` let a
recorded file's reader hand whole runs of change frames to the decoders
unparsed.  `PgOutputParser` keeps the one bit of state parsing needs: whether
a stream block is open (its messages carry an extra leading xid).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Final, NamedTuple

from csnd.core.errors import FrameError
from csnd.core.ids import Lsn, Xid
from csnd.reader.pgoutput.layouts import (
    _BEGIN,
    _COLUMN_TAIL,
    _COMMIT,
    _I16,
    _I32,
    _KEEPALIVE,
    _STREAM_ABORT,
    _STREAM_COMMIT,
    _STREAM_START,
    _U32,
    _U64,
    _XLOGDATA,
    XLOGDATA_HEADER_SIZE,
)
from csnd.reader.pgoutput.messages import (
    _XID_IN_STREAM,
    MESSAGE_NAMES,
    Begin,
    Change,
    Column,
    Commit,
    Frame,
    Keepalive,
    LogicalMessage,
    Message,
    Origin,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TypeMsg,
    XLogData,
)


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


def parse_hot_frame(payload: bytes, in_stream: bool) -> tuple[Lsn, Change | Begin | Commit] | None:
    """`parse_change_frame` or `parse_txn_frame`, by the frame's tag: what every reader tries first.

    None for anything else -- a keepalive, another message, a Begin or
    Commit inside a stream block, a frame too short -- which then takes the
    general path (`parse_frame`, `PgOutputParser.parse`), reporting errors.
    """
    if len(payload) <= XLOGDATA_HEADER_SIZE:
        return None
    tag = payload[XLOGDATA_HEADER_SIZE]
    if tag in _CHANGE_KINDS:
        return parse_change_frame(payload, in_stream)
    if tag in TXN_TAGS and not in_stream:
        return parse_txn_frame(payload)
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
    length | XLogData payload` in a format-1 file, `uint32 length | uint32
    crc | XLogData payload` in a format-2 one: `head` is 4 or 8, the bytes
    before each payload), each an Insert, Update or Delete, one slice of the
    file's buffer, so the serial reader thread only finds where the run
    starts and ends (and checks each frame's CRC) and the decoder workers
    parse the frames (`iter_change_frames`).  `lsns` are the frames'
    dataStarts; `xid` is as in `Change` (the subtransaction inside a stream
    block, else None), and `in_stream` says which of the two change layouts
    the frames have.
    """

    __slots__ = ("blob", "in_stream", "xid", "lsns", "head")
    tag = "changes"

    def __init__(self, blob: bytes, in_stream: bool, xid: Xid | None, lsns: list[Lsn], head: int = 4) -> None:
        self.blob = blob
        self.in_stream = in_stream
        self.xid = xid
        self.lsns = lsns
        self.head = head

    def __repr__(self) -> str:
        return f"ChangeFrames(n={len(self.lsns)}, xid={self.xid}, in_stream={self.in_stream})"


class TxnFrames:
    """A whole non-streamed transaction as messages: Begin, its row changes as one run, Commit.

    What a `ScannedTxn` stands for (`scanned_txn_frames`), for a consumer
    that takes a transaction's messages rather than its fields: the decoder
    pool's feed when it does not write lines, the resume filter when it
    must judge the transaction's events one by one.  Not an event of its own
    (a source hands on whole transactions as a `TxnRun`).  `changes` is its
    row changes as a `ChangeFrames` run (None: the transaction has none, as
    one touching only tables outside the publication); `begin_at` /
    `commit_at` are the positions the Begin and Commit came at (their
    dataStarts), as the events each would be.
    """

    __slots__ = ("begin_at", "begin", "changes", "commit_at", "commit")
    tag = "txn"

    def __init__(
        self, begin_at: Lsn, begin: Begin, changes: ChangeFrames | None, commit_at: Lsn, commit: Commit
    ) -> None:
        self.begin_at = begin_at
        self.begin = begin
        self.changes = changes
        self.commit_at = commit_at
        self.commit = commit

    def events(self) -> list[tuple[Lsn, Begin | ChangeFrames | Commit]]:
        """The transaction as the events it stands for, in stream order."""
        out: list[tuple[Lsn, Begin | ChangeFrames | Commit]] = [(self.begin_at, self.begin)]
        if self.changes is not None:
            out.append((self.changes.lsns[0], self.changes))
        out.append((self.commit_at, self.commit))
        return out

    def __repr__(self) -> str:
        n = len(self.changes.lsns) if self.changes is not None else 0
        return f"TxnFrames(xid={self.begin.xid}, n={n}, commit={self.commit.commit_lsn})"


class ScannedTxn(NamedTuple):
    """A whole one-piece transaction, as `reader.txnscan` reads it and as it travels as far as the sender.

    A NamedTuple, not a class of its own, because on a busy node there is one
    per transaction: it is made (in C by `_txnscan`, which makes instances of
    this class) and read at a tuple's cost, its fields by name.  `blob` is its
    changes' framed run (`uint32 length | XLogData payload` each) and `lsns`
    their dataStarts, both None for a transaction without changes.
    """

    begin_at: Lsn  # the Begin's dataStart
    final_lsn: Lsn  # as the Begin announced it
    begin_time: int  # the Begin's commit time
    xid: Xid
    blob: bytes | None
    lsns: list[Lsn] | None
    commit_at: Lsn  # the Commit's dataStart
    flags: int
    commit_lsn: Lsn
    end_lsn: Lsn
    commit_time: int


# (`tuple.__new__` itself: the class's own __new__ is a Python function, a call more per transaction)
_new_scanned: Final = tuple.__new__


def scanned_txn(
    begin_at: Lsn, begin: Begin, blob: bytes | None, lsns: list[Lsn] | None, commit_at: Lsn, commit: Commit
) -> ScannedTxn:
    """A whole transaction of parsed messages as a scanned one."""
    return _new_scanned(
        ScannedTxn,
        (
            begin_at,
            begin.final_lsn,
            begin.commit_time,
            begin.xid,
            blob,
            lsns,
            commit_at,
            commit.flags,
            commit.commit_lsn,
            commit.end_lsn,
            commit.commit_time,
        ),
    )


def scanned_txn_frames(t: ScannedTxn) -> TxnFrames:
    """The `TxnFrames` a scanned transaction stands for (its run's frames have a 4-byte head)."""
    blob, lsns = t.blob, t.lsns
    changes = None if blob is None or lsns is None else ChangeFrames(blob, False, None, lsns)
    return TxnFrames(
        t.begin_at,
        Begin(t.final_lsn, t.begin_time, t.xid),
        changes,
        t.commit_at,
        Commit(t.flags, t.commit_lsn, t.end_lsn, t.commit_time),
    )


class TxnRun:
    """Whole one-piece transactions that came one after another, as one event (`ScannedTxn` each).

    What a live reader hands on for a batch of transactions its compiled
    loop read (`reader.txnscan`), and for one that came whole on its
    frame-by-frame path: the resume filter, the decoder pool's feed and the
    sender then take them a batch at a time, with no object per
    transaction -- on a node of one-row transactions those objects were a
    tenth of the service's CPU.  Each stands for the `TxnFrames` that
    `frames()` builds, which is what a consumer without a batch path takes.
    Never empty; the transactions are in stream order.
    """

    __slots__ = ("txns",)
    tag = "txns"

    def __init__(self, txns: list[ScannedTxn]) -> None:
        self.txns = txns

    def frames(self) -> list[TxnFrames]:
        return [scanned_txn_frames(t) for t in self.txns]

    def __repr__(self) -> str:
        first, last = self.txns[0], self.txns[-1]
        return f"TxnRun(n={len(self.txns)}, xids={first.xid}..{last.xid})"


# A change as `ChangeFrames.blob` holds it: the frame's length (and, with an
# 8-byte head, its CRC) and 'w' before the XLogData layouts above.  The head
# (through the tag) is what the reader checks; the full layouts are what the
# workers unpack.
FRAMED_CHANGE_HEAD: Final = struct.Struct("!IBQ16xB")  # walEnd and sendTime skipped: no ints made for them
assert FRAMED_CHANGE_HEAD.size == struct.calcsize("!IB" + _PLAIN_CHANGE.format[1:-1])
# (in_stream, head) -> the layout of a whole framed change up to its tuple data
_FRAMED_CHANGES: Final = {
    (in_stream, head): struct.Struct(
        f"!I{head - 4}xB" + (_STREAM_CHANGE if in_stream else _PLAIN_CHANGE).format[1:]
    )
    for in_stream in (False, True)
    for head in (4, 8)
}


def iter_change_frames(
    blob: bytes, in_stream: bool, head: int = 4
) -> Iterator[tuple[Lsn, str, Xid | None, int, bytes]]:
    """`(dataStart, kind, xid, relid, tuple data)` of each frame of a `ChangeFrames.blob`.

    The reader checked each frame's length, tag and CRC before it put the
    frame in the run, so this only unpacks: length, [crc,] 'w', dataStart,
    walEnd, sendTime, tag, [xid,] relid.
    """
    layout = _FRAMED_CHANGES[in_stream, head]
    unpack, data_at = layout.unpack_from, layout.size
    pos, end = 0, len(blob)
    while pos < end:
        fields = unpack(blob, pos)
        nxt = pos + head + fields[0]
        xid = fields[6] if in_stream else None
        yield fields[2], _CHANGE_KINDS[fields[5]], xid, fields[-1], blob[pos + data_at : nxt]
        pos = nxt


_ONE_FRAMED_CHANGE: Final = _FRAMED_CHANGES[False, 4]


def one_change_frame(blob: bytes) -> tuple[Lsn, str, int, int] | None:
    """`(dataStart, kind, relid, where its tuple data starts)` if `blob` is one change frame, else None.

    For a live reader's run (4-byte head, not in a stream block) of exactly
    one change: a one-row transaction's, the common case, which a decoder
    worker then decodes without `iter_change_frames`' loop.
    """
    if len(blob) < _ONE_FRAMED_CHANGE.size:
        return None
    length, _, start, _, _, tag, relid = _ONE_FRAMED_CHANGE.unpack_from(blob)
    kind = _CHANGE_KINDS.get(tag)
    if length + 4 != len(blob) or kind is None:
        return None
    return start, kind, relid, _ONE_FRAMED_CHANGE.size


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
