"""The Changefeed gRPC service over a durable changelog (docs/design.md sections 5 and 7).

    client ─► ChangefeedServicer (this module: the gRPC face, one line per RPC)
                ├─ Subscribe ─────────────────► SubscribeStreams   (feed_subscribe)
                ├─ Fetch ─────────────────────► Fetches            (feed_fetch: lines and Arrow rows)
                ├─ List/Reset/DeleteSubscription ► SubscriptionAdmin (feed_admin)
                ├─ StartSnapshot ─────────────► SnapshotStarter    (feed_snapshots)
                └─ Status ────────────────────► status.build_status (consumers: feed_status)
              shared: FeedConsumers (the registry under its lock, feed_consumers),
                      MarkKeeper (named marks, stored durably: feed_marks),
                      Watchdog (cancels calls long silent: feed_watchdog)

Each part takes what it reads at construction, as the Protocols of
csnd.service.feed_ports; the errors every call may end with are in
csnd.service.feed_aborts, the messages in csnd.service.feed_messages.
Named marks hold back the changelog's retention while the servicer runs
(up to the changelog's hold limits); `stop()` ends every stream at its
next look and stores the marks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service.batching import MAX_BATCH_BYTES
from csnd.service.feed_admin import Lag, SubscriptionAdmin
from csnd.service.feed_consumers import FeedConsumers
from csnd.service.feed_ending import Ending
from csnd.service.feed_fetch import Fetches
from csnd.service.feed_marks import MarkKeeper
from csnd.service.feed_ports import MarkStore, SnapshotJobsSource
from csnd.service.feed_snapshots import SnapshotStarter, incremental_status, no_snapshots
from csnd.service.feed_status import ConsumerStatuses
from csnd.service.feed_subscribe import WAIT_S as WAIT_S  # (re-exported: the server's stop waits for it)
from csnd.service.feed_subscribe import SubscribeStreams
from csnd.service.feed_watchdog import Watchdog
from csnd.service.knowntables import KnownTables
from csnd.service.registry import ConsumerRegistry
from csnd.service.status import StatusSource, build_status

if TYPE_CHECKING:
    from csnd.changelog import Changelog
    from csnd.core.auth import Credentials


@dataclass(frozen=True)
class FeedSettings:
    # Bound of one batch message (see csnd.service.batching).
    max_batch_bytes: int = MAX_BATCH_BYTES
    # Rows in one Arrow message of Fetch(format="arrow"), by their size
    # uncompressed (on the wire they take about a seventh).  Larger: fewer
    # record batches for Spark to take in; smaller: less memory per Fetch.
    arrow_message_bytes: int = 8 << 20
    # Where Fetch(format="arrow") readers on this host (client_host) find the
    # rows as files (csnd.service.arrow_rows): "" is <changelog>/arrow-files,
    # None writes none (every reader gets bytes).
    arrow_files_dir: str | None = ""
    # Disk those files may take (the least recently read dropped first); 0:
    # none.  (arrow_rows.FILES_BUDGET_BYTES: that module needs pyarrow.)
    arrow_files_bytes: int = 1 << 30
    # How often the server asks a subscriber for a sign of life.  Smaller:
    # a dead consumer is found sooner, at the cost of a message each way.
    keepalive_s: float = 5.0
    # Silence after which a subscriber is dropped: several keepalives, so a
    # consumer busy with one large batch is not dropped by accident.
    client_timeout_s: float = 30.0
    # How long a new stream may take to say where it starts.
    first_message_timeout_s: float = 10.0
    # Named marks are written (fsync) at most this often while streams run.
    store_interval_s: float = 1.0
    # Status counts a consumer's lag in transactions (Changelog.count_after)
    # up to this many, then says "at least".
    lag_count_cap: int = 10_000


class ChangefeedServicer(pb_grpc.ChangefeedServicer):  # type: ignore[misc]  # generated, untyped
    """The gRPC face of the changefeed: builds its parts and hands each RPC to its own."""

    def __init__(
        self,
        log: Changelog,
        *,
        subscriptions: MarkStore | None = None,
        status: StatusSource | None = None,
        settings: FeedSettings | None = None,
        directory: str = "",
        credentials: Credentials | None = None,
        databases: Mapping[str, str] | None = None,
        snapshots: SnapshotJobsSource | None = None,
    ) -> None:
        self.log = log
        self.settings = s = settings or FeedSettings()
        self.directory = directory or log.directory
        # The tables a filter may name: the changelog's relations, and the sources'
        # publications once the service tells them (`known_tables.published`)
        self.known_tables = KnownTables(log.relations)
        self.stopping = threading.Event()
        # Set when the service ends on a failure its consumers must be told (`end_streams`)
        self.ending = Ending()
        self.consumers = FeedConsumers(
            ConsumerRegistry.from_store(
                subscriptions.all() if subscriptions else {}, subscriptions.tables() if subscriptions else {}
            )
        )
        self.marks = MarkKeeper(self.consumers, subscriptions, s.store_interval_s)
        lag = Lag(log, s.lag_count_cap)
        jobs = snapshots or no_snapshots
        self.streams = SubscribeStreams(
            log,
            self.consumers,
            self.marks,
            s,
            self.known_tables,
            self.stopping,
            credentials=credentials,
            databases=dict(databases or {}),
            ending=self.ending,
        )
        self.fetches = Fetches(log, s, self.known_tables, self.stopping, self.directory, self.ending)
        self.admin = SubscriptionAdmin(log, self.consumers, self.marks, lag, s.max_batch_bytes)
        self.snapshot_starter = SnapshotStarter(jobs)
        # What `csnd serve` adds to Status (nodes, totals, its initial snapshot); None: nothing
        self.status_source = status
        self.snapshot_jobs = jobs
        self.consumer_figures = ConsumerStatuses(self.consumers, lag)
        Watchdog(
            self.consumers,
            self.stopping,
            keepalive_s=s.keepalive_s,
            client_timeout_s=s.client_timeout_s,
            wait_s=WAIT_S,
        ).start()
        if subscriptions is not None:  # (named marks hold the changelog's retention, up to its hold limits)
            log.add_retention_holder(self.marks.retention_holds)

    def Subscribe(  # noqa: N802
        self, request_iterator: Iterator[pb.SubscribeRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.SubscribeResponse | bytes]:
        return self.streams.subscribe(request_iterator, context)

    def Fetch(  # noqa: N802
        self, request: pb.FetchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchResponse | bytes]:
        return self.fetches.fetch(request, context)

    def ListSubscriptions(  # noqa: N802
        self, request: pb.ListSubscriptionsRequest, context: grpc.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        return self.admin.list(request, context)

    def ResetSubscription(  # noqa: N802
        self, request: pb.ResetSubscriptionRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionInfo:
        return self.admin.reset(request, context)

    def DeleteSubscription(  # noqa: N802
        self, request: pb.DeleteSubscriptionRequest, context: grpc.ServicerContext
    ) -> pb.SubscriptionInfo:
        return self.admin.delete(request, context)

    def StartSnapshot(  # noqa: N802
        self, request: pb.StartSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.SnapshotStatus:
        return self.snapshot_starter.start(request, context)

    # --- Status ---------------------------------------------------------------------

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:  # noqa: N802
        return self.feed_status()

    def feed_status(self) -> pb.StatusResponse:
        """Nodes, changelog and consumers now (the gRPC Status answer and /api/status)."""
        return build_status(
            self.log,
            self.directory,
            self.consumer_figures,
            incremental_status(self.snapshot_jobs()),
            self.status_source,
            time.time(),
        )

    def end_streams(self, code: grpc.StatusCode, details: str) -> None:
        """The service ends on a failure: each stream sends what is durable now, then ends with `code`.

        Called before `stop()`; the streams end within `feed_ending.DRAIN_S` (plus WAIT_S)."""
        self.ending.fail(code, details, self.log.durable_csn)
        self.log.wake_waiters()

    def stop(self) -> None:
        """Ends every stream at its next look (within WAIT_S) and stores the named marks."""
        self.stopping.set()
        self.marks.store_marks()
        if self.marks.store is not None:
            self.log.remove_retention_holder(self.marks.retention_holds)
