"""The pgoutput v2 messages and the two CopyData frames, as small classes.

One small class per message kind with `__slots__`: a recorded stream holds
millions of them and attribute access must stay cheap.  Positions and xids
carry their id types (`Lsn`, `Xid`).  Tuple data stays raw bytes here: it is
the decoders' work (`csnd.decoder`).
"""

from __future__ import annotations

from typing import Final

from csnd.core.ids import Lsn, Xid


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
