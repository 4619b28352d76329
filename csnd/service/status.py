"""What Status reports, built in one place for the gRPC Status call and `/api/status`.

    changelog (ChangelogFigures) ─┐
    consumers (ConsumerFigures)  ─┼─► build_status ─► StatusResponse ─► gRPC Status
    incremental snapshot         ─┤                         │
    csnd serve (StatusSource)    ─┘                         └─► status_document ─► /api/status, /metrics

The changefeed knows its changelog, its consumers and the incremental
snapshots it was handed; the nodes, the run's totals and the initial
snapshot are known to the pipeline that feeds the changelog (`csnd serve`),
which gives the servicer a `StatusSource` at construction.  Both figures'
owners are read once per Status request (and per dashboard refresh), so
every read must be cheap and thread-safe: statistics objects, never a wait
on the pipeline.  There is one builder, so the dashboard, the metrics and a
gRPC client read the same figures; `/api/status` is the JSON of the very
`StatusResponse` the gRPC call returns (`status_document`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from google.protobuf import json_format

from csnd import __version__
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb

if TYPE_CHECKING:
    from csnd.snapshot.progress import TableProgress

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
    server_role: str = ""  # "primary" or "standby" (a live node, once its slot is read); "" otherwise
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
            server_role=self.server_role,
        )


@dataclass(frozen=True)
class Totals:
    """What one service run appended (the fields of `csnd.v1.Totals`)."""

    transactions: int = 0
    changes: int = 0
    skipped: int = 0  # re-sent after a restart and already held: not appended again
    restarts: int = 0


class SnapshotFigures(Protocol):
    """An initial snapshot's progress (csnd.snapshot.SnapshotProgress); `state` "" while none is taken."""

    @property
    def state(self) -> str: ...

    @property
    def first_csn(self) -> int: ...

    @property
    def last_csn(self) -> int: ...

    @property
    def gtm_csn(self) -> int: ...

    @property
    def barrier_ms(self) -> float: ...

    def tables(self) -> list[TableProgress]: ...


class StatusSource(Protocol):
    """What the process feeding the changelog adds to Status: its nodes, its totals, its initial snapshot.

    `csnd serve` gives the changefeed one at construction; a changefeed
    served without a pipeline shows nodes alone (`NodesOnly`) or none.
    """

    def node_states(self) -> Sequence[NodeState]:
        """The nodes now, in a stable order."""

    def totals(self) -> Totals | None:
        """What this run appended (None: the process appends nothing itself)."""

    def initial_snapshot(self) -> SnapshotFigures | None:
        """The initial snapshot this run takes (None: it takes none)."""


class NodesOnly:
    """A `StatusSource` of nodes alone: a changefeed whose changelog is fed by no pipeline of its process."""

    def __init__(self, nodes: Iterable[NodeState] = ()) -> None:
        self.nodes = list(nodes)

    def node_states(self) -> Sequence[NodeState]:
        return self.nodes

    def totals(self) -> Totals | None:
        return None

    def initial_snapshot(self) -> SnapshotFigures | None:
        return None


class ChangelogFigures(Protocol):
    """The changelog's figures Status shows (csnd.changelog.Changelog)."""

    @property
    def oldest_csn(self) -> int: ...

    @property
    def visible_csn(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def segment_count(self) -> int: ...

    @property
    def fsyncs(self) -> int: ...

    @property
    def fsync_seconds_total(self) -> float: ...

    @property
    def last_fsync_seconds(self) -> float: ...

    @property
    def retention_held(self) -> Mapping[str, int]: ...


class ConsumerFigures(Protocol):
    """The changefeed's consumers as Status shows them (connected ones first, then idle names)."""

    def consumer_statuses(self, wall: float) -> list[pb.ConsumerStatus]:
        """Each consumer now; `wall` (time.time()) dates the connected ones' `connected_since_us`."""


def build_status(
    changelog: ChangelogFigures,
    directory: str,
    consumers: ConsumerFigures,
    incremental: pb.SnapshotStatus,
    source: StatusSource | None,
    wall: float,
) -> pb.StatusResponse:
    """The Status answer, for the gRPC call and `/api/status` alike; `wall` is when it is taken (time.time()).

    `consumers` and `incremental` are the changefeed's own figures
    (csnd.service.feed_status); `source` adds the pipeline's.  Reads each
    source once and does nothing else: no I/O, no clock.
    """
    nodes = [n.to_pb() for n in source.node_states()] if source is not None else []
    consumer_list = consumers.consumer_statuses(wall)
    # What readers may read: while an initial snapshot is taken none of it is
    # (Changelog.hold_readers), and a consumer that plans by these figures (the
    # Spark source's offsets) must not step over it.
    visible = changelog.visible_csn
    response = pb.StatusResponse(
        time_us=int(wall * 1e6),
        nodes=nodes,
        changelog=pb.ChangelogStatus(
            oldest_csn=changelog.oldest_csn if visible else 0,
            newest_csn=visible,
            bytes=changelog.size_bytes,
            segments=changelog.segment_count,
            directory=directory,
            fsyncs=changelog.fsyncs,
            fsync_seconds_total=changelog.fsync_seconds_total,
            last_fsync_seconds=changelog.last_fsync_seconds,
            holds=[
                pb.RetentionHold(holder=h, held_bytes=n) for h, n in sorted(changelog.retention_held.items())
            ],
        ),
        consumers=consumer_list,
        version=__version__,
        incremental=incremental,
    )
    totals = source.totals() if source is not None else None
    if totals is not None:
        response.totals.CopyFrom(pb.Totals(**dataclasses.asdict(totals)))
        response.totals.SetInParent()  # (shown even when all zero: a run that appended nothing yet)
    progress = source.initial_snapshot() if source is not None else None
    if progress is not None and progress.state:
        response.snapshot.state = progress.state
        response.snapshot.first_csn = progress.first_csn
        response.snapshot.last_csn = progress.last_csn
        response.snapshot.gtm_csn = progress.gtm_csn
        response.snapshot.barrier_ms = progress.barrier_ms
        response.snapshot.tables.extend(
            pb.SnapshotTableStatus(**dataclasses.asdict(t)) for t in progress.tables()
        )
    return response


def status_document(response: pb.StatusResponse) -> dict[str, Any]:
    """A Status answer as `/api/status` serves it: JSON with the proto3 field names, zeros included."""
    document: dict[str, Any] = json_format.MessageToDict(
        response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return document


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
