"""`--parquet-dir`: the changelog as Parquet files of contiguous CSN ranges, in the Spark source's rows."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from csnd.changelog import Changelog
from csnd.consumers.spark.columns import ARROW_SCHEMA, flatten
from csnd.core.exportnames import file_name, parse_name
from csnd.service.parquet import RANGES, ParquetExport
from tests.service.feedkit import line, txn_tables, wait_for
from tests.service.servekit import CSND, start_serve

CEILING = 60.0


def _append(log: Changelog, csns: Sequence[int]) -> dict[int, bytes]:
    written = {}
    for csn in csns:
        # every seventh transaction has no change: inside a range, never a row
        written[csn] = line(csn, [] if csn % 7 == 0 else txn_tables(csn))
        log.append(csn, written[csn])
    log.sync()
    return written


def _read(directory: Path) -> tuple[list[tuple[int, int]], pa.Table]:
    """The files' ranges in name order, and all their rows."""
    names = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
    files = [f for n in names if (f := parse_name(n)) is not None]
    assert len(files) == len(names)
    tables = [pq.read_table(directory / n) for n in names]
    return [(f.after_csn, f.last_csn) for f in files], pa.concat_tables(
        tables
    ) if tables else ARROW_SCHEMA.empty_table()


def _export(log: Changelog, directory: Path, until: int, **kw: object) -> ParquetExport:
    kw.setdefault("file_wait_s", 0.1)  # (the last rows are written once they have waited this long)
    export = ParquetExport(log, str(directory), **kw)  # type: ignore[arg-type]
    export.start()
    wait_for(lambda: export.exported_csn >= until or export.error is not None, "the export", seconds=CEILING)
    export.stop()
    assert export.error is None, export.error
    return export


def test_files_cover_contiguous_ranges_with_every_row_once(tmp_path: Path) -> None:
    with Changelog(str(tmp_path / "log")) as log:
        written = _append(log, range(1, 301))
        out = tmp_path / "pq"
        (out / ".csn-00000000000000000000-00000000000000000009.parquet.tmp").parent.mkdir()
        (out / ".csn-00000000000000000000-00000000000000000009.parquet.tmp").write_bytes(b"cut short")
        _export(log, out, 300, file_rows=200)
        ranges, rows = _read(out)
        assert len(ranges) > 3 and ranges[0][0] == 0 and ranges[-1][1] == 300
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))  # (no gap, no overlap)
        assert rows.equals(pa.Table.from_batches([flatten(sorted(written.items()))]))
        assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
        doc = json.loads((out / RANGES).read_text())
        assert doc["last_csn"] == 300 and [(f["after_csn"], f["last_csn"]) for f in doc["files"]] == ranges

        # a restart exports on after the newest file, nothing twice
        more = _append(log, range(301, 351))
        again = _export(log, out, 350, file_rows=200)
        ranges, rows = _read(out)
        assert ranges[-1][1] == 350 and again.rows == rows.num_rows - (rows.num_rows - again.rows)
        assert rows.equals(pa.Table.from_batches([flatten(sorted({**written, **more}.items()))]))


