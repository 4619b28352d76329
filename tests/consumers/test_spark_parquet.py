"""`csnd serve --parquet-dir`'s files read by Spark's own Parquet reader: batch, and streamed exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from csnd.changelog import Changelog
from csnd.service.parquet import ParquetExport
from tests.consumers.test_spark_source import COLS, expected_rows, rows_of

pytestmark = pytest.mark.xdist_group("spark")


def export_lines(log: Changelog, out: Path, lines: list[tuple[int, bytes]], file_rows: int = 700) -> None:
    """Appends `lines` to `log` and exports everything durable to `out`, files of `file_rows` rows."""
    for csn, line in lines:
        log.append(csn, line)
    log.sync()
    export = ParquetExport(log, str(out), file_rows=file_rows)
    export.start()
    export.stop()  # (a stop writes everything durable)
    assert export.error is None and export.exported_csn == lines[-1][0]


@pytest.mark.timeout(900)
def test_spark_reads_the_export_as_the_csnd_source_rows(
    spark: Any, tmp_path: Path, cluster_lines: list[tuple[int, bytes]]
) -> None:
    out = tmp_path / "pq"
    half = len(cluster_lines) // 2
    with Changelog(str(tmp_path / "log")) as log:
        export_lines(log, out, cluster_lines[:half])
        df = spark.read.parquet(str(out))
        assert df.columns == COLS
        assert rows_of(df) == expected_rows(cluster_lines[:half])

        # Spark's file-stream source takes each file once, and a restart from its checkpoint only new ones.
        seen: list[tuple[int, int]] = []
        checkpoint = str(tmp_path / "ck")

        def run() -> None:
            q = (
                spark.readStream.schema(df.schema)
                .parquet(str(out))
                .writeStream.foreachBatch(lambda b, _id: seen.extend((r.csn, r.seq) for r in b.collect()))
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination(600)
            assert q.exception() is None

        run()
        export_lines(log, out, cluster_lines[half:])
        run()
    want = [(r["csn"], r["seq"]) for r in expected_rows(cluster_lines)]
    assert sorted(seen) == want  # (every change exactly once)
