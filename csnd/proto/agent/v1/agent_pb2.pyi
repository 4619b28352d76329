from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "mode", "binary")
    NODE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    node: str
    mode: str
    binary: bool
    def __init__(self, node: _Optional[str] = ..., mode: _Optional[str] = ..., binary: _Optional[bool] = ...) -> None: ...

class Position(_message.Message):
    __slots__ = ("csn", "index")
    CSN_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    csn: int
    index: int
    def __init__(self, csn: _Optional[int] = ..., index: _Optional[int] = ...) -> None: ...

class CoordinatorMessage(_message.Message):
    __slots__ = ("subscribe", "ack", "keepalive")
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    subscribe: Subscribe
    ack: Ack
    keepalive: Keepalive
    def __init__(self, subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., keepalive: _Optional[_Union[Keepalive, _Mapping]] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("after",)
    AFTER_FIELD_NUMBER: _ClassVar[int]
    after: Position
    def __init__(self, after: _Optional[_Union[Position, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("received", "confirm_lsn", "final")
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_LSN_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    received: Position
    confirm_lsn: int
    final: bool
    def __init__(self, received: _Optional[_Union[Position, _Mapping]] = ..., confirm_lsn: _Optional[int] = ..., final: _Optional[bool] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("batch", "watermark", "end", "keepalive")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    batch: NodeBatch
    watermark: Watermark
    end: End
    keepalive: Keepalive
    def __init__(self, batch: _Optional[_Union[NodeBatch, _Mapping]] = ..., watermark: _Optional[_Union[Watermark, _Mapping]] = ..., end: _Optional[_Union[End, _Mapping]] = ..., keepalive: _Optional[_Union[Keepalive, _Mapping]] = ...) -> None: ...

class NodeBatch(_message.Message):
    __slots__ = ("position", "gid", "has_gid", "xid", "commit_lsn", "end_lsn", "commit_time_us", "cid", "last_of_txn", "changes", "confirmable_lsn", "relations")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    HAS_GID_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    COMMIT_LSN_FIELD_NUMBER: _ClassVar[int]
    END_LSN_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_US_FIELD_NUMBER: _ClassVar[int]
    CID_FIELD_NUMBER: _ClassVar[int]
    LAST_OF_TXN_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    CONFIRMABLE_LSN_FIELD_NUMBER: _ClassVar[int]
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    position: Position
    gid: str
    has_gid: bool
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time_us: int
    cid: int
    last_of_txn: bool
    changes: _containers.RepeatedCompositeFieldContainer[Change]
    confirmable_lsn: int
    relations: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, position: _Optional[_Union[Position, _Mapping]] = ..., gid: _Optional[str] = ..., has_gid: _Optional[bool] = ..., xid: _Optional[int] = ..., commit_lsn: _Optional[int] = ..., end_lsn: _Optional[int] = ..., commit_time_us: _Optional[int] = ..., cid: _Optional[int] = ..., last_of_txn: _Optional[bool] = ..., changes: _Optional[_Iterable[_Union[Change, _Mapping]]] = ..., confirmable_lsn: _Optional[int] = ..., relations: _Optional[_Iterable[str]] = ...) -> None: ...

class Change(_message.Message):
    __slots__ = ("cid", "lsn", "body")
    CID_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    cid: int
    lsn: int
    body: str
    def __init__(self, cid: _Optional[int] = ..., lsn: _Optional[int] = ..., body: _Optional[str] = ...) -> None: ...

class Watermark(_message.Message):
    __slots__ = ("csn",)
    CSN_FIELD_NUMBER: _ClassVar[int]
    csn: int
    def __init__(self, csn: _Optional[int] = ...) -> None: ...

class End(_message.Message):
    __slots__ = ("error", "error_class", "message", "node", "lsn", "xid")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CLASS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LSN_FIELD_NUMBER: _ClassVar[int]
    XID_FIELD_NUMBER: _ClassVar[int]
    error: str
    error_class: str
    message: str
    node: str
    lsn: int
    xid: int
    def __init__(self, error: _Optional[str] = ..., error_class: _Optional[str] = ..., message: _Optional[str] = ..., node: _Optional[str] = ..., lsn: _Optional[int] = ..., xid: _Optional[int] = ...) -> None: ...

class Keepalive(_message.Message):
    __slots__ = ("send_time_us",)
    SEND_TIME_US_FIELD_NUMBER: _ClassVar[int]
    send_time_us: int
    def __init__(self, send_time_us: _Optional[int] = ...) -> None: ...
