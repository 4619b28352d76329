"""The cluster kit: distributed transactions/s on 3 local servers with 4 writers, and tick latency.

1. `csnd workload` (run_workload) on 3 fresh local servers, 4 writer
   processes, unlimited rate, GTM on dn1: committed distributed transactions
   a second over the run.
2. Tick latency on an idle server: a non-transactional `tick` emitted alone
   (PostgreSQL 15 does not flush it) against the flushed form the ticker
   uses (`writer.emit_flushed`), each timed from the emit call to the line's
   arrival at a logical replication client (pg_recvlogical, test_decoding,
   writing to a pipe), with the default wal_writer_delay (200 ms).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg

from csnd.gtm.liveload import LoadOptions, run_workload
from csnd.gtm.writer import emit, emit_flushed
from csnd.testing.cluster import start_cluster

SECONDS = 15.0
WRITERS = 4
LATENCY_SAMPLES = 20


def throughput(seconds: float = SECONDS, writers: int = WRITERS) -> dict[str, Any]:
    with start_cluster(3) as c:
        opts = LoadOptions(nodes=c.urls(), gtm=c.gtm_url, writers=writers, duration=seconds, progress=False)
        s = run_workload(opts)
    return {
        "writers": writers,
        "nodes": 3,
        "seconds": round(s.seconds, 2),
        "committed": s.committed,
        "transactions_per_s": round(s.per_second, 1),
        "rolled_back": s.rolled_back,
        "aborted_after_committing": s.failed,
        "errors": s.errors,
    }


def tick_latency(samples: int = LATENCY_SAMPLES) -> dict[str, Any]:
    with start_cluster(1) as c:
        server = c.servers[0]
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('lat', 'test_decoding')")
            cmd = [server.bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(server.port)]
            cmd += ["-U", "postgres", "-d", "postgres", "--slot", "lat", "--start", "-f", "-"]
            cmd += ["-F", "0", "-s", "1"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, bufsize=0)
            arrived: dict[str, float] = {}
            cond = threading.Condition()

            def read() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    text = line.decode(errors="replace")
                    if "content:tick " in text:
                        with cond:
                            arrived[text.rsplit(" ", 1)[1].strip()] = time.perf_counter()
                            cond.notify_all()

            threading.Thread(target=read, daemon=True).start()
            time.sleep(1.0)
            out: dict[str, Any] = {}
            n = 0
            try:
                for mode in ("unflushed", "flushed"):
                    lat = []
                    for _ in range(samples):
                        n += 1
                        key = str(n)
                        time.sleep(0.25)  # idle in between: nothing else flushes the WAL
                        t0 = time.perf_counter()
                        if mode == "flushed":
                            emit_flushed(conn, f"tick {key}")
                        else:
                            emit(conn, False, f"tick {key}")
                        with cond:
                            if not cond.wait_for(lambda k=key: k in arrived, timeout=10):  # type: ignore[misc]
                                raise RuntimeError(f"tick {key} never arrived")
                        lat.append((arrived[key] - t0) * 1000)
                    lat.sort()
                    out[mode] = {
                        "p50_ms": round(statistics.median(lat), 2),
                        "p90_ms": round(lat[int(len(lat) * 0.9) - 1], 2),
                        "max_ms": round(lat[-1], 2),
                    }
            finally:
                proc.terminate()
                proc.wait()
    return out


def main() -> dict[str, Any]:
    return {"throughput": throughput(), "tick_latency": tick_latency()}


if __name__ == "__main__":
    import json

    json.dump(main(), sys.stdout, indent=2)
    print()
