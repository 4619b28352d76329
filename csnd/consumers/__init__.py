"""consumers: the programs that read the changefeed, and the Python client they share.

    client              ChangefeedClient (was Changefeed): Subscribe in CSN order, acks,
                        reconnects; fetch: a bounded range
    spark               the `csnd` Spark data source
    subscribe           `csnd subscribe`: the changefeed to stdout or a file
    acking              when `csnd subscribe` acknowledges what it wrote out (internal)
    subscriptions_cmd   `csnd subscriptions list|reset|delete`
    snapshot_cmd        `csnd snapshot`: an incremental snapshot of live tables
    examples            a consumer that keeps a table's current state

Public API for users: `csnd.consumers.client` (ChangefeedClient, fetch,
LargeLine, RelationRecord) and `csnd.consumers.spark` (CsndDataSource).  The
client's parts -- `connection` (reaching the service, its failures in words),
`stream` (one Subscribe stream and its threads), `delivery` (what arrived,
handed out in order) and `lines` -- are internal: import their names from
`client`.  Nothing is imported here (`csnd subscribe` starts without grpc's
import until it connects).
"""

__all__ = ["client", "examples", "snapshot_cmd", "spark", "subscribe", "subscriptions_cmd"]
