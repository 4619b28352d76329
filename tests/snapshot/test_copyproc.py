"""The snapshot's copier processes: the copy through them, and a dead one ends the snapshot with a clear error."""

from __future__ import annotations

import json
import os
import signal

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
    reader, made_at = _reader(pg, SnapshotSettings(chunk_rows=1000, readers=2))
    assert len(reader.copier_pids) == 2
    with Changelog(str(tmp_path)) as log:
        SnapshotRun([SnapshotNode(reader, "single", made_at)], SnapshotProgress()).run(log)
        lines = [json.loads(line) for _, line in log.read(0)]
    ids = sorted(c["new"]["id"] for line in lines for c in line["changes"])
    assert ids == list(range(1, 2501))
    assert [line["snapshot"].get("done") for line in lines][-1] is True
    assert sorted(line["snapshot"]["chunk"] for line in lines[:-1]) == [1, 2, 3]


def test_a_killed_copier_process_ends_the_snapshot_with_an_error_not_a_hang(
    pg: PgDatabase, tmp_path: object
) -> None:
    reader, made_at = _reader(pg, SnapshotSettings(chunk_rows=1000, readers=1))
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
