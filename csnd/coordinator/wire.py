"""NodeBatch and End <-> protobuf, and batch positions.

Pure: the gRPC I/O is the runtime's (the node agent and its client).

A batch's position is `(csn, index of the batch in its transaction)`.  It is
derived from the node's stream alone -- the sender's CSN order and the
deterministic cut of a transaction into batches -- so an agent that restarts
and re-reads its source produces the same positions, and "skip everything up
to the coordinator's last position" gives exactly-once delivery.
"""

from __future__ import annotations

from csnd.coordinator.batch import NodeBatch
from csnd.core.errors import CsndError, WireError, from_wire, to_wire
from csnd.core.ids import Csn, Lsn, Xid
from csnd.proto.agent.v1 import agent_pb2 as pb

Position = tuple[int, int]  # (csn, batch index in its transaction)

BEFORE_ALL: Position = (-1, -1)


def batch_to_pb(batch: NodeBatch, index: int, confirmable_lsn: int | None) -> pb.NodeBatch:
    return pb.NodeBatch(
        position=pb.Position(csn=batch.csn, index=index),
        gid=batch.gid or "",
        has_gid=batch.gid is not None,
        xid=batch.xid,
        commit_lsn=batch.commit_lsn,
        end_lsn=batch.end_lsn,
        commit_time_us=batch.commit_time,
        cid=batch.cid,
        last_of_txn=batch.last_of_txn,
        changes=[pb.Change(cid=c, lsn=lsn, body=body) for c, lsn, body in batch.changes],
        confirmable_lsn=confirmable_lsn or 0,
        relations=batch.relations,
    )


def batch_from_pb(msg: pb.NodeBatch) -> tuple[NodeBatch, Position, int | None]:
    """The batch, its position, and the confirmable LSN if it opens a transaction."""
    batch = NodeBatch(
        Csn(msg.position.csn),
        msg.gid if msg.has_gid else None,
        Xid(msg.xid),
        Lsn(msg.commit_lsn),
        Lsn(msg.end_lsn),
        msg.commit_time_us,
        msg.cid,
        [(c.cid, c.lsn, c.body) for c in msg.changes],
        msg.last_of_txn,
        tuple(msg.relations),
    )
    index = msg.position.index
    return batch, (msg.position.csn, index), (msg.confirmable_lsn if index == 0 else None)


def position_to_pb(pos: Position) -> pb.Position:
    return pb.Position(csn=pos[0], index=pos[1])


def position_from_pb(msg: pb.Position) -> Position:
    return (msg.csn, msg.index)


def end_to_pb(error: BaseException | None) -> pb.End:
    """The end of a node's stream: normal (None), or the error that ended it, class and position kept."""
    if error is None:
        return pb.End()
    w = to_wire(error)
    line = str(error) if isinstance(error, CsndError) else w.message
    return pb.End(
        error=line or w.error_class,
        error_class=w.error_class,
        message=w.message,
        node=w.node,
        lsn=w.lsn,
        xid=w.xid,
    )


def end_from_pb(msg: pb.End) -> CsndError | None:
    """The error `end_to_pb` sent (None: the stream ended normally); an agent without the fields: a CsndError."""
    if not msg.error:
        return None
    if not msg.error_class:
        return CsndError(msg.error)
    return from_wire(
        WireError(
            msg.error_class,
            msg.message,
            msg.node if msg.HasField("node") else None,
            msg.lsn if msg.HasField("lsn") else None,
            msg.xid if msg.HasField("xid") else None,
        )
    )
