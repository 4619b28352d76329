"""Rows per second into foreachBatch: the `csnd` source against Spark reading the same rows from Parquet.

    python -m bench.spark_bench [--transactions N] [--rounds R]

One changelog of N synthetic transactions (5 changes each, rows of a few
columns like an OLTP table's) is served by an in-process changefeed; the
same rows, flattened, are written once to Parquet, one file per core (Spark
reads a file with one task; the `csnd` source uses every core).  Each round
runs four streaming queries with Trigger.AvailableNow into the same
foreachBatch (every column materialised by Spark's `noop` writer), rounds
alternating the order; the ratios are best against best in this run:

* the `csnd` source (the goal: at least 0.75 of Parquet);
* the Parquet files (Spark's file source, same schema): the baseline;
* `csnd serve --parquet-dir`'s export of the same changelog (its files cut
  one per core too; the time the export took to write them is reported);
* the ceiling of a PySpark Python data source here, whatever csnd does: the
  same machinery as the `csnd` source (a planner process, CSN-range
  partitions read by Python workers, Arrow batches to the JVM), reading the
  rows from a Parquet file already columnar, each task only its own row
  groups.

Each query is a short one, so Spark's per-query start-up is in every figure.

Latency: a writer appends transactions to the served changelog at a steady
rate (each line's commit_time is the moment it is made, and it is synced
at once, as `csnd serve`'s group commit does), while a streaming query on
the `csnd` source (default trigger: the next micro-batch as soon as the
last is done) notes, for each transaction, the time from its commit_time
to the start of the foreachBatch call that holds it; the first seconds
(Spark's start-up) are left out.  A commit's way into the changelog is
`bench.serve_bench`'s latency row.  Results go to bench-out/spark.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from typing import Any

from bench.common import out_path


def make_line(csn: int, commit_time: str = "2026-11-22T10:00:00.123456+00:00") -> bytes:
    changes = []
    for i in range(5):
        rid = csn * 5 + i
        changes.append(
            {
                "node": f"dn{1 + i % 3}",
                "cid": i,
                "lsn": f"0/{0x16B3600 + rid * 64:X}",
                "op": "update" if i % 2 else "insert",
                "schema": "public",
                "table": "acct",
                "old": None,
                "new": {
                    "id": rid,
                    "owner": f"owner-{rid % 997}",
                    "balance": f"{rid % 10000}.50",
                    "active": True,
                },
            }
        )
    txn = {
        "csn": csn,
        "gid": f"g-{csn}",
        "commit_time": commit_time,
        "nodes": {f"dn{k}": {"xid": 700 + csn, "commit_lsn": f"0/{csn * 4096:X}"} for k in (1, 2, 3)},
        "changes": changes,
    }
    return json.dumps(txn, ensure_ascii=False).encode()


def _ceiling_source() -> Any:
    """A Python data source over a Parquet file of the rows, partitioned and offset as `csnd`'s is."""
    import pyarrow.parquet as pq
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from csnd.consumers.spark.columns import SCHEMA_DDL
    from csnd.consumers.spark.ranges import offset, offset_csn, split_range
    from csnd.consumers.spark.source import CsnRange

    class CeilingReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, path: str, last: int) -> None:
            self.path, self.last = path, last

        def initialOffset(self) -> dict[str, int]:
            return offset(0)

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, int]:
            return offset(self.last)

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[CsnRange]:
            return [CsnRange(lo, hi) for lo, hi in split_range(offset_csn(start), offset_csn(end), 2)]

        def read(self, partition: Any) -> Any:
            table = pq.read_table(
                self.path, filters=[("csn", ">", partition.lo), ("csn", "<=", partition.hi)]
            )
            return iter(table.to_batches(max_chunksize=10_000))

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "csnd_ceiling"

        def schema(self) -> str:
            return SCHEMA_DDL

        def streamReader(self, schema: Any) -> CeilingReader:
            return CeilingReader(self.options["path"], int(self.options["last"]))

    return CeilingSource


