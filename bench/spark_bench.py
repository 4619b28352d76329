"""Rows per second from the `csnd` Spark source against Spark reading the same rows from Parquet.

    python -m bench.spark_bench [--transactions N] [--rounds R] [--no-latency | --latency-only]

One changelog of N synthetic transactions (5 changes each, rows of a few
columns like an OLTP table's; a million rows by default) is served by an
in-process changefeed; the same rows, flattened, are written once to
Parquet, one file per core (Spark reads a file with one task; the `csnd`
source uses every core).  Seven paths, each round in alternating order, the
ratios best against best in this run:

* `csnd`: the source as it runs by default, the rows built by the service
  (Fetch format "arrow"; the first read of the range, which builds them, is
  timed apart), and, as Spark runs on the service's host here, mapped from
  the files the service left them in (localFiles);
* `csnd-bytes`: the same with localFiles=false: the rows received through
  gRPC, compressed, as an executor on another host receives them;
* `csnd-lines`: the source with rowsBuiltBy=executor (JSON lines parsed on
  the executors);
* `ceiling`: a PySpark Python data source reading the rows from a Parquet
  file in its Python workers (CSN-range partitions, each task only its own
  row groups);
* `mechanism`: a PySpark Python data source whose workers hand Spark the same
  rows as Arrow batches of 10,000 rows, built once and kept in their memory:
  the cost of the Python data source mechanism (Arrow into the JVM and into
  rows) at Spark's default batch size (a source with larger batches, as the
  `csnd` one's 8 MiB messages are, can do better);
* `export`: `csnd serve --parquet-dir`'s export of the same changelog (its
  files cut one per core too; the time it took to write them is reported);
* `parquet`: the Parquet files, read by Spark's file source: the baseline.

Each path is measured three ways: a batch read of every row (`noop`
writer), the same less a read of one transaction (Spark's per-query
start-up taken out: the steady rate), and one streaming query with
Trigger.AvailableNow into foreachBatch (start-up included).  Ratios are
best against best, and (`median`) the median over rounds of each round's
steady ratio: a round reads every path back to back, so its ratio sees one
minute of the machine, where one quiet round sets a best.  After the
rounds, the CPU seconds of each process group (this process, which serves
the changelog; Spark's JVM; Spark's Python processes) per million rows are
read from /proc around two more reads of every row, less two reads of one
transaction: where each path's time goes on two cores.

Latency: a writer appends transactions to the served changelog at a steady
rate (each line's commit_time is the moment it is made, and it is synced
at once, as `csnd serve`'s group commit does), while a streaming query on the
`csnd` source (default trigger: the next micro-batch as soon as the
last is done) notes, for each transaction, the time from its commit_time
to the start of the foreachBatch call that holds it; the first seconds
after the first micro-batch (Spark's start-up, and the backlog it leaves) are left out.  A commit's way into the changelog is
`bench.serve_bench`'s latency row.  Results go to bench-out/spark.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def _ceiling_source(kept: bool = False) -> Any:
    """A Python data source over a Parquet file of the rows, partitioned and offset as `csnd`'s is.

    `kept`: the `mechanism` source, whose workers read each partition once and keep its batches.
    """
    import pyarrow.parquet as pq
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
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
            if kept:
                from bench import spark_bench  # (by reference: the worker's module, and its KEPT)

                return iter(spark_bench.kept_batches(self.path, partition.lo, partition.hi))
            table = pq.read_table(
                self.path, filters=[("csn", ">", partition.lo), ("csn", "<=", partition.hi)]
            )
            return iter(table.to_batches(max_chunksize=10_000))

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class CeilingBatchReader(DataSourceReader):
        def __init__(self, path: str, last: int) -> None:
            self.path, self.last = path, last

        def partitions(self) -> list[CsnRange]:
            return [CsnRange(lo, hi) for lo, hi in split_range(0, self.last, 2)]

        def read(self, partition: Any) -> Any:
            return CeilingReader.read(self, partition)  # type: ignore[arg-type]

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "csnd_mechanism" if kept else "csnd_ceiling"

        def schema(self) -> str:
            return SCHEMA_DDL

        def streamReader(self, schema: Any) -> CeilingReader:
            return CeilingReader(self.options["path"], int(self.options["last"]))

        def reader(self, schema: Any) -> CeilingBatchReader:
            return CeilingBatchReader(self.options["path"], int(self.options["last"]))

    return CeilingSource


# The `mechanism` source's batches in each Python worker process: (path, lo, hi) -> batches.
KEPT: dict[tuple[str, int, int], list[Any]] = {}


def kept_batches(path: str, lo: int, hi: int) -> list[Any]:
    """The partition's batches, read once per worker process and then handed out again."""
    import pyarrow.parquet as pq

    key = (path, lo, hi)
    if key not in KEPT:
        table = pq.read_table(path, filters=[("csn", ">", lo), ("csn", "<=", hi)])
        KEPT[key] = table.to_batches(max_chunksize=10_000)
    return KEPT[key]


# Reads of every row (less as many of one transaction) whose CPU is counted, per path.
CPU_READS = 2

