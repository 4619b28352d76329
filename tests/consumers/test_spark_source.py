"""The csnd Spark source against a real changefeed server and a real local Spark.

One served changelog (a generated 3-node cluster's lines) for the module,
one SparkSession for the test session: Spark starts slowly on this machine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from csnd.changelog import Changelog, SubscriptionStore
from csnd.consumers.spark.columns import ARROW_SCHEMA
from csnd.service import RunningServer, start_changefeed
from tests.consumers.test_spark_rows import brute

# One Spark session (a JVM) per test worker: keep its tests on one worker.
pytestmark = pytest.mark.xdist_group("spark")

COLS = [
    "csn",
    "gid",
    "commit_time",
    "seq",
    "node",
    "xid",
    "cid",
    "lsn",
    "op",
    "schema",
    "table",
    "old",
    "new",
    "unchanged",
    "key",
    "snapshot",
]


class Served:
    def __init__(self, log: Changelog, server: RunningServer, lines: list[tuple[int, bytes]]) -> None:
        self.log, self.server, self.lines = log, server, lines

    @property
    def target(self) -> str:
        return self.server.address

    def append(self, records: list[tuple[int, bytes]]) -> None:
        for csn, line in records:
            self.log.append(csn, line)
        self.log.sync()
        self.lines.extend(records)


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, cluster_lines: list[tuple[int, bytes]], spark: Any
) -> Iterator[Served]:
    d = str(tmp_path_factory.mktemp("changelog"))
    log = Changelog(d)
    first = cluster_lines[: len(cluster_lines) * 3 // 4]  # (the rest arrives while a query runs)
    for csn, line in first:
        log.append(csn, line)
    log.sync()
    server = start_changefeed(log, subscriptions=SubscriptionStore(d))
    yield Served(log, server, list(first))
    server.stop()
    log.close()


def rows_of(df: Any) -> list[dict[str, Any]]:
    out = []
    for r in df.orderBy("csn", "seq").collect():
        d = r.asDict(recursive=True)  # (the snapshot column's struct as a dict, as brute gives it)
        d["commit_time"] = d["commit_time"].isoformat()
        out.append(d)
    return out


def expected_rows(lines: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
    rows = brute(lines)
    for r in rows:  # (Spark shows timestamps in the session's zone, UTC, without the offset)
        r["commit_time"] = r["commit_time"].removesuffix("+00:00")
    return rows


@pytest.mark.timeout(900)  # (includes the session's Spark start-up)
def test_batch_read_equals_the_lines_flattened(spark: Any, served: Served) -> None:
    df = spark.read.format("csnd").option("target", served.target).load()
    assert df.columns == COLS
    # (Spark reads the NOT NULL columns without a null check; a stream's are the same)
    nullable = [f.nullable for f in ARROW_SCHEMA]
    assert (
        [f.nullable for f in df.schema]
        == nullable
        == [f.name in {"gid", "old", "new", "key", "snapshot"} for f in df.schema]
    )
    assert [
        f.nullable for f in spark.readStream.format("csnd").option("target", served.target).load().schema
    ] == nullable
    assert rows_of(df) == expected_rows(served.lines)
    # A middle range and a table filter, in parallel partitions.
    lo, hi = served.lines[20][0], served.lines[60][0]
    part = (
        spark.read.format("csnd")
        .option("target", served.target)
        .option("startingCsn", str(lo))
        .option("endingCsn", str(hi))
        .option("tables", "public.acct")
        .option("numPartitions", "3")
        .load()
    )
    assert part.rdd.getNumPartitions() == 3
    want = [r for r in expected_rows([x for x in served.lines if lo < x[0] <= hi]) if r["table"] == "acct"]
    got = rows_of(part)
    for r in want + got:
        r.pop("seq")  # (with a filter, seq counts the kept changes)
    assert got == want


@pytest.mark.timeout(1200)
def test_stream_in_whole_transactions_resumes_from_its_checkpoint(
    spark: Any, served: Served, tmp_path: Any, cluster_lines: list[tuple[int, bytes]]
) -> None:
    checkpoint = str(tmp_path / "ck")
    batches: dict[int, list[dict[str, Any]]] = {}
    two = threading.Event()

    def keep(df: Any, batch_id: int) -> None:
        batches[batch_id] = [r.asDict() for r in df.select("csn", "seq").collect()]  # (a rerun replaces)
        if len(batches) >= 2:
            two.set()

    def start(trigger: dict[str, Any]) -> Any:
        return (
            spark.readStream.format("csnd")
            .option("target", served.target)
            .option("maxTransactionsPerTrigger", "40")
            .option("name", "spark-test")
            .load()
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )

    q = start({"processingTime": "0 seconds"})
    assert two.wait(300), "two micro-batches within 300 s"
    q.stop()
    # More transactions arrive; the query restarts from its checkpoint and reads to the end.
    served.append(cluster_lines[len(served.lines) :])
    q = start({"availableNow": True})
    q.awaitTermination(600)
    assert q.exception() is None

    changes = {csn: len(json.loads(line)["changes"]) for csn, line in served.lines}
    seen: list[tuple[int, int]] = []
    for batch_id in sorted(batches):
        rows = batches[batch_id]
        per_txn: dict[int, int] = {}
        for r in rows:
            per_txn[r["csn"]] = per_txn.get(r["csn"], 0) + 1
        # Whole transactions only, at most 40 of them (one may be far larger than 40 rows).
        assert per_txn == {c: changes[c] for c in per_txn}, f"batch {batch_id} holds part of a transaction"
        assert len(per_txn) <= 40
        seen.extend(sorted((r["csn"], r["seq"]) for r in rows))
    assert seen == [(c, s) for c, _ in served.lines for s in range(changes[c])], (
        "every change exactly once, in order"
    )
    assert max(changes.values()) > 40 * 2  # (the cluster has transactions far larger than a trigger's count)
    # commit() acknowledged under the name: the service lists the query like any subscriber.
    status = {c.name: c for c in served.server.servicer.feed_status().consumers}
    assert status["spark-test"].acknowledged_csn >= served.lines[0][0]


@pytest.mark.timeout(900)
def test_bad_options_and_unreachable_target_are_one_clear_error(spark: Any, served: Served) -> None:
    with pytest.raises(
        Exception,
        match=r"(?i)unknown option 'maxTransactionPerTrigger'; the known options are: target, startingCsn",
    ):
        spark.readStream.format("csnd").option("target", served.target).option(
            "maxTransactionPerTrigger", "5"
        ).load()
    with pytest.raises(Exception, match=r"startingCsn='soon' is not a whole number"):
        spark.read.format("csnd").option("target", served.target).option(
            "startingCsn", "soon"
        ).load().collect()
    with pytest.raises(Exception, match=r"nothing answers at target 127.0.0.1:9 within 1 s"):
        spark.read.format("csnd").option("target", "127.0.0.1:9").option(
            "connectTimeout", "1"
        ).load().collect()
    q = (
        spark.readStream.format("csnd")
        .option("target", "127.0.0.1:9")
        .option("connectTimeout", "1")
        .load()
        .writeStream.format("noop")
        .start()
    )
    with pytest.raises(
        Exception, match=r"nothing answers at target 127.0.0.1:9 within 1 s; check the address"
    ):
        q.awaitTermination(300)
