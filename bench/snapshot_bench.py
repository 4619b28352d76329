"""Initial snapshot benchmark: rows/s of `csnd serve --snapshot initial`'s copy, by chunk size and readers.

Starts a throwaway PostgreSQL 15 server, fills a table of `rows` rows
(an int key, text, numeric, timestamptz, jsonb), and for each (chunk_rows,
readers) setting makes a new slot with an exported snapshot and copies the
table into a fresh changelog with the service's own code (`csnd.snapshot`),
timing the copy from the first query to the completion record's fsync.
This is what `csnd.snapshot.plan.CHUNK_ROWS` and
`csnd.snapshot.copier.READERS` were chosen by.

    python -m bench.snapshot_bench [rows]
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from typing import Any

import psycopg

from bench.common import out_path
from csnd.changelog import Changelog
from csnd.reader.live import LiveOptions, LiveSource
from csnd.snapshot.copier import NodeSnapshot, SnapshotSettings
from csnd.snapshot.progress import SnapshotProgress
from csnd.snapshot.run import SnapshotNode, SnapshotRun
from csnd.testing.pgserver import start_server

SETTINGS = [(2_000, 1), (10_000, 1), (10_000, 3), (50_000, 3), (10_000, 6)]


def _copy(dsn: str, slot: str, settings: SnapshotSettings) -> tuple[float, int]:
    source = LiveSource("dn1", LiveOptions(dsn, slot, "bench_pub", create_slot=True))
    exported = source.prepare("initial")
    assert exported is not None
    reader = NodeSnapshot(
        "dn1", dsn, "bench_pub", exported.consistent_lsn, binary=True, enums=[], settings=settings
    )
    try:
        reader.open(exported.name)
    finally:
        exported.release()
    directory = tempfile.mkdtemp(prefix="csnd-snapbench-")
    try:
        with Changelog(directory) as log:
            t0 = time.perf_counter()
            SnapshotRun([SnapshotNode(reader, "single", exported.made_at)], SnapshotProgress()).run(log)
            seconds = time.perf_counter() - t0
            size = log.size_bytes
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return seconds, size


def run(rows: int = 500_000) -> dict[str, Any]:
    server = start_server()
    try:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2), at timestamptz, doc jsonb)"
            )
            conn.execute(
                "INSERT INTO acct SELECT i, 'owner ' || i, i * 1.25, now(), jsonb_build_object('k', i) "
                f"FROM generate_series(1, {int(rows)}) AS i"
            )
            conn.execute("CREATE PUBLICATION bench_pub FOR ALL TABLES")
            conn.execute("ANALYZE acct")
        results = []
        for i, (chunk_rows, readers) in enumerate(SETTINGS):
            seconds, size = _copy(dsn, f"bench_{i}", SnapshotSettings(chunk_rows, readers))
            results.append(
                {
                    "chunk_rows": chunk_rows,
                    "readers": readers,
                    "seconds": round(seconds, 3),
                    "rows_per_s": round(rows / seconds),
                    "changelog_bytes": size,
                }
            )
            print(
                f"chunk_rows {chunk_rows:>6,} readers {readers}: {rows / seconds:>10,.0f} rows/s", flush=True
            )
        return {"rows": rows, "runs": results}
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


if __name__ == "__main__":
    result = run(int(sys.argv[1]) if len(sys.argv) > 1 else 500_000)
    with open(out_path("snapshot.json"), "w") as f:
        json.dump(result, f, indent=2)
