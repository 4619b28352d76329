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
to one or both sinks.  Each row of the copy keeps the node and CSN of the
change that last put it, so rows deleted before an incremental snapshot
(which no stream saw go: a copy loaded earlier, or a stream started after
the deletes) are dropped by the rule of docs/design.md section 7, "Deleted
rows": once the row of a table's last chunk (the source's `snapshot`
column: `last`, not `redo`) is applied, the copy's rows of that node with a
CSN at most the chunk's `since` no longer exist.  A row of a copy made
before rows kept their node (node unknown) is kept.  The
key is each change's own `key` column (the replica identity's columns the
stream names, docs/design.md section 7), so a change of key columns by DDL
is followed; `--key` overrides it, for a table whose stream names none
(REPLICA IDENTITY NOTHING, or a changelog written before changes had keys)
or whose primary key is narrower than what it names (FULL: every column).
The sinks:

- Parquet (DIR): `state-<batch>.parquet` (columns `key`, `row`, `node`,
  `csn`: the key values and the row as JSON text, and where the row was
  last put) and `_progress.json` naming the last
  batch applied and its snapshot, both replaced atomically (temp file,
  fsync, rename, directory fsync).
- PostgreSQL (DSN): table `<schema>_<table>_copy(key jsonb primary key, row
  jsonb, node text, csn bigint)`, with the batch id stored in `csnd_sink_progress` in the same
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

# The op of the row of an incremental snapshot chunk that kept no row (the
# source's, docs/design.md section 8; not imported: pyarrow is the Spark extra's).
SNAPSHOT_OP = "snapshot"

# An initial snapshot's rows ("read", docs/design.md section 5) put a row as an insert does.
_UPSERTS = ("insert", "read")

# op, old, new, unchanged, key columns, node, and `since` when the change ends a
# table's incremental snapshot (its last chunk's last row): the node's rows
# put at a CSN at most this are gone (docs/design.md section 7, "Deleted rows").
Change = tuple[
    str, dict[str, Any] | None, dict[str, Any] | None, list[str], Sequence[str], str | None, int | None
]
# Where each row of a copy was last put: key text -> (node, csn); node None when unknown.
Versions = dict[str, tuple[str | None, int]]


def row_key(row: dict[str, Any], key: Sequence[str]) -> str:
    """The key values of a row as JSON text (the copy's key column)."""
    return json.dumps([row.get(k) for k in key], ensure_ascii=False)


def apply_changes(state: dict[str, dict[str, Any]], changes: Iterable[Change]) -> None:
    """Applies changes (in CSN, seq order), each by its key columns, to `state` (key text -> row), in place.

    Without CSNs, so no snapshot's deleted rows are dropped (`apply_versioned` does).
    """
    apply_versioned(state, {}, ((0, 0, (*c[:6], None)) for c in changes))


def apply_versioned(
    state: dict[str, dict[str, Any]], versions: Versions, changes: Iterable[tuple[int, int, Change]]
) -> None:
    """`apply_changes` of (csn, seq, change), keeping where each row was put in `versions`, in place.

    A change that ends a table's incremental snapshot then drops the rows of
    its node put at a CSN at most its `since`.
    """
    for csn, _, (op, old, new, unchanged, key, node, since) in changes:
        if op == "truncate":
            state.clear()
            versions.clear()
        elif op in _UPSERTS and new is not None:
            k = row_key(new, key)
            state[k], versions[k] = new, (node, csn)
        elif op == "update" and new is not None:
            gone = row_key(old if old is not None else new, key)
            before = state.pop(gone, {})
            versions.pop(gone, None)
            row = dict(new)
            for col in unchanged:
                if col in before:
                    row[col] = before[col]
            k = row_key(row, key)
            state[k], versions[k] = row, (node, csn)
        elif op == "delete" and old is not None:
            state.pop(row_key(old, key), None)
            versions.pop(row_key(old, key), None)
        if since is not None:
            for k in [k for k, (n, c) in versions.items() if n == node and c <= since]:
                del state[k], versions[k]


