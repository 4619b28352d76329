"""`CsndDataSource`: the changefeed as a PySpark 4 Python data source named `csnd`.

    spark.dataSource.register(CsndDataSource)
    spark.readStream.format("csnd").option("target", "HOST:PORT").load()       # a stream
    spark.read.format("csnd").option("target", ...).option("endingCsn", N).load()  # a range

    driver (planner worker)                       executors (Python workers)
    ───────────────────────                       ──────────────────────────
    initialOffset   Status: oldest retained       read(CsnRange(lo, hi))
    latestOffset    Status (+ Fetch: count N)       Fetch (lo, hi] from the service
    partitions      CsnRange(lo, hi) ... ────────►  flatten lines ─► Arrow RecordBatches
    commit(end)     ack `end` under the subscription name

The driver only plans CSN ranges; rows go straight from the service to the
executors and reach Spark as Arrow record batches.  A micro-batch is the
half-open range (previous end, end] of whole transactions (see ranges.py).
Options are checked when the query starts (options.py): an unknown or
malformed one fails the query with one line naming it.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from csnd.consumers.spark import feed
from csnd.consumers.spark.columns import SCHEMA_DDL, RowBuilder
from csnd.consumers.spark.options import SourceOptions, parse_options
from csnd.consumers.spark.ranges import end_after, offset, offset_csn, split_range
from csnd.core.errors import ChangefeedError, ConfigError

log = logging.getLogger("csnd.consumers.spark")

# Rows per Arrow batch handed to Spark (cut between transactions, so a batch
# may be larger by one transaction).  Larger: fewer hand-offs to the JVM;
# smaller: less memory per task.  Spark's own default is 10,000 rows.
BATCH_ROWS: Final = 10_000
# CSNs of a counted range kept for cutting partitions (the reader is shipped
# to every task, so a limit of a million keeps a thinned sample).
MAX_CUT_SAMPLES: Final = 4096


@dataclass(frozen=True)
class CsnRange(InputPartition):
    """One task's share: the transactions with lo < csn <= hi."""

    lo: int
    hi: int


def read_partition(opts: SourceOptions, part: CsnRange) -> Iterator[pa.RecordBatch]:
    """The rows of (part.lo, part.hi] as Arrow record batches (runs on an executor).

    By default the service sends the rows ready-made (it builds a range's
    rows once, for every reader of it) and they go to Spark untouched; with
    rowsBuiltBy=executor, or from a service that predates that, the rows
    are built here from the transactions' lines.
    """
    if opts.rows_built_by == "executor":
        return _rows_of_lines(opts, feed.read_range(opts, part.lo, part.hi))
    return _rows(opts, feed.read_rows(opts, part.lo, part.hi))


def _rows(
    opts: SourceOptions, items: Iterator[pa.RecordBatch | tuple[int, bytes]]
) -> Iterator[pa.RecordBatch]:
    first = next(items, None)
    if isinstance(first, pa.RecordBatch):
        yield first
        yield from items  # (a service sends rows throughout, or lines throughout)
    elif first is not None:  # (a service that predates Arrow fetches)
        yield from _rows_of_lines(opts, itertools.chain([first], items))


def _rows_of_lines(opts: SourceOptions, lines: Iterator[tuple[int, bytes]]) -> Iterator[pa.RecordBatch]:
    builder = RowBuilder()
    try:
        for csn, line in lines:
            builder.add(csn, line)
            if builder.rows >= BATCH_ROWS:
                yield builder.take()
        if builder.rows:
            yield builder.take()
    except ValueError as e:  # (add and take name the csn)
        raise ChangefeedError(
            f"csnd source: {opts.target} sent a line that is not a transaction: {e}"
        ) from None


def default_name(opts: SourceOptions) -> str:
    """A subscription name that stays the same across restarts of the same query."""
    key = f"{opts.target}|{','.join(opts.tables)}|{opts.starting_csn}"
    return "spark-" + hashlib.sha1(key.encode(), usedforsecurity=False).hexdigest()[:12]