def _mtimes_ms(directory: Path) -> list[int]:
    names = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
    return [os.stat(directory / n).st_mtime_ns // 1_000_000 for n in names]


def test_modification_times_increase_with_the_csns_even_when_the_clock_steps_back(tmp_path: Path) -> None:
    # (Spark's file-stream source takes new files oldest first, by their times in milliseconds)
    with Changelog(str(tmp_path / "log")) as log:
        _append(log, range(1, 301))
        out = tmp_path / "pq"
        _export(log, out, 300, file_rows=5)  # (many files, cut faster than the kernel's file clock ticks)
        times = _mtimes_ms(out)
        assert len(times) > 40 and all(a < b for a, b in itertools.pairwise(times))
        # The newest file dated a minute ahead, as if the clock had since stepped back.
        newest = max(out.glob("csn-*.parquet"))
        ahead = os.stat(newest).st_mtime_ns + 60 * 10**9
        os.utime(newest, ns=(ahead, ahead))
        _append(log, range(301, 321))
        _export(log, out, 320, file_rows=5)
        times = _mtimes_ms(out)
        assert len(times) > 44 and all(a < b for a, b in itertools.pairwise(times))


def test_a_light_load_is_written_after_a_wait_and_a_stop_writes_what_is_pending(tmp_path: Path) -> None:
    with Changelog(str(tmp_path / "log")) as log:
        _append(log, [1, 2, 3])
        export = ParquetExport(log, str(tmp_path / "pq"), file_rows=10_000, file_wait_s=0.2)
        export.start()
        wait_for(lambda: export.exported_csn == 3, "a file after the wait", seconds=CEILING)
        _append(log, [4])
        export.stop()
        assert [f.last_csn for f in export.files] == [3, 4]


def test_nothing_held_back_from_readers_is_exported(tmp_path: Path) -> None:
    with Changelog(str(tmp_path / "log")) as log:
        log.hold_readers()
        _append(log, range(1, 11))
        export = ParquetExport(log, str(tmp_path / "pq"), file_rows=1, file_wait_s=0.05)
        export.start()
        wait_for(lambda: log.durable_csn == 10, "the records")
        export._stop.wait(0.5)
        assert export.exported_csn == 0 and export.files == []
        log.release_readers()
        wait_for(lambda: export.exported_csn == 10, "the export once released", seconds=CEILING)
        export.stop()


def test_files_go_with_the_changelog_records_retention_drops(tmp_path: Path) -> None:
    with Changelog(str(tmp_path / "log"), segment_bytes=4000, retention_bytes=12_000) as log:
        out = tmp_path / "pq"
        _append(log, range(1, 201))
        _export(log, out, 200, file_rows=20)
        first = sorted(n for n in os.listdir(out) if n.endswith(".parquet"))[0]
        assert log.apply_retention() > 0 and log.oldest_csn > 30
        _append(log, range(201, 211))
        export = _export(log, out, 210, file_rows=20)
        assert first not in os.listdir(out)
        assert export.files[0].last_csn >= log.oldest_csn


def test_an_export_behind_retention_leaves_the_gap_in_the_names(tmp_path: Path) -> None:
    with Changelog(str(tmp_path / "log"), segment_bytes=4000, retention_bytes=12_000) as log:
        out = tmp_path / "pq"
        _append(log, range(1, 31))
        _export(log, out, 30, file_rows=20)
        _append(log, range(31, 201))
        assert log.apply_retention() > 0 and log.oldest_csn > 31  # (31.. gone before they were exported)
        _export(log, out, 200, file_rows=20)
        ranges, _ = _read(out)
        gaps = [(a[1], b[0]) for a, b in itertools.pairwise(ranges) if a[1] != b[0]]
        assert gaps == [(30, log.oldest_csn - 1)] or ranges[0][0] == log.oldest_csn - 1


def test_names_sort_by_csn() -> None:
    assert file_name(0, 42) == "csn-00000000000000000000-00000000000000000042.parquet"
    assert parse_name(file_name(2**63, 2**64 - 1)) is not None and parse_name("x.parquet") is None


def test_serve_writes_the_parquet_copy_of_what_it_serves(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    subprocess.run(
        [*CSND, "generate", "--nodes", "2", "--transactions", "200", "--seed", "3", "--out", str(cluster)],
        check=True,
        capture_output=True,
    )
    expected = (cluster / "expected.jsonl").read_text().splitlines()
    last = json.loads(expected[-1])["csn"]
    out = tmp_path / "pq"
    served = start_serve(
        [str(cluster / "dn1.pgstream"), str(cluster / "dn2.pgstream")],
        str(tmp_path / "log"),
        "--parquet-dir",
        str(out),
    )
    try:
        wait_for(lambda: served.newest_csn() == last, "the cluster in the changelog")
    finally:
        code, err = served.terminate()  # (a stop writes what is pending)
    assert code == 0 and err == "", err
    ranges, rows = _read(out)
    assert ranges[-1][1] == last
    records = [(json.loads(t)["csn"], t.encode()) for t in expected]
    assert rows.equals(pa.Table.from_batches([flatten(records)]))


def test_a_failed_write_stops_the_export_with_one_error_naming_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "pq"
    failures: list[BaseException] = []
    with Changelog(str(tmp_path / "log")) as log:
        _append(log, range(1, 11))
        export = ParquetExport(log, str(out), file_rows=1, file_wait_s=0.05, on_failure=failures.append)
        out.rmdir()
        out.write_bytes(b"not a directory")  # (the next file cannot be written)
        export.start()
        wait_for(lambda: failures, "the export to fail", seconds=CEILING)
        export.stop()
    (e,) = failures
    assert export.error is e and str(out) in str(e) and "failed after csn 0" in str(e), e
    assert "restart exports on from the newest whole file" in str(e)
