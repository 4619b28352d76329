from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StartSnapshotRequest(_message.Message):
    __slots__ = ("tables", "node", "chunk_rows")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_ROWS_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedScalarFieldContainer[str]
    node: str
    chunk_rows: int
    def __init__(self, tables: _Optional[_Iterable[str]] = ..., node: _Optional[str] = ..., chunk_rows: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("start", "ack", "keepalive")
    START_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    start: SubscribeStart
    ack: SubscribeAck
    keepalive: FeedKeepalive
    def __init__(self, start: _Optional[_Union[SubscribeStart, _Mapping]] = ..., ack: _Optional[_Union[SubscribeAck, _Mapping]] = ..., keepalive: _Optional[_Union[FeedKeepalive, _Mapping]] = ...) -> None: ...

class SubscribeStart(_message.Message):
    __slots__ = ("after_csn", "name", "tables", "schemas", "format")
    AFTER_CSN_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    SCHEMAS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    after_csn: int
    name: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    schemas: bool
    format: str
    def __init__(self, after_csn: _Optional[int] = ..., name: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., schemas: _Optional[bool] = ..., format: _Optional[str] = ...) -> None: ...

class SubscribeAck(_message.Message):
    __slots__ = ("csn",)
    CSN_FIELD_NUMBER: _ClassVar[int]
    csn: int
    def __init__(self, csn: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("batch", "keepalive", "subscribed", "relations")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    KEEPALIVE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    batch: TransactionBatch
    keepalive: FeedKeepalive
    subscribed: Subscribed
    relations: RelationBatch
    def __init__(self, batch: _Optional[_Union[TransactionBatch, _Mapping]] = ..., keepalive: _Optional[_Union[FeedKeepalive, _Mapping]] = ..., subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., relations: _Optional[_Union[RelationBatch, _Mapping]] = ...) -> None: ...

class RelationLine(_message.Message):
    __slots__ = ("csn", "line")
    CSN_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    csn: int
    line: bytes
    def __init__(self, csn: _Optional[int] = ..., line: _Optional[bytes] = ...) -> None: ...

class RelationBatch(_message.Message):
    __slots__ = ("relations",)
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    relations: _containers.RepeatedCompositeFieldContainer[RelationLine]
    def __init__(self, relations: _Optional[_Iterable[_Union[RelationLine, _Mapping]]] = ...) -> None: ...

class FeedKeepalive(_message.Message):
    __slots__ = ("send_time_us", "reply_requested")
    SEND_TIME_US_FIELD_NUMBER: _ClassVar[int]
    REPLY_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    send_time_us: int
    reply_requested: bool
    def __init__(self, send_time_us: _Optional[int] = ..., reply_requested: _Optional[bool] = ...) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("after_csn", "oldest_csn", "newest_csn")
    AFTER_CSN_FIELD_NUMBER: _ClassVar[int]
    OLDEST_CSN_FIELD_NUMBER: _ClassVar[int]
    NEWEST_CSN_FIELD_NUMBER: _ClassVar[int]
    after_csn: int
    oldest_csn: int
    newest_csn: int
    def __init__(self, after_csn: _Optional[int] = ..., oldest_csn: _Optional[int] = ..., newest_csn: _Optional[int] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("csn", "line", "more")
    CSN_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    csn: int
    line: bytes
    more: bool
    def __init__(self, csn: _Optional[int] = ..., line: _Optional[bytes] = ..., more: _Optional[bool] = ...) -> None: ...

class TransactionBatch(_message.Message):
    __slots__ = ("transactions",)
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[Transaction]
    def __init__(self, transactions: _Optional[_Iterable[_Union[Transaction, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("after_csn", "until_csn", "tables", "format", "client_host")
    AFTER_CSN_FIELD_NUMBER: _ClassVar[int]
    UNTIL_CSN_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    after_csn: int
    until_csn: int
    tables: _containers.RepeatedScalarFieldContainer[str]
    format: str
    client_host: str
    def __init__(self, after_csn: _Optional[int] = ..., until_csn: _Optional[int] = ..., tables: _Optional[_Iterable[str]] = ..., format: _Optional[str] = ..., client_host: _Optional[str] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("batch", "arrow", "arrow_file")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ARROW_FIELD_NUMBER: _ClassVar[int]
    ARROW_FILE_FIELD_NUMBER: _ClassVar[int]
    batch: TransactionBatch
    arrow: bytes
    arrow_file: ArrowFile
    def __init__(self, batch: _Optional[_Union[TransactionBatch, _Mapping]] = ..., arrow: _Optional[bytes] = ..., arrow_file: _Optional[_Union[ArrowFile, _Mapping]] = ...) -> None: ...

class ArrowFile(_message.Message):
    __slots__ = ("path", "offset", "length", "after_csn", "rows")
    PATH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    AFTER_CSN_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    path: str
    offset: int
    length: int
    after_csn: int
    rows: int
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., after_csn: _Optional[int] = ..., rows: _Optional[int] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionInfo]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[SubscriptionInfo, _Mapping]]] = ...) -> None: ...

class ResetSubscriptionRequest(_message.Message):
    __slots__ = ("name", "csn")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CSN_FIELD_NUMBER: _ClassVar[int]
    name: str
    csn: int
    def __init__(self, name: _Optional[str] = ..., csn: _Optional[int] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SubscriptionInfo(_message.Message):
    __slots__ = ("name", "acknowledged_csn", "tables", "connected", "peer", "lag_transactions", "lag_at_least", "previous_csn")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_CSN_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    LAG_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    LAG_AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_CSN_FIELD_NUMBER: _ClassVar[int]
    name: str
    acknowledged_csn: int
    tables: _containers.RepeatedScalarFieldContainer[str]
    connected: bool
    peer: str
    lag_transactions: int
    lag_at_least: bool
    previous_csn: int
    def __init__(self, name: _Optional[str] = ..., acknowledged_csn: _Optional[int] = ..., tables: _Optional[_Iterable[str]] = ..., connected: _Optional[bool] = ..., peer: _Optional[str] = ..., lag_transactions: _Optional[int] = ..., lag_at_least: _Optional[bool] = ..., previous_csn: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("time_us", "nodes", "changelog", "consumers", "version", "totals", "snapshot", "incremental")
    TIME_US_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    CHANGELOG_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    INCREMENTAL_FIELD_NUMBER: _ClassVar[int]
    time_us: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    changelog: ChangelogStatus
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerStatus]
    version: str
    totals: Totals
    snapshot: SnapshotStatus
    incremental: SnapshotStatus
    def __init__(self, time_us: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ..., changelog: _Optional[_Union[ChangelogStatus, _Mapping]] = ..., consumers: _Optional[_Iterable[_Union[ConsumerStatus, _Mapping]]] = ..., version: _Optional[str] = ..., totals: _Optional[_Union[Totals, _Mapping]] = ..., snapshot: _Optional[_Union[SnapshotStatus, _Mapping]] = ..., incremental: _Optional[_Union[SnapshotStatus, _Mapping]] = ...) -> None: ...

class SnapshotStatus(_message.Message):
    __slots__ = ("state", "first_csn", "last_csn", "tables", "job", "error", "gtm_csn", "barrier_ms", "queued", "ended")
    class EndedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STATE_FIELD_NUMBER: _ClassVar[int]
    FIRST_CSN_FIELD_NUMBER: _ClassVar[int]
    LAST_CSN_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GTM_CSN_FIELD_NUMBER: _ClassVar[int]
    BARRIER_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    ENDED_FIELD_NUMBER: _ClassVar[int]
    state: str
    first_csn: int
    last_csn: int
    tables: _containers.RepeatedCompositeFieldContainer[SnapshotTableStatus]
    job: str
    error: str
    gtm_csn: int
    barrier_ms: float
    queued: _containers.RepeatedScalarFieldContainer[str]
    ended: _containers.ScalarMap[str, str]
    def __init__(self, state: _Optional[str] = ..., first_csn: _Optional[int] = ..., last_csn: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[SnapshotTableStatus, _Mapping]]] = ..., job: _Optional[str] = ..., error: _Optional[str] = ..., gtm_csn: _Optional[int] = ..., barrier_ms: _Optional[float] = ..., queued: _Optional[_Iterable[str]] = ..., ended: _Optional[_Mapping[str, str]] = ...) -> None: ...

class SnapshotTableStatus(_message.Message):
    __slots__ = ("node", "schema", "table", "state", "rows", "rows_estimated", "chunks_done", "chunks", "eta_seconds", "rows_per_second")
    NODE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ROWS_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_DONE_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ETA_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROWS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    node: str
    schema: str
    table: str
    state: str
    rows: int
    rows_estimated: int
    chunks_done: int
    chunks: int
    eta_seconds: float
    rows_per_second: float
    def __init__(self, node: _Optional[str] = ..., schema: _Optional[str] = ..., table: _Optional[str] = ..., state: _Optional[str] = ..., rows: _Optional[int] = ..., rows_estimated: _Optional[int] = ..., chunks_done: _Optional[int] = ..., chunks: _Optional[int] = ..., eta_seconds: _Optional[float] = ..., rows_per_second: _Optional[float] = ...) -> None: ...

class Totals(_message.Message):
    __slots__ = ("transactions", "changes", "skipped", "restarts")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    transactions: int
    changes: int
    skipped: int
    restarts: int
    def __init__(self, transactions: _Optional[int] = ..., changes: _Optional[int] = ..., skipped: _Optional[int] = ..., restarts: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("name", "mode", "state", "received_lsn", "confirmed_lsn", "watermark_csn", "lag_bytes", "lag_seconds", "stuck", "error", "transactions", "changes", "retained_wal_bytes", "source", "queue_depths", "decoded_changes", "restarts", "waiting_committing", "waiting_commit", "waiting_merge", "spill_bytes", "slot_wal_status", "slot_safe_wal_size", "server_role")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_LSN_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_LSN_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_CSN_FIELD_NUMBER: _ClassVar[int]
    LAG_BYTES_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STUCK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    RETAINED_WAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTHS_FIELD_NUMBER: _ClassVar[int]
    DECODED_CHANGES_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_COMMITTING_FIELD_NUMBER: _ClassVar[int]
    WAITING_COMMIT_FIELD_NUMBER: _ClassVar[int]
    WAITING_MERGE_FIELD_NUMBER: _ClassVar[int]
    SPILL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SLOT_WAL_STATUS_FIELD_NUMBER: _ClassVar[int]
    SLOT_SAFE_WAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    SERVER_ROLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    mode: str
    state: str
    received_lsn: int
    confirmed_lsn: int
    watermark_csn: int
    lag_bytes: int
    lag_seconds: float
    stuck: bool
    error: str
    transactions: int
    changes: int
    retained_wal_bytes: int
    source: str
    queue_depths: _containers.RepeatedScalarFieldContainer[int]
    decoded_changes: int
    restarts: int
    waiting_committing: int
    waiting_commit: int
    waiting_merge: int
    spill_bytes: int
    slot_wal_status: str
    slot_safe_wal_size: int
    server_role: str
    def __init__(self, name: _Optional[str] = ..., mode: _Optional[str] = ..., state: _Optional[str] = ..., received_lsn: _Optional[int] = ..., confirmed_lsn: _Optional[int] = ..., watermark_csn: _Optional[int] = ..., lag_bytes: _Optional[int] = ..., lag_seconds: _Optional[float] = ..., stuck: _Optional[bool] = ..., error: _Optional[str] = ..., transactions: _Optional[int] = ..., changes: _Optional[int] = ..., retained_wal_bytes: _Optional[int] = ..., source: _Optional[str] = ..., queue_depths: _Optional[_Iterable[int]] = ..., decoded_changes: _Optional[int] = ..., restarts: _Optional[int] = ..., waiting_committing: _Optional[int] = ..., waiting_commit: _Optional[int] = ..., waiting_merge: _Optional[int] = ..., spill_bytes: _Optional[int] = ..., slot_wal_status: _Optional[str] = ..., slot_safe_wal_size: _Optional[int] = ..., server_role: _Optional[str] = ...) -> None: ...

class ChangelogStatus(_message.Message):
    __slots__ = ("oldest_csn", "newest_csn", "bytes", "segments", "directory", "fsyncs", "fsync_seconds_total", "last_fsync_seconds", "holds")
    OLDEST_CSN_FIELD_NUMBER: _ClassVar[int]
    NEWEST_CSN_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    FSYNCS_FIELD_NUMBER: _ClassVar[int]
    FSYNC_SECONDS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_FSYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    oldest_csn: int
    newest_csn: int
    bytes: int
    segments: int
    directory: str
    fsyncs: int
    fsync_seconds_total: float
    last_fsync_seconds: float
    holds: _containers.RepeatedCompositeFieldContainer[RetentionHold]
    def __init__(self, oldest_csn: _Optional[int] = ..., newest_csn: _Optional[int] = ..., bytes: _Optional[int] = ..., segments: _Optional[int] = ..., directory: _Optional[str] = ..., fsyncs: _Optional[int] = ..., fsync_seconds_total: _Optional[float] = ..., last_fsync_seconds: _Optional[float] = ..., holds: _Optional[_Iterable[_Union[RetentionHold, _Mapping]]] = ...) -> None: ...

class RetentionHold(_message.Message):
    __slots__ = ("holder", "held_bytes")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    holder: str
    held_bytes: int
    def __init__(self, holder: _Optional[str] = ..., held_bytes: _Optional[int] = ...) -> None: ...

class ConsumerStatus(_message.Message):
    __slots__ = ("peer", "name", "acknowledged_csn", "sent_csn", "lag_transactions", "lag_at_least", "connected", "tables", "transactions_sent", "connected_since_us")
    PEER_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ACKNOWLEDGED_CSN_FIELD_NUMBER: _ClassVar[int]
    SENT_CSN_FIELD_NUMBER: _ClassVar[int]
    LAG_TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    LAG_AT_LEAST_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONS_SENT_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_US_FIELD_NUMBER: _ClassVar[int]
    peer: str
    name: str
    acknowledged_csn: int
    sent_csn: int
    lag_transactions: int
    lag_at_least: bool
    connected: bool
    tables: _containers.RepeatedScalarFieldContainer[str]
    transactions_sent: int
    connected_since_us: int
    def __init__(self, peer: _Optional[str] = ..., name: _Optional[str] = ..., acknowledged_csn: _Optional[int] = ..., sent_csn: _Optional[int] = ..., lag_transactions: _Optional[int] = ..., lag_at_least: _Optional[bool] = ..., connected: _Optional[bool] = ..., tables: _Optional[_Iterable[str]] = ..., transactions_sent: _Optional[int] = ..., connected_since_us: _Optional[int] = ...) -> None: ...
