"""What each part of the changefeed needs of what it serves, as Protocols.

The changefeed's parts (csnd.service.changefeed: streams, fetches, the
subscription administration, status, incremental snapshots) each take the
changelog, the subscription store and the snapshot jobs as one of these
Protocols at construction.  A part's Protocol lists exactly what it reads,
so a reader of the part sees what it may touch, and the changelog
(csnd.changelog.Changelog, which satisfies them all) is never asked for a
capability by name at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from csnd.service.status import ChangelogFigures

if TYPE_CHECKING:
    from csnd.changelog import RecordPieces, RelationStore
    from csnd.snapshot.progress import TableProgress

# A changelog record as a stream reads it: whole, or one too large for a message, unread.
StoredRecord = tuple[int, "bytes | RecordPieces"]


class RecordReader(Protocol):
    """The changelog as a reader of records (Subscribe, Fetch, a reset's check of its start)."""

    @property
    def oldest_after_csn(self) -> int: ...

    @property
    def visible_csn(self) -> int: ...

    def read_pieced(
        self,
        after_csn: int,
        until_csn: int | None = None,
        whole_up_to: int | None = None,
        *,
        strict: bool = False,
    ) -> Iterator[StoredRecord]: ...


class StreamLog(RecordReader, Protocol):
    """The changelog as Subscribe's streams read it: records, their relation versions, the wait for more."""

    @property
    def oldest_csn(self) -> int: ...

    @property
    def relations(self) -> RelationStore: ...

    def wait_durable(
        self, after_csn: int, timeout: float, interrupted: Callable[[], bool] | None = None
    ) -> bool: ...

    def wake_waiters(self) -> None: ...


class LagCounter(Protocol):
    """How far behind a consumer's mark is, in durable transactions (Status, ListSubscriptions)."""

    def count_after(self, csn: int, cap: int) -> tuple[int, bool]: ...


class AdminLog(RecordReader, LagCounter, Protocol):
    """The changelog as the subscription administration reads it: where a reset may go."""

    @property
    def durable_csn(self) -> int: ...


class StatusLog(LagCounter, ChangelogFigures, Protocol):
    """The changelog's figures that Status shows (the status builder's), and its lag counts."""


class RetentionHolders(Protocol):
    """The changelog's retention, which named marks hold back (Changelog.apply_retention)."""

    def add_retention_holder(self, holds: Callable[[], Mapping[str, int]]) -> None: ...

    def remove_retention_holder(self, holds: Callable[[], Mapping[str, int]]) -> None: ...


class MarkStore(Protocol):
    """Where named subscriptions' marks and filters are kept durably (csnd.changelog.SubscriptionStore)."""

    def all(self) -> dict[str, int]: ...

    def tables(self) -> dict[str, tuple[str, ...]]: ...

    def set(self, name: str, csn: int, tables: Sequence[str] | None = None) -> None: ...

    def delete(self, name: str) -> bool: ...


class SnapshotJob(Protocol):
    """One incremental snapshot job as Status shows it."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def error(self) -> str: ...


class SnapshotTables(Protocol):
    """The progress of the latest job's tables."""

    def tables(self) -> list[TableProgress]: ...


class SnapshotJobs(Protocol):
    """The service's incremental snapshots (csnd.snapshot.incremental.IncrementalSnapshots).

    `submit` raises ValueError for what the caller asked wrong, SnapshotError
    when a node cannot be read; behind a running job the new one is queued.
    """

    @property
    def progress(self) -> SnapshotTables: ...

    def submit(self, specs: list[str], node: str | None = None, chunk_rows: int = 0) -> SnapshotJob: ...

    def latest(self) -> SnapshotJob | None: ...

    def queued(self) -> list[str]: ...

    def ended(self) -> dict[str, str]: ...


# The service's incremental snapshots once it has them (it makes them after the
# changefeed serves, when its slots are ready): None until then, or when it reads
# no live source itself.
SnapshotJobsSource = Callable[[], "SnapshotJobs | None"]