def changes_of(rows: Iterable[Any], key: Sequence[str] | None = None) -> list[tuple[int, int, Change]]:
    """The source's rows as (csn, seq, change), each keyed by `key`, else by the row's own `key` column.

    ValueError for a row change without a key either way: applied by no key,
    it would overwrite some other row or none.  The rows are in (csn, seq)
    order; the last of a table's last incremental chunk carries its `since`.
    """
    out: list[tuple[int, int, Change]] = []
    ending: int | None = None  # (index in out of the row that ends a snapshot, while its chunk's rows come)
    for r in rows:
        if ending is not None and out[ending][0] != r["csn"]:
            ending = None
        old = json.loads(r["old"]) if r["old"] is not None else None
        new = json.loads(r["new"]) if r["new"] is not None else None
        columns = list(key or r["key"] or [])
        if not columns and r["op"] not in ("truncate", SNAPSHOT_OP):
            raise ValueError(
                f"the {r['op']} at csn {r['csn']} (seq {r['seq']}) names no key columns: its table has "
                "REPLICA IDENTITY NOTHING or no primary key, or the changelog was written before changes "
                "carried their key; name them with --key"
            )
        since = _ends_snapshot(_field(r, "snapshot"))
        if since is not None and ending is not None:  # (the chunk's drop moves to its last row)
            csn, seq, change = out[ending]
            out[ending] = (csn, seq, (*change[:6], None))
        if since is not None:
            ending = len(out)
        unchanged = list(r["unchanged"] or [])
        out.append((r["csn"], r["seq"], (r["op"], old, new, unchanged, columns, _field(r, "node"), since)))
    return out


def _field(row: Any, name: str) -> Any:
    """A row's column, None when the row has no such column (a Spark Row or a dict)."""
    try:
        return row[name]
    except (KeyError, ValueError):  # (dict; pyspark's Row)
        return None


def _ends_snapshot(marker: Any) -> int | None:
    """The `since` of the `snapshot` column's marker if it is a table's last incremental chunk (not redone)."""
    if marker is None or marker["incremental"] is None or not marker["last"] or marker["redo"] is not None:
        return None
    since: int = marker["since"]
    return since


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
    return read_parquet_copy(directory)[0]


def read_parquet_copy(directory: str) -> tuple[dict[str, dict[str, Any]], Versions]:
    """The Parquet copy's rows (key text -> row) and where each was put (a copy made before: unknown, 0)."""
    import pyarrow.parquet as pq

    snapshot = parquet_progress(directory)["snapshot"]
    if snapshot is None:
        return {}, {}
    table = pq.read_table(os.path.join(directory, snapshot))
    keys = table.column("key").to_pylist()
    state = {k: json.loads(r) for k, r in zip(keys, table.column("row").to_pylist(), strict=True)}
    if "csn" not in table.column_names:
        return state, {k: (None, 0) for k in keys}
    nodes, csns = table.column("node").to_pylist(), table.column("csn").to_pylist()
    return state, {k: (n, c) for k, n, c in zip(keys, nodes, csns, strict=True)}


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
    state, versions = read_parquet_copy(directory)
    apply_versioned(state, versions, changes)
    name = f"state-{batch_id:08d}.parquet"
    table = pa.table(
        {
            "key": pa.array(list(state), pa.string()),
            "row": pa.array([json.dumps(r, ensure_ascii=False) for r in state.values()], pa.string()),
            "node": pa.array([versions[k][0] for k in state], pa.string()),
            "csn": pa.array([versions[k][1] for k in state], pa.int64()),
        }
    )
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
        # (where each row was last put; a copy made before has them unknown: node null, csn 0)
        conn.execute(f'ALTER TABLE "{pg_table(table)}" ADD COLUMN IF NOT EXISTS node text')
        conn.execute(
            f'ALTER TABLE "{pg_table(table)}" ADD COLUMN IF NOT EXISTS csn bigint NOT NULL DEFAULT 0'
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
        upsert = (
            f'INSERT INTO "{copy}" (key, row, node, csn) VALUES (%s, %s, %s, %s) ON CONFLICT (key) '
            "DO UPDATE SET row = EXCLUDED.row, node = EXCLUDED.node, csn = EXCLUDED.csn"
        )
        for csn, seq, (op, old, new, unchanged, key, node, since) in changes:
            if op == "truncate":
                conn.execute(f'DELETE FROM "{copy}"')
            elif op in _UPSERTS and new is not None:
                conn.execute(upsert, (row_key(new, key), json.dumps(new), node, csn))
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
                conn.execute(upsert, (row_key(row, key), json.dumps(row), node, csn))
            elif op == "delete" and old is not None:
                conn.execute(f'DELETE FROM "{copy}" WHERE key = %s', (row_key(old, key),))
            if since is not None:  # (the rows deleted before the snapshot: section 7, "Deleted rows")
                conn.execute(f'DELETE FROM "{copy}" WHERE node = %s AND csn <= %s', (node, since))
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
        rows = (
            df.select("csn", "seq", "node", "op", "old", "new", "unchanged", "key", "snapshot")
            .orderBy("csn", "seq")
            .collect()
        )
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