def run(transactions: int, rounds: int) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from csnd.changelog import Changelog, SubscriptionStore
    from csnd.consumers.spark.columns import flatten
    from csnd.consumers.spark.session import local_session
    from csnd.service import start_changefeed

    # (the ceiling source is this module's: Spark's Python workers must import it)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    spark = local_session("csnd-bench")  # (before any gRPC in this process: Spark forks its JVM)
    spark.dataSource.register(_ceiling_source())
    work = tempfile.mkdtemp(prefix="csnd-spark-bench-")
    log = Changelog(os.path.join(work, "changelog"))
    records = [(csn, make_line(csn)) for csn in range(1, transactions + 1)]
    for csn, line in records:
        log.append(csn, line)
    log.sync()
    server = start_changefeed(log, subscriptions=SubscriptionStore(os.path.join(work, "changelog")))
    parquet_dir = os.path.join(work, "parquet")
    os.makedirs(parquet_dir)
    batch = flatten(records)
    table = _table(batch)
    rows = batch.num_rows
    # One file per core: Spark reads a file with one task, and the csnd source uses every core.
    cores = os.cpu_count() or 1
    per_file = -(-rows // cores)
    for i in range(cores):
        pq.write_table(table.slice(i * per_file, per_file), os.path.join(parquet_dir, f"rows-{i}.parquet"))
    # (row groups of 10,000 rows, CSN-sorted: each of its tasks reads only its own by their statistics)
    ceiling_path = os.path.join(work, "ceiling.parquet")
    pq.write_table(table, ceiling_path, row_group_size=10_000)
    schema = spark.read.parquet(parquet_dir).schema
    # The same changelog through `csnd serve --parquet-dir`'s export, files cut one per core as well.
    export_dir = os.path.join(work, "export")
    export_s = _export(log, export_dir, per_file)
    export_schema = spark.read.parquet(export_dir).schema

    def timed(kind: str, n: int) -> float:
        if kind == "csnd":
            df = spark.readStream.format("csnd").option("target", server.address).load()
        elif kind == "ceiling":
            df = (
                spark.readStream.format("csnd_ceiling")
                .option("path", ceiling_path)
                .option("last", str(transactions))
                .load()
            )
        elif kind == "export":
            df = spark.readStream.schema(export_schema).parquet(export_dir)
        else:
            df = spark.readStream.schema(schema).parquet(parquet_dir)
        seen = []

        def sink(b: Any, batch_id: int) -> None:
            b.write.format("noop").mode("overwrite").save()
            seen.append(batch_id)

        ck = os.path.join(work, f"ck-{kind}-{n}")
        t0 = time.perf_counter()
        q = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        return time.perf_counter() - t0

    kinds = ("csnd", "ceiling", "export", "parquet")
    for kind in kinds:
        timed(kind, -1)  # (warm-up: Python workers, JIT, imports)
    results: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for kind in order:
            results[kind].append(rows / timed(kind, r))
    server.stop()
    log.close()
    spark.stop()
    best = {k: max(v) for k, v in results.items()}
    return {
        "transactions": transactions,
        "rows": rows,
        "rounds": rounds,
        "csnd_rows_per_s": best["csnd"],
        "parquet_rows_per_s": best["parquet"],
        "ratio": best["csnd"] / best["parquet"],
        "ceiling_rows_per_s": best["ceiling"],
        "ceiling_ratio": best["ceiling"] / best["parquet"],
        "export_rows_per_s": best["export"],
        "export_ratio": best["export"] / best["parquet"],
        "export_write_rows_per_s": rows / export_s,
        "files_per_source": cores,
        "by_round": results,
    }


def latency(seconds: float = 30.0, rate: float = 200.0, warm_up: float = 10.0) -> dict[str, Any]:
    from datetime import UTC, datetime

    from csnd.changelog import Changelog, SubscriptionStore
    from csnd.consumers.spark.session import local_session
    from csnd.service import start_changefeed

    spark = local_session("csnd-bench-latency")  # (before any gRPC in this process)
    work = tempfile.mkdtemp(prefix="csnd-spark-latency-")
    log = Changelog(os.path.join(work, "changelog"))
    server = start_changefeed(log, subscriptions=SubscriptionStore(os.path.join(work, "changelog")))
    stop = threading.Event()
    committed: dict[int, float] = {}

    def write() -> None:
        t0 = time.perf_counter()
        csn = 0
        while not stop.is_set():
            csn += 1
            pause = t0 + csn / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            now = time.time()
            committed[csn] = now  # (before the append: the sink may see it at once)
            log.append(csn, make_line(csn, datetime.fromtimestamp(now, UTC).isoformat()))
            log.sync()

    seen: list[tuple[int, float]] = []  # (csn, seconds from commit to its foreachBatch)

    def sink(b: Any, batch_id: int) -> None:
        now = time.time()
        for row in b.select("csn").distinct().collect():
            seen.append((int(row.csn), now - committed[int(row.csn)]))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    df = spark.readStream.format("csnd").option("target", server.address).load()
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", os.path.join(work, "ck")).start()
    time.sleep(warm_up + seconds)
    stop.set()
    writer.join()
    last = max(committed)
    deadline = time.monotonic() + 120
    while (not seen or max(c for c, _ in seen) < last) and time.monotonic() < deadline:
        time.sleep(0.1)
    q.stop()
    server.stop()
    log.close()
    spark.stop()
    first = min(committed.values()) + warm_up
    lat = sorted(x for csn, x in seen if committed[csn] >= first)
    return {
        "rate": rate,
        "seconds": seconds,
        "transactions": len(lat),
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
        "max_ms": lat[-1] * 1000,
    }


def _export(log: Any, directory: str, file_rows: int) -> float:
    """Runs the Parquet export over the whole changelog; the seconds it took to write it all."""
    from csnd.service.parquet import ParquetExport

    export = ParquetExport(log, directory, file_rows=file_rows, file_wait_s=0.1)
    t0 = time.perf_counter()
    export.start()
    while export.exported_csn < log.durable_csn and export.error is None:
        time.sleep(0.01)
    took = time.perf_counter() - t0
    export.stop()
    if export.error is not None:
        raise export.error
    return took


def _table(batch: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches([batch])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency-only", action="store_true", help="only the commit-to-foreachBatch latency")
    args = p.parse_args()
    r: dict[str, Any] = {} if args.latency_only else run(args.transactions, args.rounds)
    r["latency"] = latency()
    with open(out_path("spark.json"), "w", encoding="utf-8") as f:
        json.dump(r, f, indent=2)
    if "rows" in r:
        print(
            f"spark: {r['rows']:,} rows into foreachBatch: csnd source {r['csnd_rows_per_s']:,.0f} rows/s, "
            f"Parquet {r['parquet_rows_per_s']:,.0f} rows/s, ratio {r['ratio']:.2f} (best of {r['rounds']}); "
            f"the same rows through a Python data source from Parquet: {r['ceiling_rows_per_s']:,.0f} rows/s, "
            f"ratio {r['ceiling_ratio']:.2f}; through csnd's Parquet export: {r['export_rows_per_s']:,.0f} rows/s, "
            f"ratio {r['export_ratio']:.2f} (the export wrote {r['export_write_rows_per_s']:,.0f} rows/s); "
            f"{r['files_per_source']} files per Parquet source"
        )
    lat = r["latency"]
    print(
        f"spark: commit to foreachBatch at {lat['rate']:,.0f} transactions/s for {lat['seconds']:.0f} s: "
        f"p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms, max {lat['max_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