KINDS = ("csnd", "csnd-bytes", "csnd-lines", "ceiling", "mechanism", "export", "parquet")


def run(transactions: int, rounds: int, kinds: tuple[str, ...] = KINDS) -> dict[str, Any]:
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
    spark.dataSource.register(_ceiling_source(kept=True))
    work = tempfile.mkdtemp(prefix="csnd-spark-bench-")
    log = Changelog(os.path.join(work, "changelog"))
    records = [(csn, make_line(csn)) for csn in range(1, transactions + 1)]
    for csn, line in records:
        log.append(csn, line)
    log.sync()
    server = start_changefeed(log, subscriptions=SubscriptionStore(os.path.join(work, "changelog")))
    batch = flatten(records)
    del records
    table = _table(batch)
    rows = batch.num_rows
    # One file per core: Spark reads a file with one task, and the csnd source uses every core.
    cores = os.cpu_count() or 1
    per_file = -(-rows // cores)
    parquet_dir = os.path.join(work, "parquet")
    os.makedirs(parquet_dir)
    for i in range(cores):
        pq.write_table(table.slice(i * per_file, per_file), os.path.join(parquet_dir, f"rows-{i}.parquet"))
    # One transaction's rows: what a query costs before its first row (Spark's start-up).
    tiny_dir = os.path.join(work, "tiny")
    os.makedirs(tiny_dir)
    pq.write_table(table.slice(0, 5), os.path.join(tiny_dir, "rows-0.parquet"))
    # (row groups of 10,000 rows, CSN-sorted: each of its tasks reads only its own by their statistics)
    ceiling_path = os.path.join(work, "ceiling.parquet")
    pq.write_table(table, ceiling_path, row_group_size=10_000)
    schema = spark.read.parquet(parquet_dir).schema
    # The same changelog through `csnd serve --parquet-dir`'s export, files cut one per core as well.
    export_dir = os.path.join(work, "export")
    export_s = _export(log, export_dir, per_file)
    del table, batch

    def frame(kind: str, last: int, stream: bool) -> Any:
        reader = spark.readStream if stream else spark.read
        if kind in ("csnd", "csnd-bytes", "csnd-lines"):
            df = reader.format("csnd").option("target", server.address)
            if kind == "csnd-lines":
                df = df.option("rowsBuiltBy", "executor")
            if kind == "csnd-bytes":
                df = df.option("localFiles", "false")
            if not stream:
                df = df.option("endingCsn", str(last))
            return df.load()
        if kind in ("ceiling", "mechanism"):
            return reader.format(f"csnd_{kind}").option("path", ceiling_path).option("last", str(last)).load()
        directory = {"export": export_dir, "parquet": parquet_dir}[kind] if last == transactions else tiny_dir
        return reader.schema(schema).parquet(directory)

    def streamed(kind: str, n: int) -> float:
        """Seconds of one Trigger.AvailableNow query over every row, into foreachBatch."""

        def sink(b: Any, batch_id: int) -> None:
            b.write.format("noop").mode("overwrite").save()

        t0 = time.perf_counter()
        q = (
            frame(kind, transactions, stream=True)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", os.path.join(work, f"ck-{kind}-{n}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        return time.perf_counter() - t0

    def batch_read(kind: str, last: int) -> float:
        """Seconds of one batch read of (0, last], every column materialised."""
        t0 = time.perf_counter()
        frame(kind, last, stream=False).write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t0

    t0 = time.perf_counter()
    batch_read("csnd", transactions)  # (the service builds the rows: its first read of the range)
    build_s = time.perf_counter() - t0
    for kind in kinds:
        streamed(kind, -1)  # (warm-up: Python workers, JIT, imports)
        batch_read(kind, 1)
    by_round: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for r in range(rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for kind in order:
            whole, start = batch_read(kind, transactions), batch_read(kind, 1)
            by_round[kind].append(
                {
                    "stream_rows_per_s": rows / streamed(kind, r),
                    "batch_rows_per_s": rows / whole,
                    "start_s": start,
                    # Start-up excluded: the rows over what the read took beyond a one-transaction read.
                    "steady_rows_per_s": rows / max(1e-9, whole - start),
                }
            )
    # CPU of each process group per million rows beyond a read of one transaction:
    # where a path's time goes, which a ratio of rates on a shared machine cannot show.
    cpu: dict[str, dict[str, float]] = {}
    for kind in kinds:
        spent = dict.fromkeys(("service", "jvm", "python"), 0.0)
        for last, sign in ((transactions, 1), (1, -1)) * CPU_READS:
            before = process_cpu()
            batch_read(kind, last)
            after = process_cpu()
            for group in spent:
                spent[group] += sign * (after[group] - before[group])
        cpu[kind] = {group: max(0.0, s) * 1e6 / (rows * CPU_READS) for group, s in spent.items()}
    server.stop()
    log.close()
    spark.stop()
    best = {k: {f: max(x[f] for x in v) for f in v[0]} for k, v in by_round.items()}
    for k, v in by_round.items():
        best[k]["start_s"] = min(x["start_s"] for x in v)
    base = best["parquet"]
    # Each round reads every path back to back (in alternating order), so a path's
    # ratio to Parquet within a round sees the same minute of the machine; their
    # median is steadier than best against best, which one quiet round of either sets.
    paired = {
        k: statistics.median(
            x["steady_rows_per_s"] / p["steady_rows_per_s"]
            for x, p in zip(v, by_round["parquet"], strict=True)
        )
        for k, v in by_round.items()
    }
    return {
        "transactions": transactions,
        "rows": rows,
        "rounds": rounds,
        "files_per_source": cores,
        "paths": {
            k: {
                **v,
                "steady_ratio": v["steady_rows_per_s"] / base["steady_rows_per_s"],
                "steady_ratio_median": paired[k],
                "batch_ratio": v["batch_rows_per_s"] / base["batch_rows_per_s"],
                "stream_ratio": v["stream_rows_per_s"] / base["stream_rows_per_s"],
                "cpu_s_per_million_rows": cpu[k],
            }
            for k, v in best.items()
        },
        "service_build_rows_per_s": rows / build_s,
        "export_write_rows_per_s": rows / export_s,
        "by_round": by_round,
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
    deadline = time.monotonic() + 300
    while not seen and time.monotonic() < deadline:  # (Spark's start-up: 5-15 s here)
        time.sleep(0.05)
    if not seen:
        raise RuntimeError("spark bench: the streaming query delivered nothing in 300 s")
    first = time.time() + warm_up  # (the backlog of the start-up drained, the JIT warm)
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
    lat = sorted(x for csn, x in seen if committed[csn] >= first)
    return {
        "rate": rate,
        "seconds": seconds,
        "transactions": len(lat),
        "p50_ms": lat[len(lat) // 2] * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
        "max_ms": lat[-1] * 1000,
    }


def process_cpu() -> dict[str, float]:
    """CPU seconds so far of this process (it serves the changelog), Spark's JVM, and its Python processes.

    The Python processes are every one under the JVM (the worker daemon, its
    workers, a streaming query's planner), living or exited and reaped.
    """
    from bench.loadkit import cpu_seconds, descendants, reaped_cpu_seconds

    out = {"service": cpu_seconds(os.getpid()) or 0.0, "jvm": 0.0, "python": 0.0}
    for pid in descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/comm") as f:
                is_jvm = f.read().strip() == "java"
        except OSError:
            continue
        if is_jvm:
            out["jvm"] += cpu_seconds(pid) or 0.0
            out["python"] += reaped_cpu_seconds(pid)
        else:
            out["python"] += (cpu_seconds(pid) or 0.0) + reaped_cpu_seconds(pid)
    return out


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
    p.add_argument("--transactions", type=int, default=200_000, help="5 rows each (default: a million rows)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--latency-only", action="store_true", help="only the commit-to-foreachBatch latency")
    p.add_argument("--no-latency", action="store_true", help="only the throughput")
    p.add_argument(
        "--paths",
        default=",".join(KINDS),
        help=f"comma-separated paths to measure (default: all: {','.join(KINDS)}; parquet is always in)",
    )
    args = p.parse_args()
    kinds = tuple(k for k in KINDS if k in args.paths.split(",") or k == "parquet")
    r: dict[str, Any] = {} if args.latency_only else run(args.transactions, args.rounds, kinds)
    if not args.no_latency:
        r["latency"] = latency()
    with open(out_path("spark.json"), "w", encoding="utf-8") as f:
        json.dump(r, f, indent=2)
    if "rows" in r:
        print(
            f"spark: {r['rows']:,} rows, best of {r['rounds']} rounds, {r['files_per_source']} files per Parquet source"
        )
        print(
            f"  {'path':<12} {'steady rows/s':>14} {'ratio':>6} {'median':>6} {'batch rows/s':>13} {'ratio':>6} "
            f"{'stream rows/s':>14} {'ratio':>6} {'start-up s':>10}"
        )
        for kind, v in r["paths"].items():
            print(
                f"  {kind:<12} {v['steady_rows_per_s']:>14,.0f} {v['steady_ratio']:>6.2f} {v['steady_ratio_median']:>6.2f} "
                f"{v['batch_rows_per_s']:>13,.0f} {v['batch_ratio']:>6.2f} "
                f"{v['stream_rows_per_s']:>14,.0f} {v['stream_ratio']:>6.2f} {v['start_s']:>10.2f}"
            )
        print("  CPU s per million rows beyond a one-transaction read (service / JVM / Python workers):")
        for kind, v in r["paths"].items():
            c = v["cpu_s_per_million_rows"]
            print(
                f"  {kind:<12} {c['service']:>6.2f} {c['jvm']:>6.2f} {c['python']:>6.2f}  all {sum(c.values()):.2f}"
            )
        print(
            f"  the service built the rows (its first read) at {r['service_build_rows_per_s']:,.0f} rows/s; "
            f"the export wrote them at {r['export_write_rows_per_s']:,.0f} rows/s"
        )
    lat = r.get("latency")
    if lat is None:
        return
    print(
        f"spark: commit to foreachBatch at {lat['rate']:,.0f} transactions/s for {lat['seconds']:.0f} s: "
        f"p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms, max {lat['max_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
