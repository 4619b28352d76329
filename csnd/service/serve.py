"""`csnd serve`: the pipeline over the sources, the durable changelog, the changefeed, the dashboard.

    sources ─► NodeInputs ─► Merger ─► ChangelogSink ─► Changelog ─► Changefeed (gRPC)
                    ▲            (pipeline thread)      group commit   │            Subscribe / Fetch / Status
                    │                                                   │
                    └──── confirm each slot to what is durable ◄────────┘     DashboardServer (HTTP)
                                                                               /, /metrics, /api/status

The main thread starts the changelog, the gRPC server and the dashboard,
then runs the pipeline in a thread of its own and waits for it or for a stop
request.  `Service` only composes the parts, each of one job:

    serve_sources   the sources, opened (live nodes: the one place), and each run's node inputs
    serve_slots     the live slots: kept, prepared before the ready line, dropped to retake a snapshot
    serve_snapshot  the initial snapshot (taken again when cut short) and the incremental ones
    serve_pipeline  the pipeline thread: the initial snapshot, then runs, restarted after a backoff
    serve_status    the nodes over the runs, the service's Status figures, /readyz

Ready.  Before the ready line (and before gRPC health says SERVING) every
live source's slot exists at its consistent point -- created now with
`create_slot`, checked otherwise (`LiveSource.prepare`) -- so every
transaction committed after the line is delivered; a new slot would miss
what commits before that point.  A slot that cannot be made or used is one
line naming node and slot, exit 1.  Restarts of the pipeline find the slots
there.  Consumers only ever read what the changelog has made durable, so
nothing they see can be lost by a crash, and the slots are confirmed only as
far as that (invariant 7).

Restarts.  A pipeline that fails with a transient cause (a dead decoder
process, a lost node agent, a source's connection that gave up) is torn down
and started again from the changelog's position after a backoff: each source
resumes from its slot's confirmed LSN (or a recorded file from its start),
and the senders drop what the changelog already holds (`resume_csn`), so
nothing is lost and nothing is appended twice.  Consumers keep their streams
meanwhile.  The waits come from `csnd.core.backoff` (jittered, the ceiling
doubling and never reset: a pipeline that keeps failing waits longer and
longer); `RESTART_LIMIT` failures within `RESTART_WINDOW_S` end the service
with exit 1.  A protocol error is not transient: one line naming node, LSN
and xid, exit 1, the changelog intact so that a fixed configuration resumes.

Stopping (SIGTERM, Ctrl-C): the pipeline stops taking input, what it wrote is
made durable and confirmed, the streams end cleanly, exit 0.  Sources that
end (files, `until_lsn`) leave the service serving what it has.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, TextIO

import grpc

from csnd.changelog import Changelog, SubscriptionStore
from csnd.core.auth import Credentials, read_credentials_file
from csnd.core.errors import CsndError, SlotLost
from csnd.core.tokens import read_token_file
from csnd.runtime.stopping import ignore_stop_signals
from csnd.service.changefeed import FeedSettings
from csnd.service.config import ServeConfig
from csnd.service.limits import StreamLimits
from csnd.service.serve_pipeline import RESTART_FIRST_S as RESTART_FIRST_S  # (re-exported)
from csnd.service.serve_pipeline import RESTART_MAX_S as RESTART_MAX_S  # (re-exported)
from csnd.service.serve_pipeline import PipelineSupervisor, newest_record, restart_backoff
from csnd.service.serve_slots import Slots
from csnd.service.serve_snapshot import InitialSnapshot, open_incremental
from csnd.service.serve_sources import node_databases as node_databases
from csnd.service.serve_status import NodeWatches, Readiness, ServiceStatus, StartPhase
from csnd.service.server import RunningServer, TlsFiles, start_changefeed
from csnd.service.status import status_document
from csnd.snapshot import SnapshotProgress, snapshot_state
from csnd.snapshot.watermark import Windows

if TYPE_CHECKING:
    from csnd.service.http import DashboardServer
    from csnd.service.parquet import ParquetExport
    from csnd.snapshot.incremental import IncrementalSnapshots

log = logging.getLogger("csnd.serve")


class Service:
    """One `csnd serve` run: opens the changelog, starts and stops the parts; `run()` returns the exit status."""

    def __init__(self, config: ServeConfig, *, stdout: TextIO | None = None) -> None:
        self.config = config
        self.stdout = stdout or sys.stdout
        self.log: Changelog | None = None
        self.feed: RunningServer | None = None
        self.http: DashboardServer | None = None
        self.parquet: ParquetExport | None = None  # --parquet-dir
        self.pipeline: PipelineSupervisor | None = None
        self.initial: InitialSnapshot | None = None
        self.incremental: IncrementalSnapshots | None = None  # csnd snapshot
        self.watches = NodeWatches()
        self.snapshot_progress = SnapshotProgress()
        # Incremental snapshots' open windows, shown every appended transaction
        self.windows = Windows()
        # The waits before restarting a failed pipeline (give-up: RESTART_LIMIT in the window).
        self.restart_backoff = restart_backoff()
        self._stop = threading.Event()
        # What the service is doing before it is ready (/readyz says it); "" once ready.
        self.phase = StartPhase("opening the changelog")

    def run(self) -> int:
        cfg = self.config
        token = read_token_file(cfg.token_file) if cfg.token_file else None
        credentials = read_credentials_file(cfg.credentials_file) if cfg.credentials_file else None
        tls = TlsFiles(cfg.tls_cert, cfg.tls_key) if cfg.tls_cert and cfg.tls_key else None
        thresholds = None
        if cfg.http:
            from csnd.service.http import Thresholds

            thresholds = Thresholds.from_mapping(cfg.thresholds)
        os.makedirs(cfg.changelog, exist_ok=True)
        self.log = changelog = Changelog(
            cfg.changelog,
            retention_bytes=cfg.retention_bytes,
            retention_hours=cfg.retention_hours,
            retention_hold_bytes=cfg.retention_hold_bytes,
            retention_hold_hours=cfg.retention_hold_hours,
        )
        snapshot = snapshot_state(newest_record(changelog))
        if snapshot.state == "incomplete":
            changelog.hold_readers(
                0
            )  # (an initial snapshot cut short: shown to no one; see InitialSnapshot.check)
        slots = Slots(cfg)
        initial = self.initial = InitialSnapshot(cfg, changelog, slots, self.snapshot_progress, self._stop)
        pipeline = self.pipeline = PipelineSupervisor(
            cfg, changelog, self.windows, self.watches, initial, self.restart_backoff, self._stop
        )
        readiness = Readiness(
            self.phase, self._stop, pipeline, initial, self.watches, len(cfg.sources), cfg.readiness_grace_s
        )
        try:
            self.phase.doing = "starting the changefeed"
            self.feed = feed = start_changefeed(
                changelog,
                listen=cfg.listen,
                token=token,
                tls=tls,
                status=ServiceStatus(self.watches, pipeline, self.snapshot_progress),
                subscriptions=SubscriptionStore(cfg.changelog),
                directory=os.path.abspath(cfg.changelog),
                serving=False,
                health_needs_token=cfg.health_needs_token,
                settings=_feed_settings(cfg),
                credentials=Credentials(credentials) if credentials else None,
                limits=StreamLimits(cfg.max_streams, cfg.max_streams_per_peer),
                databases=node_databases(cfg.sources),
                snapshots=lambda: self.incremental,
            )
            if cfg.http:
                # Up before the slots are prepared (which may wait long for a new slot's
                # consistent point): /healthz answers, /readyz says what it waits for.
                from csnd.service.http import DashboardServer

                self.http = DashboardServer(
                    cfg.http,
                    self.status_document,
                    token=token,
                    credentials=Credentials(credentials) if credentials else None,
                    thresholds=thresholds,
                    ready=readiness.check,
                    tls=tls,
                    allowed_hosts=cfg.http_allowed_hosts,
                )
                self.http.start()
            self.phase.doing = "checking the slots and the changelog"
            # (first: a snapshot taken again drops its slots and empties the changelog)
            initial.check(snapshot)
            slots.check_kept(changelog.durable_csn)
            if cfg.parquet_dir:
                from csnd.service.parquet import ParquetExport

                self.parquet = ParquetExport(changelog, cfg.parquet_dir, on_failure=self._export_failed)
                self.parquet.start()
            self.phase.doing = (
                "preparing the slots (a new slot waits for the transactions open on its server)"
            )
            initial.prepare()
            self._open_incremental(feed, changelog)
            feed.set_serving()
            try:  # (from the ready line on, a stop is the clean one, even at once)
                self._say(f"csnd serve: listening on {feed.address}")
                if self.http is not None:
                    self._say(f"csnd serve: dashboard on {self.http.url}")
                pipeline.start()
                if self.incremental is not None:
                    self.incremental.start()
                self.phase.doing = ""
                pipeline.wait()
                self._tell_consumers(feed, pipeline.failure)
            except KeyboardInterrupt:
                log.info("stopping: making what was written durable and confirming the slots")
            self.stop()
            return self._finish(pipeline)
        finally:
            self._close()

    def _open_incremental(self, feed: RunningServer, changelog: Changelog) -> None:
        """The incremental snapshots, if any live source; the changefeed then knows the sources' tables."""
        jobs = open_incremental(self.config, changelog, self.windows)
        if jobs is None:
            return
        from csnd.service.knowntables import PublishedTables

        feed.servicer.known_tables.published = PublishedTables(
            [(a.node, a.conninfo, a.publication) for a in jobs.nodes.values()]
        )
        self.incremental = jobs

    def status_document(self) -> dict[str, Any]:
        """The gRPC Status answer as JSON (proto3 field names): /api/status and /metrics read this."""
        assert self.feed is not None
        return status_document(self.feed.servicer.feed_status())

    def _tell_consumers(self, feed: RunningServer, failure: BaseException | None) -> None:
        """A slot gone ends every stream with DATA_LOSS and the service's own line (node, slot, LSN).

        A restart over this changelog is refused, so a consumer left to
        reconnect would wait for a service that cannot come back, told only
        that the connection was lost."""
        if isinstance(failure, SlotLost):
            feed.servicer.end_streams(grpc.StatusCode.DATA_LOSS, f"the service stopped: {failure}")

    def _say(self, line: str) -> None:
        print(line, file=self.stdout, flush=True)

    def stop(self) -> None:
        """Stop taking input (any thread); `run()` then makes durable, confirms and returns 0."""
        self._stop.set()
        if self.initial is not None:
            self.initial.stop()
        if self.pipeline is not None:
            self.pipeline.request_stop()
        if self.incremental is not None:  # (after the pipeline's stop: this one waits for its thread)
            self.incremental.stop()

    def _finish(self, pipeline: PipelineSupervisor) -> int:
        ignore_stop_signals()  # while the last durable step and confirmations run
        pipeline.join(timeout=60)
        failure = pipeline.failure
        if failure is not None and not isinstance(failure, KeyboardInterrupt):
            raise failure
        return 0

    def _export_failed(self, e: BaseException) -> None:
        """The Parquet export stopped (its thread): the service ends with its error line."""
        if self.pipeline is not None:
            self.pipeline.fail(e)
        self.stop()

    def _close(self) -> None:
        if self.parquet is not None:  # (before the changelog closes: it reads it, and writes what is pending)
            self.parquet.stop()
        self.watches.stop()
        if self.http is not None:
            self.http.stop()
        if self.feed is not None:
            try:
                self.feed.stop()  # (stores the named marks: on a full disk that fails too)
            except CsndError as e:
                if sys.exc_info()[1] is None:
                    raise
                # (closing after a failure: that failure is the one line reported, not this echo of it)
                log.error("%s", e)
        if self.log is not None:
            if self.pipeline is not None:  # (its sync thread first: one sync at a time)
                self.pipeline.close()
            with contextlib.suppress(CsndError, OSError):
                self.log.sync()
            self.log.close()


def _feed_settings(cfg: ServeConfig) -> FeedSettings:
    """The changefeed's settings the configuration changes (the rest: FeedSettings' defaults)."""
    if cfg.arrow_files_bytes is None:
        return FeedSettings()
    return FeedSettings(arrow_files_bytes=cfg.arrow_files_bytes)


def run_serve(config: ServeConfig) -> int:
    service = Service(config)
    status = service.run()
    durable = service.log.durable_csn if service.log is not None else 0
    log.info("stopped: the changelog is durable through csn %d", durable, extra={"csn": durable})
    return status
