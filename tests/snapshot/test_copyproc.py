"""The snapshot's copier processes: the copy through them, and a dead one ends the snapshot with a clear error."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from csnd.changelog import Changelog
from csnd.core.errors import SnapshotError
from csnd.reader.live import LiveOptions, LiveSource
from csnd.snapshot.copier import NodeSnapshot, SnapshotSettings
from csnd.snapshot.plan import ColumnInfo, TableInfo, boundaries_sql, split_bounds
from csnd.snapshot.progress import SnapshotProgress
from csnd.snapshot.run import SnapshotNode, SnapshotRun
from tests.fixtures.pg import PgDatabase


def _reader(pg: PgDatabase, settings: SnapshotSettings) -> tuple[NodeSnapshot, int]:
    with pg.connect() as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO item SELECT i, 'v' || i FROM generate_series(1, 2500) AS i")
        conn.execute("CREATE PUBLICATION snap_pub FOR TABLE item")
    return _reader_of(pg, settings)


def _reader_of(pg: PgDatabase, settings: SnapshotSettings) -> tuple[NodeSnapshot, int]:
    """A NodeSnapshot of publication snap_pub, opened on a new slot's exported snapshot."""
    source = LiveSource("dn1", LiveOptions(pg.dsn, "snap_slot", "snap_pub", create_slot=True))
    exported = source.prepare("initial")
    assert exported is not None
    reader = NodeSnapshot(
        "dn1", pg.dsn, "snap_pub", exported.consistent_lsn, binary=True, enums=[], settings=settings
    )
    try:
        reader.open(exported.name)
    finally:
        exported.release()
    return reader, exported.made_at


def test_the_copier_processes_copy_every_chunk_once(pg: PgDatabase, tmp_path: object) -> None:
    reader, made_at = _reader(
        pg, SnapshotSettings(chunk_rows=1000, readers=2, copiers="processes", split="key")
    )  # (key ranges: exactly 3 chunks of the 2,500 rows)
    assert len(reader.copier_pids) == 2
    with Changelog(str(tmp_path)) as log:
        SnapshotRun([SnapshotNode(reader, "single", made_at)], SnapshotProgress()).run(log)
        lines = [json.loads(line) for _, line in log.read(0)]
    ids = sorted(c["new"]["id"] for line in lines for c in line["changes"])
    assert ids == list(range(1, 2501))
    assert [line["snapshot"].get("done") for line in lines][-1] is True
    assert sorted(line["snapshot"]["chunk"] for line in lines[:-1]) == [1, 2, 3]


