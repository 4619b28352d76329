"""The fixed layouts of the CopyData frames and pgoutput messages, as struct unpackers built once.

Shared by the parser and the encoder (`reader.pgoutput.parse`, `.encode`), so
the wire format is written down in exactly one place.
"""

from __future__ import annotations

import struct
from typing import Final

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
# A run's framing of change frames (`ChangeFrames`, a format-1 recording):
# uint32 length | XLogData payload; and an XLogData frame's dataStart, after its 'w'.
RUN_FRAME_LENGTH: Final = _U32
XLOGDATA_START: Final = _U64
