"""StartSnapshot: an incremental snapshot of tables, asked over gRPC (`csnd snapshot`).

The service's incremental snapshots (csnd.snapshot.incremental) exist only
when it reads a live PostgreSQL source itself, and only once its slots are
ready: the changefeed asks `jobs()` for them at each call, and refuses with
FAILED_PRECONDITION while there are none.
"""

from __future__ import annotations

import dataclasses

import grpc

from csnd.core.errors import SnapshotError
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.feed_aborts import abort
from csnd.service.feed_ports import SnapshotJobs, SnapshotJobsSource


def no_snapshots() -> SnapshotJobs | None:
    """A service that takes no incremental snapshots."""
    return None


class SnapshotStarter:
    """The StartSnapshot RPC over the service's incremental snapshots."""

    def __init__(self, jobs: SnapshotJobsSource) -> None:
        self.jobs = jobs

    def start(self, request: pb.StartSnapshotRequest, context: grpc.ServicerContext) -> pb.SnapshotStatus:
        jobs = self.jobs()
        if jobs is None:
            abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this service takes no incremental snapshots: it reads no live PostgreSQL source itself",
            )
        try:
            job = jobs.submit(list(request.tables), request.node or None, request.chunk_rows)
        except ValueError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except SnapshotError as e:  # (a node the service cannot read now: its error names it)
            abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(e))
        if job.state == "queued":  # (the caller follows its own job: the queue shows where it waits)
            return pb.SnapshotStatus(state=job.state, job=job.id, queued=jobs.queued())
        return incremental_status(jobs)


def incremental_status(jobs: SnapshotJobs | None) -> pb.SnapshotStatus:
    """The latest incremental snapshot of `jobs` as Status shows it."""
    job = jobs.latest() if jobs is not None else None
    if job is None or jobs is None:
        return pb.SnapshotStatus()
    return pb.SnapshotStatus(
        state=job.state,
        job=job.id,
        error=job.error,
        tables=[pb.SnapshotTableStatus(**dataclasses.asdict(t)) for t in jobs.progress.tables()],
        queued=jobs.queued(),
        ended=jobs.ended(),
    )
