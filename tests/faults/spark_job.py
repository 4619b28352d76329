"""The Spark driver of the spark-kill fault class: the live stream and the Parquet export into exactly-once sinks.

    python -m tests.faults.spark_job --go FILE --checkpoint DIR --sink DIR --export DIR
        [--pause QUERY:BATCH:before|after]

It builds its SparkSession (`local_session`: local[2], the tests' settings)
and runs one small job, so the JVM is warm, then waits for FILE to appear:
it holds the service's HOST:PORT.  The suite starts the restarted driver
this way beside the one it will kill, so a restart costs a query's start,
not a JVM's.  Two Structured Streaming queries then run, each with its
checkpoint under --checkpoint:

- `source`: the `csnd` source (every table, maxTransactionsPerTrigger
  SOURCE_BATCH), the stream as the service serves it;
- `export`: Spark's file-stream source over `csnd serve --parquet-dir`'s
  files (maxFilesPerTrigger 1), as the Spark example reads them.

Each micro-batch's rows go, in foreachBatch, to `SINK/QUERY/batch-N.jsonl`
(one JSON object a row, in the order collect() returns them: the source
promises (csn, seq) order within a batch) written whole (temporary file,
fsync, rename); a batch id the sink already holds is Spark's re-run of a
batch it had not committed when its driver died, and is written beside it
as `batch-N.rerun.jsonl` for the check to compare, not applied again.
`SINK/QUERY/_progress.json` then names the highest csn held.

--pause stops the driver inside one micro-batch of one query, before or
after its sink took it (writing `SINK/QUERY/paused`), to be killed there:
the moments where a restart must re-run the batch exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

from csnd.core.durable import replace_file

# Transactions per micro-batch of the csnd source (the writers commit about 120 a second).
SOURCE_BATCH: Final = 500
# The columns the sinks keep: what the check rebuilds each transaction from.
COLUMNS: Final = (
    "csn",
    "gid",
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
)
QUERIES: Final = ("source", "export")


def _batch_rows(df: Any) -> list[dict[str, Any]]:
    return [
        {c: (list(v) if c == "unchanged" else v) for c, v in zip(COLUMNS, r, strict=True)}
        for r in df.collect()
    ]


def write_batch(directory: str, batch_id: int, rows: list[dict[str, Any]], pause: str | None) -> None:
    """One micro-batch into the sink, once; a re-run of a batch it holds goes beside it for the check."""
    os.makedirs(directory, exist_ok=True)
    if pause == "before":
        _hold(directory)
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path = os.path.join(directory, f"batch-{batch_id:08d}.jsonl")
    if os.path.exists(path):
        replace_file(os.path.join(directory, f"batch-{batch_id:08d}.rerun.jsonl"), data)
    else:
        replace_file(path, data)
        top = max((r["csn"] for r in rows), default=0)
        progress = os.path.join(directory, "_progress.json")
        try:
            with open(progress) as f:
                top = max(top, int(json.load(f)["csn"]))
        except FileNotFoundError:
            pass
        replace_file(progress, json.dumps({"batch_id": batch_id, "csn": top}).encode())
    if pause == "after":
        _hold(directory)


def _hold(directory: str) -> None:
    """Until the kill: the driver stays inside this micro-batch."""
    replace_file(os.path.join(directory, "paused"), b"")
    threading.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="spark_job")
    p.add_argument("--go", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--sink", required=True)
    p.add_argument("--export", required=True)
    p.add_argument("--local-dir", required=True, help="Spark's scratch directory")
    p.add_argument("--pause", help="QUERY:BATCH:before|after")
    args = p.parse_args(argv)
    pause: tuple[str, int, str] | None = None
    if args.pause:
        query, batch, where = args.pause.split(":")
        pause = (query, int(batch), where)

    from csnd.consumers.examples.current_state import export_stream
    from csnd.consumers.spark.session import local_session

    spark = local_session("csnd-fault-spark", **{"spark.local.dir": args.local_dir})
    spark.range(4).collect()  # (the JVM's first job: class loading before the clock runs)
    print("spark_job: warm", file=sys.stderr, flush=True)
    while not os.path.exists(args.go):  # (a file the suite writes whole, by rename)
        time.sleep(0.05)
    with open(args.go) as f:
        target = f.read().strip()

    def sink(query: str) -> Any:
        directory = os.path.join(args.sink, query)

        def each_batch(df: Any, batch_id: int) -> None:
            rows = _batch_rows(df.select(*COLUMNS))
            held = pause[2] if pause is not None and pause[:2] == (query, batch_id) else None
            write_batch(directory, batch_id, rows, held)
            print(f"spark_job: {query} batch {batch_id}: {len(rows)} rows", file=sys.stderr, flush=True)

        return each_batch

    source = (
        spark.readStream.format("csnd")
        .option("target", target)
        .option("name", "fx-spark")
        .option("maxTransactionsPerTrigger", str(SOURCE_BATCH))
        .load()
    )
    queries = []
    for name, df in (("source", source), ("export", export_stream(spark, args.export, 1))):
        writer = df.writeStream.foreachBatch(sink(name)).queryName(name)
        queries.append(writer.option("checkpointLocation", os.path.join(args.checkpoint, name)).start())
    print("spark_job: started", file=sys.stderr, flush=True)
    spark.streams.awaitAnyTermination()
    for q in queries:
        if q.exception() is not None:
            print(f"spark_job: query {q.name} failed: {q.exception()}", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
