"""Sans-I/O framing of the logical replication CopyData stream (pgoutput v2).

A walsender sends CopyData payloads of two kinds:

    'w' XLogData   int64 dataStart, int64 walEnd, int64 sendTime, one pgoutput message
    'k' keepalive  int64 walEnd, int64 sendTime, byte replyRequested

and pgoutput protocol version 2 puts one message in each XLogData.  This
package only *frames and classifies*: it reads the fixed header fields of
each message (xid, relation id, positions) and leaves tuple data as raw
bytes, because turning tuple data into typed values is the CPU-heavy part
and belongs to the decoder processes (GaussDB's parallel decoding,
docs/design.md section 1).  No sockets, files or clocks here.

    layouts   the struct layouts of frames and messages, built once
    messages  one small slotted class per message kind
    parse     payload -> frame -> message, the hot paths, runs of raw change frames
    encode    every message and frame written back (the generator, the tests,
              the live reader's status updates): the wire format is defined once

Everything public is re-exported here: `from csnd.reader.pgoutput import Begin`.
"""

from csnd.core.errors import FrameError as FrameError
from csnd.reader.pgoutput.encode import (
    UNCHANGED as UNCHANGED,
)
from csnd.reader.pgoutput.encode import (
    TupleValue as TupleValue,
)
from csnd.reader.pgoutput.encode import (
    encode_begin as encode_begin,
)
from csnd.reader.pgoutput.encode import (
    encode_commit as encode_commit,
)
from csnd.reader.pgoutput.encode import (
    encode_delete as encode_delete,
)
from csnd.reader.pgoutput.encode import (
    encode_insert as encode_insert,
)
from csnd.reader.pgoutput.encode import (
    encode_keepalive as encode_keepalive,
)
from csnd.reader.pgoutput.encode import (
    encode_message as encode_message,
)
from csnd.reader.pgoutput.encode import (
    encode_origin as encode_origin,
)
from csnd.reader.pgoutput.encode import (
    encode_relation as encode_relation,
)
from csnd.reader.pgoutput.encode import (
    encode_status_update as encode_status_update,
)
from csnd.reader.pgoutput.encode import (
    encode_stream_abort as encode_stream_abort,
)
from csnd.reader.pgoutput.encode import (
    encode_stream_commit as encode_stream_commit,
)
from csnd.reader.pgoutput.encode import (
    encode_stream_start as encode_stream_start,
)
from csnd.reader.pgoutput.encode import (
    encode_stream_stop as encode_stream_stop,
)
from csnd.reader.pgoutput.encode import (
    encode_truncate as encode_truncate,
)
from csnd.reader.pgoutput.encode import (
    encode_tuple as encode_tuple,
)
from csnd.reader.pgoutput.encode import (
    encode_type as encode_type,
)
from csnd.reader.pgoutput.encode import (
    encode_update as encode_update,
)
from csnd.reader.pgoutput.encode import (
    encode_xlogdata as encode_xlogdata,
)
from csnd.reader.pgoutput.layouts import (
    RUN_FRAME_LENGTH as RUN_FRAME_LENGTH,
)
from csnd.reader.pgoutput.layouts import (
    XLOGDATA_HEADER_SIZE as XLOGDATA_HEADER_SIZE,
)
from csnd.reader.pgoutput.layouts import (
    XLOGDATA_START as XLOGDATA_START,
)
from csnd.reader.pgoutput.messages import (
    MESSAGE_NAMES as MESSAGE_NAMES,
)
from csnd.reader.pgoutput.messages import (
    Begin as Begin,
)
from csnd.reader.pgoutput.messages import (
    Change as Change,
)
from csnd.reader.pgoutput.messages import (
    Column as Column,
)
from csnd.reader.pgoutput.messages import (
    Commit as Commit,
)
from csnd.reader.pgoutput.messages import (
    Frame as Frame,
)
from csnd.reader.pgoutput.messages import (
    Keepalive as Keepalive,
)
from csnd.reader.pgoutput.messages import (
    LogicalMessage as LogicalMessage,
)
from csnd.reader.pgoutput.messages import (
    Message as Message,
)
from csnd.reader.pgoutput.messages import (
    Origin as Origin,
)
from csnd.reader.pgoutput.messages import (
    Relation as Relation,
)
from csnd.reader.pgoutput.messages import (
    StreamAbort as StreamAbort,
)
from csnd.reader.pgoutput.messages import (
    StreamCommit as StreamCommit,
)
from csnd.reader.pgoutput.messages import (
    StreamStart as StreamStart,
)
from csnd.reader.pgoutput.messages import (
    StreamStop as StreamStop,
)
from csnd.reader.pgoutput.messages import (
    Truncate as Truncate,
)
from csnd.reader.pgoutput.messages import (
    TypeMsg as TypeMsg,
)
from csnd.reader.pgoutput.messages import (
    XLogData as XLogData,
)
from csnd.reader.pgoutput.parse import (
    CHANGE_FRAME_MIN as CHANGE_FRAME_MIN,
)
from csnd.reader.pgoutput.parse import (
    CHANGE_TAGS as CHANGE_TAGS,
)
from csnd.reader.pgoutput.parse import (
    CHANGE_XID_OFFSET as CHANGE_XID_OFFSET,
)
from csnd.reader.pgoutput.parse import (
    FRAMED_CHANGE_HEAD as FRAMED_CHANGE_HEAD,
)
from csnd.reader.pgoutput.parse import (
    TXN_TAGS as TXN_TAGS,
)
from csnd.reader.pgoutput.parse import (
    ChangeFrames as ChangeFrames,
)
from csnd.reader.pgoutput.parse import (
    PgOutputParser as PgOutputParser,
)
from csnd.reader.pgoutput.parse import (
    ScannedTxn as ScannedTxn,
)
from csnd.reader.pgoutput.parse import (
    TxnFrames as TxnFrames,
)
from csnd.reader.pgoutput.parse import (
    TxnRun as TxnRun,
)
from csnd.reader.pgoutput.parse import (
    iter_change_frames as iter_change_frames,
)
from csnd.reader.pgoutput.parse import (
    one_change_frame as one_change_frame,
)
from csnd.reader.pgoutput.parse import (
    parse_change_frame as parse_change_frame,
)
from csnd.reader.pgoutput.parse import (
    parse_frame as parse_frame,
)
from csnd.reader.pgoutput.parse import (
    parse_hot_frame as parse_hot_frame,
)
from csnd.reader.pgoutput.parse import (
    parse_message as parse_message,
)
from csnd.reader.pgoutput.parse import (
    parse_txn_frame as parse_txn_frame,
)
from csnd.reader.pgoutput.parse import (
    scanned_txn as scanned_txn,
)
from csnd.reader.pgoutput.parse import (
    scanned_txn_frames as scanned_txn_frames,
)