def test_copier_threads_write_the_records_copier_processes_write(pg: PgDatabase, tmp_path: Path) -> None:
    """Both kinds import one exported snapshot: the same chunks, the same bytes, record for record."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v text, n numeric, at timestamptz, doc jsonb)")
        conn.execute(
            "INSERT INTO item SELECT i, 'v\"' || i || 'é', i * 1.25, '2026-01-01'::timestamptz + i * interval '1 s', "
            "jsonb_build_object('k', i) FROM generate_series(1, 2500) AS i"
        )
        conn.execute("CREATE PUBLICATION snap_pub FOR TABLE item")
    source = LiveSource("dn1", LiveOptions(pg.dsn, "snap_slot", "snap_pub", create_slot=True))
    exported = source.prepare("initial")
    assert exported is not None
    readers = {}
    try:
        for kind in ("threads", "processes"):
            readers[kind] = NodeSnapshot(
                "dn1",
                pg.dsn,
                "snap_pub",
                exported.consistent_lsn,
                binary=True,
                enums=[],
                settings=SnapshotSettings(chunk_rows=1000, readers=2, copiers=kind, split="key"),
            )
            readers[kind].open(exported.name)
    finally:
        exported.release()
    assert readers["threads"].copier_pids == [os.getpid()] * 2
    records = {}
    for kind, reader in readers.items():
        with Changelog(str(tmp_path / kind)) as log:
            SnapshotRun([SnapshotNode(reader, "single", exported.made_at)], SnapshotProgress()).run(log)
            # (chunks are appended as they finish: compare them by their place in the table)
            records[kind] = sorted(
                (json.loads(line)["snapshot"].get("chunk", 0), line) for _, line in log.read(0)
            )
    threads, processes = records["threads"], records["processes"]
    assert len(threads) == 4
    assert [chunk for chunk, _ in threads] == [chunk for chunk, _ in processes]
    for (_, a), (_, b) in zip(threads, processes, strict=True):
        # (a chunk's csn is the order it finished in, which may differ between the two runs)
        assert _without_csn(a) == _without_csn(b)


def test_a_copier_threads_lost_connection_ends_the_snapshot_with_an_error_not_a_hang(
    pg: PgDatabase, tmp_path: Path
) -> None:
    reader, made_at = _reader(
        pg, SnapshotSettings(chunk_rows=1000, readers=1, copiers="threads", split="key")
    )
    planner = reader._conns[0].info.backend_pid  # (left alone: the copier's connection is the one lost)
    with pg.connect() as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid NOT IN (pg_backend_pid(), %s) AND backend_type = 'client backend'",
            (planner,),
        ).fetchall()
    assert killed == [(True,)]
    with Changelog(str(tmp_path)) as log, pytest.raises(SnapshotError) as caught:
        SnapshotRun([SnapshotNode(reader, "single", made_at)], SnapshotProgress()).run(log)
    message = str(caught.value)
    assert "cannot read chunk 1 of 3" in message and "node dn1" in message


def _without_csn(line: bytes) -> bytes:
    head, sep, rest = line.partition(b", ")
    assert head.startswith(b'{"csn": ') and sep
    return rest


def test_a_killed_copier_process_ends_the_snapshot_with_an_error_not_a_hang(
    pg: PgDatabase, tmp_path: object
) -> None:
    reader, made_at = _reader(pg, SnapshotSettings(chunk_rows=1000, readers=1, copiers="processes"))
    (pid,) = reader.copier_pids
    os.kill(pid, signal.SIGKILL)
    with Changelog(str(tmp_path)) as log, pytest.raises(SnapshotError) as caught:
        SnapshotRun([SnapshotNode(reader, "single", made_at)], SnapshotProgress()).run(log)
    message = str(caught.value)
    assert f"copier process (pid {pid})" in message
    assert "node dn1" in message
    assert "take the snapshot again" in message


def test_the_boundary_pass_gives_the_bounds_and_count_of_a_counting_window(pg: PgDatabase) -> None:
    """The oracle: the former pass, a `count(*) OVER ()` beside the row numbers (every key held first)."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE acct (region text, id int, v text, PRIMARY KEY (region, id))")
        conn.execute("INSERT INTO acct SELECT 'r' || (i % 3), i, 'v' || i FROM generate_series(1, 2345) AS i")
        for row_filter, chunk_rows in ((None, 100), ("v <> 'v7'", 7), (None, 2345), ("id < 0", 10)):
            table = TableInfo(
                0,
                "public",
                "acct",
                "d",
                (ColumnInfo("region", 25, -1, "text", True), ColumnInfo("id", 23, -1, "integer", True)),
                ("region", "id"),
                row_filter,
            )
            where = f" WHERE ({row_filter})" if row_filter else ""
            oracle = conn.execute(
                'SELECT "region"::text, "id"::text, n, c FROM (SELECT region, id, '
                "row_number() OVER (ORDER BY region, id) AS n, count(*) OVER () AS c "
                f"FROM ONLY acct{where}) AS k WHERE n % {chunk_rows} = 0 OR n = c ORDER BY n"
            ).fetchall()
            rows = conn.execute(boundaries_sql(table, chunk_rows)).fetchall()
            assert split_bounds(rows) == split_bounds(oracle)
            assert [r[:3] for r in rows] == [r[:3] for r in oracle]


