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
files, which appear whole, never change, and are taken in CSN order).  Each
sink records the batch id with the data, atomically, and skips a batch id it
already holds, so a kill -9 at any moment followed by a restart from the
checkpoint leaves every change applied exactly once.  From the export, each
sink also keeps the CSN its files cover through, and a batch whose files do
not begin there (retention removed the ones between before the job read
them) stops the job with one line naming the range.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from csnd.core.durable import sync_directory
from csnd.core.exportnames import parse_name
from csnd.core.tablespec import parse_table

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


def apply_to_parquet(
    directory: str, batch_id: int, changes: list[tuple[int, int, Change]], covers: Covers | None = None
) -> bool:
    """Applies one micro-batch unless it already was; True when it was applied now.

    `covers`: the CSN range of the export's files the batch read (--export),
    which must follow the last batch's (see follows).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    progress = parquet_progress(directory)
    if batch_id <= progress["batch_id"]:
        return False  # (a re-run of a batch this sink already holds)
    through = follows(progress.get("through"), covers, f"the Parquet copy in {directory}")
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
        json.dumps({"batch_id": batch_id, "csn": csn, "snapshot": name, "through": through}).encode(),
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
        # (--export: the CSN range the files read so far cover; a table made before it lacks it)
        conn.execute("ALTER TABLE csnd_sink_progress ADD COLUMN IF NOT EXISTS through bigint")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS csnd_sink_applied (sink text, csn bigint, seq int, PRIMARY KEY (sink, csn, seq))"
        )


def apply_to_postgres(
    dsn: str, table: str, batch_id: int, changes: list[tuple[int, int, Change]], covers: Covers | None = None
) -> bool:
    """Applies one micro-batch and records its id in one transaction, unless it already was."""
    import psycopg

    copy = pg_table(table)
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("INSERT INTO csnd_sink_progress VALUES (%s, -1, 0) ON CONFLICT DO NOTHING", (copy,))
        done, through = conn.execute(
            "SELECT batch_id, through FROM csnd_sink_progress WHERE sink = %s FOR UPDATE", (copy,)
        ).fetchone()  # type: ignore[misc]
        if batch_id <= done:
            return False
        through = follows(through, covers, f'the PostgreSQL copy "{copy}"')
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
            "UPDATE csnd_sink_progress SET batch_id = %s, csn = %s, through = %s WHERE sink = %s",
            (batch_id, last, through, copy),
        )
    return True


# --- the export ------------------------------------------------------------------------

# (after, last): a batch's files hold every transaction with after < csn <= last
Covers = tuple[int, int]


def export_stream(spark: Any, directory: str, max_files: int | None) -> Any:
    """`csnd serve --parquet-dir`'s files, streamed by Spark's file source, each row with its file's name.

    Every table's rows: `seq` counts every change of a transaction, which
    orders a table's changes as well.  The name (column `_file`) says what
    CSN range the file covers (export_covers).
    """
    from csnd.consumers.spark.columns import SCHEMA_DDL

    reader = spark.readStream.schema(SCHEMA_DDL)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    df = reader.parquet(directory)
    return df.select("*", df["_metadata.file_name"].alias("_file"))


def export_covers(names: Iterable[str]) -> Covers:
    """The CSN range a batch's export files cover; ValueError if they leave a gap."""
    files = sorted(f for n in set(names) if (f := parse_name(n)) is not None)
    if not files:
        raise ValueError(
            f"no export file among {sorted(set(names))}: is this a csnd --parquet-dir directory?"
        )
    for a, b in itertools.pairwise(files):
        if b.after_csn != a.last_csn:
            raise _gap(a.last_csn, b.after_csn, "this micro-batch's files")
    return files[0].after_csn, files[-1].last_csn


def follows(through: int | None, covers: Covers | None, sink: str) -> int | None:
    """What a sink covers once it applies a batch covering `covers`, having covered `through`.

    ValueError when the batch does not start where the last one ended:
    the service's retention removed the files between before this copy read
    them, and their changes can no longer be applied (the csnd source says
    so too, as OUT_OF_RANGE).  None: not reading the export.
    """
    if covers is None:
        return through
    if through is not None and covers[0] > through:
        raise _gap(through, covers[0], sink)
    return covers[1]


def _gap(after: int, upto: int, where: str) -> ValueError:
    return ValueError(
        f"the export's files of csn {after} < csn <= {upto} are gone (removed by csnd serve's retention "
        f"before {where} read them): their changes cannot be applied; make the copy anew (an empty copy "
        "and checkpoint), from a service that still retains them"
    )


# --- the job -------------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


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
    p.add_argument("--max-transactions", type=_positive, help="maxTransactionsPerTrigger (the csnd source)")
    p.add_argument("--max-files", type=_positive, help="maxFilesPerTrigger (--export)")
    p.add_argument("--available-now", action="store_true", help="read what is there now, then exit")
    args = p.parse_args(argv)
    key = [k.strip() for k in (args.key or "").split(",") if k.strip()] or None
    if not (args.parquet or args.postgres):
        p.error("give --parquet DIR, --postgres DSN or both")
    if (args.export and args.max_transactions is not None) or (args.target and args.max_files is not None):
        p.error("--max-transactions goes with --target, --max-files with --export")
    try:
        schema, name = parse_table(args.table)
    except ValueError as e:
        p.error(str(e))

    from csnd.consumers.spark.session import local_session

    spark = local_session("csnd-current-state")
    if args.postgres:
        prepare_postgres(args.postgres, args.table)
    if args.export:
        changes_df = export_stream(spark, args.export, args.max_files)
    else:
        reader = spark.readStream.format("csnd").option("target", args.target).option("tables", args.table)
        reader = reader.option("name", f"current-state-{pg_table(args.table)}")
        if args.max_transactions:
            reader = reader.option("maxTransactionsPerTrigger", str(args.max_transactions))
        changes_df = reader.load()

    def each_batch(df: Any, batch_id: int) -> None:
        covers = None
        if args.export:  # (every table's rows: the files' names first, then the table's)
            covers = export_covers(r[0] for r in df.select("_file").distinct().collect())
            df = df.where(
                (df["schema"] == schema) & (df["table"] == name) if name else df["schema"] == schema
            )
        # One table's changes of a micro-batch, in CSN order: the order they must be applied in.
        rows = df.select("csn", "seq", "op", "old", "new", "unchanged", "key").orderBy("csn", "seq").collect()
        changes = changes_of(rows, key)
        if args.parquet:
            apply_to_parquet(args.parquet, batch_id, changes, covers)
        if args.postgres:
            apply_to_postgres(args.postgres, args.table, batch_id, changes, covers)
        print(f"current_state: batch {batch_id}: {len(changes)} changes", file=sys.stderr, flush=True)

    writer = changes_df.writeStream.foreachBatch(each_batch).option("checkpointLocation", args.checkpoint)
    query = writer.trigger(availableNow=True).start() if args.available_now else writer.start()
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
