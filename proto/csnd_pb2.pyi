from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NodeBatch(_message.Message):
    __slots__ = ("node", "seq", "csn", "gid", "xid", "commit_lsn", "end_lsn", "commit_time_us", "cid", "last_of_txn", "changes_json")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CSN_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LSN_FIELD_NUMBER: _ClassVar[int]
    END_LSN_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_US_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    LAST_OF_TXN_FIELD_NUMBER: _ClassVar[int]
    CHANGES_JSON_FIELD_NUMBER: _ClassVar[int]
    node: str
    seq: int
    csn: int
    gid: str
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int
    cid: int
    last_of_txn: bool
    changes_json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node: _Optional[str] = ..., seq: _Optional[int] = ..., csn: _Optional[int] = ..., gid: _Optional[str] = ..., xid: _Optional[int] = ..., commit_lsn: _Optional[int] = ..., end_lsn: _Optional[int] = ..., commit_time_us: _Optional[int] = ..., cid: _Optional[int] = ..., last_of_txn: _Optional[bool] = ..., changes_json: _Optional[_Iterable[str]] = ...) -> None: ...

class Watermark(_message.Message):
    __slots__ = ("node", "csn")
    NODE_FIELD_NUMBER: _ClassVar[int]
    CSN_FIELD_NUMBER: _ClassVar[int]
    node: str
    csn: int
    def __init__(self, node: _Optional[str] = ..., csn: _Optional[int] = ...) -> None: ...

class NodeMessage(_message.Message):
    __slots__ = ("batch", "watermark", "keepalive")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    batch: NodeBatch
    watermark: Watermark
    keepalive: Keepalive
    def __init__(self, batch: _Optional[_Union[NodeBatch, _Mapping]] = ..., watermark: _Optional[_Union[Watermark, _Mapping]] = ..., keepalive: _Optional[_Union[Keepalive, _Mapping]] = ...) -> None: ...

class Keepalive(_message.Message):
    __slots__ = ("send_time_us", "reply_requested")
    SEND_TIME_US_FIELD_NUMBER: _ClassVar[int]
    REPLY_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    send_time_us: int
    reply_requested: bool
    def __init__(self, send_time_us: _Optional[int] = ..., reply_requested: _Optional[bool] = ...) -> None: ...

class NodeSubscribe(_message.Message):
    __slots__ = ("after_seq",)
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    def __init__(self, after_seq: _Optional[int] = ...) -> None: ...
