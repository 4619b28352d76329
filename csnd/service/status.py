"""What Status reports, and the shape the service's runtime supplies it in.

The changefeed knows its changelog and its consumers; the nodes are known to
the pipeline that feeds the changelog (`csnd serve`).  That runtime gives the
servicer a callable returning one `NodeState` per node -- plain values, no
protobuf -- called once per Status request (and per dashboard refresh), so it
must be cheap and thread-safe: read the statistics objects, do not wait on
the pipeline.  `StatusResponse` is also the document `/api/status` serves
(`google.protobuf.json_format.MessageToDict`), so the dashboard and the
metrics read the same figures the gRPC Status call returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from csnd.proto import csnd_pb2 as pb

NODE_STATES = ("streaming", "reconnecting", "restarting", "ended", "failed")


@dataclass(frozen=True)
class NodeState:
    """One node as Status shows it (the fields of `csnd.v1.NodeStatus`)."""

    name: str
    mode: str  # "gtm" or "single"
    state: str  # one of NODE_STATES
    received_lsn: int = 0  # newest WAL position received from the node
    confirmed_lsn: int = 0  # confirmed to its slot (never past the durable changelog)
    watermark_csn: int = 0
    lag_bytes: int = 0  # WAL between the node's end and what is confirmed
    lag_seconds: float = 0.0  # age of the oldest data received from the node not yet durable
    stuck: bool = False  # the watermark has not moved for longer than allowed
    error: str = ""  # the last error while reconnecting/restarting/failed
    transactions: int = 0
    changes: int = 0
    retained_wal_bytes: int = 0  # WAL its slot holds back on the server (0: unknown)
    source: str = ""  # file path, or host/port/database (never a password)
    queue_depths: tuple[int, ...] = ()  # each decoder's inbox depth
    decoded_changes: int = 0
    restarts: int = 0  # pipeline restarts by the service
    waiting_committing: int = 0
    waiting_commit: int = 0
    waiting_merge: int = 0
    spill_bytes: int = 0
    slot_wal_status: str = ""
    slot_safe_wal_size: int = -1  # -1: unknown or unlimited
    # Seconds it has been reconnecting or restarting (0 otherwise), counted from
    # when the service first saw it so (not in the protobuf: for /readyz).
    down_seconds: float = 0.0

    def to_pb(self) -> pb.NodeStatus:
        return pb.NodeStatus(
            name=self.name,
            mode=self.mode,
            state=self.state,
            received_lsn=self.received_lsn,
            confirmed_lsn=self.confirmed_lsn,
            watermark_csn=max(self.watermark_csn, 0),
            lag_bytes=max(self.lag_bytes, 0),
            lag_seconds=self.lag_seconds,
            stuck=self.stuck,
            error=self.error,
            transactions=self.transactions,
            changes=self.changes,
            retained_wal_bytes=self.retained_wal_bytes,
            source=self.source,
            queue_depths=self.queue_depths,
            decoded_changes=self.decoded_changes,
            restarts=self.restarts,
            waiting_committing=self.waiting_committing,
            waiting_commit=self.waiting_commit,
            waiting_merge=self.waiting_merge,
            spill_bytes=self.spill_bytes,
            slot_wal_status=self.slot_wal_status,
            slot_safe_wal_size=self.slot_safe_wal_size,
        )


# What `csnd serve` passes as `status=`: the nodes now, in a stable order.
NodeStatusSource = Callable[[], Iterable[NodeState]]


def unready_nodes(nodes: Iterable[NodeState], grace_s: float) -> str | None:
    """Why the nodes make the service not ready (`/readyz`), or None when none does.

    A failed node does at once; one reconnecting or restarting does once it
    has been so for longer than `grace_s` (a server restart or a pipeline
    restart is expected to pass within it).  A stuck watermark does not: the
    changelog still serves what it has.  The reason names the node and its
    state, not its error, since `/readyz` is open without the token (the
    error is in Status).
    """
    reasons = []
    for n in nodes:
        if n.state == "failed":
            reasons.append(f"node {n.name} failed")
        elif n.state in ("reconnecting", "restarting") and n.down_seconds > grace_s:
            reasons.append(f"node {n.name} has been {n.state} for {n.down_seconds:.0f}s (over {grace_s:g}s)")
    if not reasons:
        return None
    return "; ".join(reasons) + " (its error is in /api/status)"
