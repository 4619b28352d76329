"""Exactly-once current-state copy of one source table, from the changefeed through Spark.

    python -m csnd.consumers.examples.current_state --target HOST:PORT \\
        --table public.acct --checkpoint DIR [--key COLUMN,...] \\
        [--parquet DIR] [--postgres DSN] [--max-transactions N] [--available-now]
    python -m csnd.consumers.examples.current_state --export DIR ... [--max-files N]

A Structured Streaming query reads the `csnd` source (only the table's
changes: option `tables`) -- or, with --export, the files `csnd serve
--parquet-dir` writes, with Spark's own file-stream source -- and, in
foreachBatch, applies each micro-batch's
changes in (csn, seq) order -- an initial snapshot's reads, inserts and
updates upsert the row by its key, deletes remove it, a truncate empties the
copy; an update's `unchanged` (TOAST) columns keep their previous values --
to one or both sinks.  The
key is each change's own `key` column (the replica identity's columns the
stream names, docs/design.md section 7), so a change of key columns by DDL
is followed; `--key` overrides it, for a table whose stream names none
(REPLICA IDENTITY NOTHING, or a changelog written before changes had keys)
or whose primary key is narrower than what it names (FULL: every column).
The sinks:

- Parquet (DIR): `state-<batch>.parquet` (columns `key`, `row`: the key
  values and the row as JSON text) and `_progress.json` naming the last
  batch applied and its snapshot, both replaced atomically (temp file,
  fsync, rename, directory fsync).
- PostgreSQL (DSN): table `<schema>_<table>_copy(key jsonb primary key, row
  jsonb)`, with the batch id stored in `csnd_sink_progress` in the same
  transaction as the changes, and every change applied recorded once in
  `csnd_sink_applied(csn, seq)` (a duplicate would violate its key).

Exactly once: Spark re-runs a micro-batch it had not committed when it died
with the same batch id and the same CSN range (offsets are CSNs, and the
range is in the checkpoint before the batch runs; from the export, the same
files, which appear whole, never change, and are taken in CSN order).  Each sink records the
batch id with the data, atomically, and skips a batch id it already holds,
so a kill -9 at any moment followed by a restart from the checkpoint leaves
every change applied exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from csnd.core.durable import sync_directory

# An initial snapshot's rows ("read", docs/design.md section 5) put a row as an insert does.
_UPSERTS = ("insert", "read")

# op, old, new, unchanged, key columns
Change = tuple[str, dict[str, Any] | None, dict[str, Any] | None, list[str], Sequence[str]]


def row_key(row: dict[str, Any], key: Sequence[str]) -> str:
    """The key values of a row as JSON text (the copy's key column)."""
    return json.dumps([row.get(k) for k in key], ensure_ascii=False)


def apply_changes(state: dict[str, dict[str, Any]], changes: Iterable[Change]) -> None:
    """Applies changes (in CSN, seq order), each by its key columns, to `state` (key text -> row), in place."""
    for op, old, new, unchanged, key in changes:
        if op == "truncate":
            state.clear()
        elif op in _UPSERTS and new is not None:
            state[row_key(new, key)] = new
        elif op == "update" and new is not None:
            before = state.pop(row_key(old if old is not None else new, key), {})
            row = dict(new)
            for col in unchanged:
                if col in before:
                    row[col] = before[col]
            state[row_key(row, key)] = row
        elif op == "delete" and old is not None:
            state.pop(row_key(old, key), None)


def changes_of(rows: Iterable[Any], key: Sequence[str] | None = None) -> list[tuple[int, int, Change]]:
    """The source's rows as (csn, seq, change), each keyed by `key`, else by the row's own `key` column.

    ValueError for a row change without a key either way: applied by no key,
    it would overwrite some other row or none.
    """
    out: list[tuple[int, int, Change]] = []
    for r in rows:
        old = json.loads(r["old"]) if r["old"] is not None else None
        new = json.loads(r["new"]) if r["new"] is not None else None
        columns = list(key or r["key"] or [])
        if not columns and r["op"] != "truncate":
            raise ValueError(
                f"the {r['op']} at csn {r['csn']} (seq {r['seq']}) names no key columns: its table has "
                "REPLICA IDENTITY NOTHING or no primary key, or the changelog was written before changes "
                "carried their key; name them with --key"
            )
        out.append((r["csn"], r["seq"], (r["op"], old, new, list(r["unchanged"] or []), columns)))
    return out


# --- Parquet -------------------------------------------------------------------------


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    sync_directory(os.path.dirname(path) or ".")


def parquet_progress(directory: str) -> dict[str, Any]:
    try:
        with open(os.path.join(directory, "_progress.json"), encoding="utf-8") as f:
            loaded: dict[str, Any] = json.load(f)
            return loaded
    except FileNotFoundError:
        return {"batch_id": -1, "csn": 0, "snapshot": None}


def read_parquet_state(directory: str) -> dict[str, dict[str, Any]]:
    import pyarrow.parquet as pq

    snapshot = parquet_progress(directory)["snapshot"]
    if snapshot is None:
        return {}
    table = pq.read_table(os.path.join(directory, snapshot))
    return {
        k: json.loads(r)
        for k, r in zip(table.column("key").to_pylist(), table.column("row").to_pylist(), strict=True)
    }


def apply_to_parquet(directory: str, batch_id: int, changes: list[tuple[int, int, Change]]) -> bool:
    """Applies one micro-batch unless it already was; True when it was applied now."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    progress = parquet_progress(directory)
    if batch_id <= progress["batch_id"]:
        return False  # (a re-run of a batch this sink already holds)
    state = read_parquet_state(directory)
    apply_changes(state, (c for _, _, c in changes))
    name = f"state-{batch_id:08d}.parquet"
    table = pa.table({"key": list(state), "row": [json.dumps(r, ensure_ascii=False) for r in state.values()]})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    _write_atomic(os.path.join(directory, name), sink.getvalue().to_pybytes())
    csn = changes[-1][0] if changes else progress["csn"]
    _write_atomic(
        os.path.join(directory, "_progress.json"),
        json.dumps({"batch_id": batch_id, "csn": csn, "snapshot": name}).encode(),
    )
    if progress["snapshot"] and progress["snapshot"] != name:
        os.unlink(os.path.join(directory, progress["snapshot"]))
    return True


# --- PostgreSQL ------------------------------------------------------------------------


def pg_table(table: str) -> str:
    schema, _, name = table.partition(".")
    return f"{schema}_{name}_copy"


def prepare_postgres(dsn: str, table: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{pg_table(table)}" (key jsonb PRIMARY KEY, row jsonb NOT NULL)'
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS csnd_sink_progress (sink text PRIMARY KEY, batch_id bigint, csn bigint)"
        )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS csnd_sink_applied (sink text, csn bigint, seq int, PRIMARY KEY (sink, csn, seq))"
        )


def apply_to_postgres(dsn: str, table: str, batch_id: int, changes: list[tuple[int, int, Change]]) -> bool:
    """Applies one micro-batch and records its id in one transaction, unless it already was."""
    import psycopg

    copy = pg_table(table)
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO csnd_sink_progress VALUES (%s, -1, 0) ON CONFLICT DO NOTHING", (copy,))
        (done,) = conn.execute(
            "SELECT batch_id FROM csnd_sink_progress WHERE sink = %s FOR UPDATE", (copy,)
        ).fetchone()  # type: ignore[misc]
        if batch_id <= done:
            return False
        upsert = f'INSERT INTO "{copy}" VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET row = EXCLUDED.row'
        for csn, seq, (op, old, new, unchanged, key) in changes:
            if op == "truncate":
                conn.execute(f'DELETE FROM "{copy}"')
            elif op in _UPSERTS and new is not None:
                conn.execute(upsert, (row_key(new, key), json.dumps(new)))
            elif op == "update" and new is not None:
                got = conn.execute(
                    f'DELETE FROM "{copy}" WHERE key = %s RETURNING row',
                    (row_key(old if old is not None else new, key),),
                ).fetchone()
                row = dict(new)
                before = got[0] if got else {}
                for col in unchanged:
                    if col in before:
                        row[col] = before[col]
                conn.execute(upsert, (row_key(row, key), json.dumps(row)))
            elif op == "delete" and old is not None:
                conn.execute(f'DELETE FROM "{copy}" WHERE key = %s', (row_key(old, key),))
            conn.execute("INSERT INTO csnd_sink_applied VALUES (%s, %s, %s)", (copy, csn, seq))
        last = changes[-1][0] if changes else 0
        conn.execute(
            "UPDATE csnd_sink_progress SET batch_id = %s, csn = %s WHERE sink = %s", (batch_id, last, copy)
        )
    return True


# --- the job -------------------------------------------------------------------------------


def export_stream(spark: Any, directory: str, table: str, max_files: int | None) -> Any:
    """The table's rows in `csnd serve --parquet-dir`'s files, streamed by Spark's file source.

    Each row's `seq` counts every change of its transaction (the export
    keeps every table's), which orders the table's changes as well.  A
    stream that falls behind the service's retention finds the files of the
    transactions it dropped gone: the names' CSN ranges show the gap.
    """
    from csnd.consumers.spark.columns import SCHEMA_DDL

    schema, _, name = table.partition(".")
    reader = spark.readStream.schema(SCHEMA_DDL)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    df = reader.parquet(directory)
    return df.where((df["schema"] == schema) & (df["table"] == name))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="current_state", description=__doc__.split("\n\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--target", help="HOST:PORT of csnd serve (read with the csnd source)")
    source.add_argument(
        "--export",
        metavar="DIR",
        help="the directory csnd serve --parquet-dir writes (read with Spark's file source)",
    )
    p.add_argument("--table", required=True, help="SCHEMA.TABLE to copy")
    p.add_argument(
        "--key", help="comma-separated key columns (default: each change's own, as the stream names them)"
    )
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    p.add_argument("--parquet", help="directory of the Parquet copy")
    p.add_argument("--postgres", help="DSN of the PostgreSQL copy")
    p.add_argument("--max-transactions", type=int, help="maxTransactionsPerTrigger (the csnd source)")
    p.add_argument("--max-files", type=int, help="maxFilesPerTrigger (--export)")
    p.add_argument("--available-now", action="store_true", help="read what is there now, then exit")
    args = p.parse_args(argv)
    key = [k.strip() for k in (args.key or "").split(",") if k.strip()] or None
    if not (args.parquet or args.postgres):
        p.error("give --parquet DIR, --postgres DSN or both")
    if (args.export and args.max_transactions) or (args.target and args.max_files):
        p.error("--max-transactions goes with --target, --max-files with --export")

    from csnd.consumers.spark.session import local_session

    spark = local_session("csnd-current-state")
    if args.postgres:
        prepare_postgres(args.postgres, args.table)
    if args.export:
        changes_df = export_stream(spark, args.export, args.table, args.max_files)
    else:
        reader = spark.readStream.format("csnd").option("target", args.target).option("tables", args.table)
        reader = reader.option("name", f"current-state-{pg_table(args.table)}")
        if args.max_transactions:
            reader = reader.option("maxTransactionsPerTrigger", str(args.max_transactions))
        changes_df = reader.load()

    def each_batch(df: Any, batch_id: int) -> None:
        # One table's changes of a micro-batch, in CSN order: the order they must be applied in.
        rows = df.select("csn", "seq", "op", "old", "new", "unchanged", "key").orderBy("csn", "seq").collect()
        changes = changes_of(rows, key)
        if args.parquet:
            apply_to_parquet(args.parquet, batch_id, changes)
        if args.postgres:
            apply_to_postgres(args.postgres, args.table, batch_id, changes)
        print(f"current_state: batch {batch_id}: {len(changes)} changes", file=sys.stderr, flush=True)

    writer = changes_df.writeStream.foreachBatch(each_batch).option("checkpointLocation", args.checkpoint)
    query = writer.trigger(availableNow=True).start() if args.available_now else writer.start()
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
