"""The current-state example drops the rows deleted before an incremental snapshot.

A consumer's copy of acct was loaded earlier (every row, node dn1, CSN 0);
then a tenth of the rows are deleted where no stream sees it (the service's
slot is made after the deletes).  `csnd snapshot public.acct` reads the
table again in chunks; the example, run through a local Spark against the
service, must then hold exactly the table in both sinks: the deleted keys
are dropped by the rule of docs/design.md section 7 ("Deleted rows"), which
the source's `snapshot` column carries.  The table is cut so its last chunk
is empty: the row that says the table is done is the `snapshot` row of a
chunk that kept nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from csnd.consumers.examples.current_state import pg_table, prepare_postgres, read_parquet_state, row_key
from tests.consumers.test_spark_example import TABLE
from tests.consumers.test_spark_example import job as spark_job
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import CSND, start_serve
from tests.service.test_serve_snapshot import _setup, _table, read_everything

ROWS, CHUNK_ROWS = 1_000, 300  # (900 rows left: three full chunks, then an empty last one)
KEY = ["id", "region"]  # (the primary key's columns in column order, as the stream names them)


def _seed_copy(pg: PgDatabase, copy_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Both sinks holding `rows`, as a copy loaded before the deletes (node dn1, CSN 0, no batch applied)."""
    prepare_postgres(pg.dsn, TABLE)
    for r in rows:
        pg.execute(
            f'INSERT INTO "{pg_table(TABLE)}" (key, row, node, csn) VALUES (%s, %s, %s, 0)',
            (row_key(r, KEY), json.dumps(r), "dn1"),
        )
    copy_dir.mkdir()
    keys = [row_key(r, KEY) for r in rows]
    table = pa.table(
        {
            "key": pa.array(keys, pa.string()),
            "row": pa.array([json.dumps(r) for r in rows], pa.string()),
            "node": pa.array(["dn1"] * len(rows), pa.string()),
            "csn": pa.array([0] * len(rows), pa.int64()),
        }
    )
    pq.write_table(table, copy_dir / "state-seed.parquet")
    progress = {"batch_id": -1, "csn": 0, "snapshot": "state-seed.parquet", "through": None}
    (copy_dir / "_progress.json").write_text(json.dumps(progress))


@pytest.mark.timeout(2400)  # (a Spark start-up of a subprocess on a busy 2-core machine)
def test_rows_deleted_before_an_incremental_snapshot_leave_the_spark_copy(
    pg: PgDatabase, tmp_path: Any
) -> None:
    _setup(pg, rows=ROWS)
    stale, _ = _table(pg)
    pg.execute("DELETE FROM acct WHERE id % 10 = 0")  # (before the slot: no stream sees these go)
    _seed_copy(pg, tmp_path / "copy", list(stale.values()))
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    try:
        got = subprocess.run(
            [*CSND, "snapshot", served.address, TABLE, "--chunk-rows", str(CHUNK_ROWS)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert got.returncode == 0, got.stderr
        lines = [json.loads(x) for x in read_everything(pg, served)]
        job = spark_job(served.address, tmp_path, pg, 2_000, "--available-now")
        try:
            assert job.wait(900) == 0, (tmp_path / "job.log").read_text()[-3000:]
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    finally:
        code, err = served.terminate()
    assert code == 0, err
    chunks = [t for t in lines if "snapshot" in t and t["snapshot"]["table"] == "acct"]
    assert chunks[-1]["snapshot"]["last"] is True and chunks[-1]["changes"] == []  # (an empty last chunk)
    assert sum(len(t["changes"]) for t in chunks) == ROWS - ROWS // 10
    want, _ = _table(pg)
    assert len(stale.keys() - want.keys()) == ROWS // 10
    rows = pg.execute(f'SELECT row::text FROM "{pg_table(TABLE)}"')
    in_pg = {(r["region"], r["id"]): r for r in (json.loads(str(row)) for (row,) in rows)}
    assert in_pg.keys() == want.keys(), sorted(in_pg.keys() - want.keys())[:5]
    assert in_pg == want
    in_parquet = {(r["region"], r["id"]): r for r in read_parquet_state(str(tmp_path / "copy")).values()}
    assert in_parquet == want