class CsndDataSource(DataSource):
    """The `csnd` format: one row per change of the changefeed (schema: SCHEMA_DDL)."""

    @classmethod
    def name(cls) -> str:
        return "csnd"

    def schema(self) -> str:
        parse_options(self.options, stream=None)  # (the earliest hook: a bad option fails load())
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return CsndBatchReader(parse_options(self.options, stream=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return CsndStreamReader(parse_options(self.options, stream=True))


class CsndBatchReader(DataSourceReader):
    """A bounded read of (startingCsn, endingCsn] (endingCsn: the newest durable csn at planning)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        oldest, newest = feed.newest(opts)
        end = newest if opts.ending_csn is None else opts.ending_csn
        return [
            CsnRange(lo, hi) for lo, hi in split_range(opts.starting_csn, end, opts.partitions, floor=oldest)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, CsnRange)
        return read_partition(self.opts, partition)


class CsndStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of whole transactions; offsets are `{"csn": N}`."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.subscription = opts.name or default_name(opts)
        # (start, end, csns seen in it) of the last range counted, for cutting partitions.
        self._counted: tuple[int, int, list[int]] | None = None
        self._stop_at: int | None = None  # Trigger.AvailableNow: the newest csn when it began

    def initialOffset(self) -> dict[str, int]:
        if self.opts.starting_csn:
            return offset(self.opts.starting_csn)
        oldest, _ = feed.newest(self.opts)
        # Just before the oldest retained, so ranges are cut over real csns
        # (and a later restart never means "the oldest retained *then*").
        return offset(max(0, oldest - 1))

    def getDefaultReadLimit(self) -> ReadLimit:
        # Spark's built-in limits count rows; ours counts transactions (a
        # transaction is never split), carried in ReadMaxRows.max_rows.
        if self.opts.max_transactions is not None:
            return ReadMaxRows(self.opts.max_transactions)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        self._stop_at = feed.newest(self.opts)[1]

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        s = _start(start)
        _, newest = feed.newest(self.opts)
        if s > newest:
            raise ConfigError(
                f"csnd source: the checkpoint is at csn {s} but the newest durable csn at {self.opts.target} "
                f"is {newest}: this is not the changelog the query read before; start with a new checkpoint"
            )
        if self._stop_at is not None:
            newest = min(newest, max(s, self._stop_at))
        if isinstance(limit, ReadMaxRows) and newest > s:
            csns = feed.csns_after(self.opts, s, newest, limit.max_rows)
            end = end_after(s, csns, limit.max_rows, newest)
            step = max(1, len(csns) // MAX_CUT_SAMPLES)
            self._counted = (s, end, csns[step - 1 :: step])
            return offset(end)
        return offset(max(s, newest))

    def reportLatestOffset(self) -> dict[str, int]:
        return offset(feed.newest(self.opts)[1])

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        s, e = _start(start), _start(end)
        if e <= s:
            return []
        seen: list[int] = []
        floor = 0
        counted = self._counted
        if counted is not None and counted[0] == s and counted[1] == e:
            seen = counted[2]
        elif s == 0:
            floor = feed.newest(self.opts)[0]
        return [CsnRange(lo, hi) for lo, hi in split_range(s, e, self.opts.partitions, seen, floor)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, CsnRange)
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        csn = _start(end)
        if csn == 0:
            return
        try:
            feed.acknowledge(self.opts, self.subscription, csn)
        except ChangefeedError as e:
            # The checkpoint, not this mark, is what the query resumes from:
            # a service that is briefly away must not fail the query here.
            log.warning(
                "%s (Status shows subscription %s behind until the next commit)", e, self.subscription
            )


def _start(value: dict[str, Any]) -> int:
    try:
        return offset_csn(value)
    except ValueError as e:
        raise ConfigError(f"csnd source: {e}") from None