def test_page_range_chunks_read_every_row_of_the_snapshot_once(pg: PgDatabase, tmp_path: Path) -> None:
    """split = "ctid": updated rows (moved to other pages), deleted ones (empty pages), and rows
    written after the snapshot past the table's end: the chunks hold the snapshot's rows, once each."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO item SELECT i, 'v' || i FROM generate_series(1, 6000) AS i")
        conn.execute("DELETE FROM item WHERE id BETWEEN 1000 AND 2500")
        conn.execute("UPDATE item SET v = v || 'u' WHERE id % 7 = 0")
        conn.execute("ANALYZE item")
        conn.execute("CREATE PUBLICATION snap_pub FOR TABLE item")
        want = sorted(conn.execute("SELECT id, v FROM item").fetchall())
    reader, made_at = _reader_of(pg, SnapshotSettings(chunk_rows=700, readers=2, split="ctid"))
    with pg.connect() as conn:  # (after the snapshot: new pages, none of it read)
        conn.execute("INSERT INTO item SELECT i, 'late' FROM generate_series(10001, 14000) AS i")
        conn.execute("DELETE FROM item WHERE id < 100")
    with Changelog(str(tmp_path)) as log:
        SnapshotRun([SnapshotNode(reader, "single", made_at)], SnapshotProgress()).run(log)
        lines = [json.loads(line) for _, line in log.read(0)]
    got = sorted((c["new"]["id"], c["new"]["v"]) for line in lines for c in line["changes"])
    assert got == [tuple(r) for r in want]
    chunks = [line["snapshot"] for line in lines[:-1]]
    assert len(chunks) > 3 and {c["chunks"] for c in chunks} == {len(chunks)}
    assert sorted(c["chunk"] for c in chunks) == list(range(1, len(chunks) + 1))
    assert sum(c["rows"] for c in chunks) == len(want) == lines[-1]["snapshot"]["rows"]
    assert reader.row_counts == {}  # (cut by pages: no boundary pass counted the rows)


def test_the_default_cuts_an_analysed_table_into_page_ranges_and_a_partitioned_one_by_key(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """PostgreSQL 14 and later: the default split reads a table with statistics by ranges of its heap
    pages (no boundary pass, its total its statistics' rows a page over its pages), a partitioned
    table (published as its root) and a table never analysed by key ranges, counted."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO item SELECT i, 'v' || i FROM generate_series(1, 5000) AS i")
        conn.execute("CREATE TABLE part (id int PRIMARY KEY, v text) PARTITION BY RANGE (id)")
        conn.execute("CREATE TABLE part_a PARTITION OF part FOR VALUES FROM (0) TO (2000)")
        conn.execute("CREATE TABLE part_b PARTITION OF part FOR VALUES FROM (2000) TO (10000)")
        conn.execute("INSERT INTO part SELECT i, 'p' || i FROM generate_series(1, 3000) AS i")
        conn.execute("ANALYZE item, part")
        # (never analysed, reltuples -1: no autovacuum to analyse it before the snapshot plans it)
        conn.execute("CREATE TABLE fresh (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false)")
        conn.execute("INSERT INTO fresh SELECT i, 'f' || i FROM generate_series(1, 1500) AS i")
        conn.execute(
            "CREATE PUBLICATION snap_pub FOR TABLE item, part, fresh WITH (publish_via_partition_root)"
        )
        stats = conn.execute("SELECT relpages, reltuples FROM pg_class WHERE relname = 'item'").fetchone()
        assert stats is not None
        relpages, reltuples = int(str(stats[0])), float(str(stats[1]))
        ids = {
            str(name): int(str(oid))
            for name, oid in conn.execute(
                "SELECT relname::text, oid::int8 FROM pg_class WHERE relname IN ('item', 'part', 'fresh')"
            ).fetchall()
        }
    assert SnapshotSettings().split == "ctid"
    reader, made_at = _reader_of(pg, SnapshotSettings(chunk_rows=1000, readers=2))
    assert reader._conns[0].info.server_version >= 140000
    progress = SnapshotProgress()
    with Changelog(str(tmp_path)) as log:
        SnapshotRun([SnapshotNode(reader, "single", made_at)], progress).run(log)
        lines = [json.loads(line) for _, line in log.read(0)]
    by_table: dict[str, list[int]] = {}
    for line in lines[:-1]:
        by_table.setdefault(line["snapshot"]["table"], []).extend(c["new"]["id"] for c in line["changes"])
    assert {t: sorted(got) for t, got in by_table.items()} == {
        "item": list(range(1, 5001)),
        "part": list(range(1, 3001)),
        "fresh": list(range(1, 1501)),
    }
    # item by its pages: no counted total, its pages and its estimate kept for progress
    assert set(reader.page_cuts) == {ids["item"]} and reader.pages(ids["item"]) >= relpages
    assert reader.page_cuts[ids["item"]].estimated_rows == round(
        reltuples / relpages * reader.pages(ids["item"])
    )
    # part (relkind p) and fresh (no statistics) by key: counted, chunks of at most chunk_rows rows
    assert reader.row_counts == {ids["part"]: 3000, ids["fresh"]: 1500}
    assert all(len(line["changes"]) <= 1000 for line in lines[:-1] if line["snapshot"]["table"] != "item")
    shown = {t.table: (t.state, t.rows, t.rows_estimated) for t in progress.tables()}
    assert shown == {
        "item": ("done", 5000, 5000),
        "part": ("done", 3000, 3000),
        "fresh": ("done", 1500, 1500),
    }
