"""Reader benchmarks (issue: the reader).

* frames per second the reader parses from a recorded file (framing and
  pgoutput classification only), and the same file scanned into runs of raw
  change frames as `csnd replay` reads it (`ChangeFrames`: the workers parse
  the changes);
* live capture rate of `csnd record` compared with `pg_recvlogical` draining a
  twin pgoutput slot over the same WAL, as a ratio.
"""

from __future__ import annotations

import shutil
import sys
import time

import psycopg

from bench.common import best_of, out_path, pg_recvlogical_seconds
from csnd.core.ids import lsn_from_str
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.pgoutput import ChangeFrames
from csnd.reader.record_cmd import record
from csnd.reader.recorded import RecordedSource
from csnd.testing.pgserver import start_server

LIVE_ROWS = 200_000


def parse_rate(path: str) -> tuple[float, int]:
    def run() -> int:
        n = 0
        for _ in RecordedSource(path).events():
            n += 1
        return n

    secs, frames = best_of(3, run)
    return frames / secs, frames


def scan_rate(path: str) -> float:
    def run() -> int:
        n = 0
        for _, msg in RecordedSource(path).events(raw_changes=True):
            n += len(msg.lsns) if isinstance(msg, ChangeFrames) else 1
        return n

    secs, frames = best_of(3, run)
    return frames / secs


def live_capture() -> dict[str, float]:
    server = start_server()
    try:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(
                b"CREATE TABLE wide (id bigint PRIMARY KEY, n numeric(12,2), t timestamptz, s text, j jsonb)"
            )
            c.execute(b"CREATE PUBLICATION bench FOR ALL TABLES")
            for slot in ("ours1", "twin1", "ours2", "twin2"):
                c.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')".encode())
            # many small transactions plus some big ones (streamed)
            for start in range(0, LIVE_ROWS, 1000):
                c.execute(
                    b"INSERT INTO wide SELECT g, g * 1.5, now(), md5(g::text), jsonb_build_object('g', g) "
                    b"FROM generate_series(%s::bigint, %s::bigint) g",
                    (start, start + 999),
                )
            row = c.execute(b"SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        end = lsn_from_str(str(row[0]))
        # alternate the order (ours, twin, twin, ours) so a warm WAL cache favours neither
        ours_times: list[float] = []
        twin_times: list[float] = []
        transactions = 0

        def run_twin(slot: str) -> None:
            twin_times.append(pg_recvlogical_seconds(server, slot, "bench", end))

        def run_ours(slot: str) -> None:
            nonlocal transactions
            t0 = time.perf_counter()
            src = LiveSource("dn1", LiveOptions(server.url(), slot, "bench", until_lsn=end))
            transactions = record(src, out_path("live.pgstream"), progress=None).transactions
            ours_times.append(time.perf_counter() - t0)

        run_ours("ours1")
        run_twin("twin1")
        run_twin("twin2")
        run_ours("ours2")
        ours, twin = min(ours_times), min(twin_times)
        return {
            "rows": LIVE_ROWS,
            "transactions": transactions,
            "ours_s": ours,
            "pg_recvlogical_s": twin,
            "ours_rows_per_s": LIVE_ROWS / ours,
            "pg_recvlogical_rows_per_s": LIVE_ROWS / twin,
            "ratio": twin / ours,
        }
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


def main() -> dict[str, object]:
    live = live_capture()
    rate, frames = parse_rate(out_path("live.pgstream"))
    results = {
        "reader_parse_frames_per_s": rate,
        "reader_parse_frames": frames,
        "reader_scan_frames_per_s": scan_rate(out_path("live.pgstream")),
        "live": live,
    }
    print(results, file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
