"""pgoutput protocol v2 (`streaming 'on'`) against v4 (`streaming 'parallel'`) on PostgreSQL 16+.

`python -m bench.protocol_bench [--version 18] [--txns N] [--rows R] [--repeat K]`

PostgreSQL 16 added protocol version 4 and `streaming 'parallel'`, made for
a subscriber that applies streamed transactions in parallel workers: with
it the walsender adds the abort's LSN and time to each Stream Abort.  Does
it pay for csnd, which decodes in parallel but delivers in commit order?

Two slots over the same WAL: big transactions from two sessions at once,
each larger than `logical_decoding_work_mem` (so the server streams them in
chunks while they are in progress), one in three rolled back, plus
subtransactions rolled back inside committed ones.  Each slot is drained
over a replication connection with one option set, reading the raw CopyData
(no parse: what differs is the server's work and the wire), until the WAL
end.  Figures, best of `--repeat`: wall seconds to drain, bytes and frames
received, Stream Start/Stop/Commit/Abort counts (each set drained first in
every other round), and whether streamed chunks
of concurrent transactions interleave (they do in both: the reader must
keep each chunk's changes apart by xid whatever the protocol).  Prints a
table and writes bench-out/protocol.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import select
import shutil
import struct
import sys
import threading
import time
from collections import Counter
from typing import Any

import psycopg
from psycopg import pq

from bench.common import out_path
from csnd.core.ids import lsn_from_str
from csnd.testing.pgserver import start_server

OPTION_SETS = {
    "v2 streaming on": {"proto_version": "2", "streaming": "on"},
    "v4 streaming parallel": {"proto_version": "4", "streaming": "parallel"},
}


def _load(dsn: str, txns: int, rows: int) -> None:
    """Big transactions from two sessions at once: each streams in chunks that interleave with the other's."""

    def session(k: int) -> None:
        with psycopg.connect(dsn) as conn:
            for i in range(txns):
                base = (k * txns + i) * rows * 2
                with conn.cursor() as cur:
                    cur.execute(
                        "INSERT INTO big SELECT g, repeat('x', 200) FROM generate_series(%s::int8, %s::int8) g",
                        (base, base + rows // 2 - 1),
                    )
                    cur.execute("SAVEPOINT s")
                    cur.execute(
                        "INSERT INTO big SELECT g, 'sub' FROM generate_series(%s::int8, %s::int8) g",
                        (base + rows, base + rows + rows // 4),
                    )
                    cur.execute("ROLLBACK TO SAVEPOINT s")
                    cur.execute(
                        "INSERT INTO big SELECT g, repeat('y', 200) FROM generate_series(%s::int8, %s::int8) g",
                        (base + rows // 2, base + rows - 1),
                    )
                if i % 3 == 2:
                    conn.rollback()
                else:
                    conn.commit()

    failed: list[BaseException] = []

    def run(k: int) -> None:
        try:
            session(k)
        except BaseException as e:  # (re-raised below, in the main thread)
            failed.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def _drain(dsn: str, slot: str, options: dict[str, str], end: int) -> dict[str, Any]:
    """START_REPLICATION with `options`; read CopyData until the server's WAL end passes `end`."""
    conn = psycopg.connect(dsn, replication="database", autocommit=True)
    pgconn = conn.pgconn
    opts = {"publication_names": '"bench"', "binary": "true", "messages": "true", **options}
    opt_sql = ", ".join(f"{k} '{v}'" for k, v in opts.items())
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    res = pgconn.exec_(f'START_REPLICATION SLOT "{slot}" LOGICAL 0/0 ({opt_sql})'.encode())
    assert res.status == pq.ExecStatus.COPY_BOTH, res.error_message
    nbytes = frames = 0
    kinds: Counter[str] = Counter()
    stream_xids: list[int] = []
    wal_end = 0
    while wal_end < end:
        n, data = pgconn.get_copy_data(1)
        if n == 0:
            select.select([pgconn.socket], [], [], 1.0)
            pgconn.consume_input()
            continue
        assert n > 0, pgconn.error_message
        payload = bytes(data)
        nbytes += len(payload)
        frames += 1
        if payload[0] == 0x6B:  # keepalive: walEnd, and a reply if asked
            wal_end = max(wal_end, struct.unpack_from("!Q", payload, 1)[0])
            if payload[17]:
                status = struct.pack("!cQQQqB", b"r", wal_end, wal_end, wal_end, 0, 0)
                pgconn.put_copy_data(status)
                pgconn.flush()
            continue
        wal_end = max(wal_end, struct.unpack_from("!Q", payload, 9)[0])
        tag = chr(payload[25])
        kinds[tag] += 1
        if tag == "S":
            stream_xids.append(struct.unpack_from("!I", payload, 26)[0])
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    conn.close()
    switches = sum(1 for a, b in itertools.pairwise(stream_xids) if a != b)
    return {
        "seconds": seconds,
        "reader_cpu_s": cpu,
        "bytes": nbytes,
        "frames": frames,
        "stream_starts": kinds["S"],
        "stream_commits": kinds["c"],
        "stream_aborts": kinds["A"],
        "stream_xid_switches": switches,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.protocol_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", type=int, default=18, help="PostgreSQL major version (16+; default 18)")
    ap.add_argument("--txns", type=int, default=12, help="big transactions per session (default 12)")
    ap.add_argument("--rows", type=int, default=20_000, help="rows per transaction (default 20,000)")
    ap.add_argument("--repeat", type=int, default=3, help="drains of each slot; the best counts (default 3)")
    args = ap.parse_args(argv)
    server = start_server(version=args.version)
    out: dict[str, Any] = {"version": args.version, "txns": 2 * args.txns, "rows": args.rows}
    try:
        dsn = server.dsn()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("ALTER SYSTEM SET logical_decoding_work_mem = '1MB'")
            c.execute("SELECT pg_reload_conf()")
            c.execute("CREATE TABLE big (id bigint PRIMARY KEY, v text)")
            c.execute("CREATE PUBLICATION bench FOR ALL TABLES")
            for name in OPTION_SETS:
                for k in range(args.repeat):
                    c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (_slot(name, k),))
        _load(dsn, args.txns, args.rows)
        with psycopg.connect(dsn, autocommit=True) as c:
            end = lsn_from_str(str(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]))  # type: ignore[index]
        for k in range(args.repeat):
            # (each set goes first in every other round: the one drained second finds the WAL warm)
            order = list(OPTION_SETS.items())
            for name, options in order if k % 2 == 0 else order[::-1]:
                got = _drain(dsn, _slot(name, k), options, end)
                best = out.get(name)
                if best is None or got["seconds"] < best["seconds"]:
                    out[name] = got
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)
    print(
        f"PostgreSQL {args.version}: {2 * args.txns} transactions of {args.rows} rows, two sessions at once"
    )
    cols = [
        "seconds",
        "reader_cpu_s",
        "bytes",
        "frames",
        "stream_starts",
        "stream_commits",
        "stream_aborts",
        "stream_xid_switches",
    ]
    print(f"{'':24}" + "".join(f"{c:>20}" for c in cols))
    for name in OPTION_SETS:
        row = out[name]
        print(
            f"{name:24}"
            + "".join(f"{row[c]:>20.3f}" if isinstance(row[c], float) else f"{row[c]:>20}" for c in cols)
        )
    with open(out_path("protocol.json"), "w") as f:
        json.dump(out, f, indent=2)
    return out


def _slot(name: str, k: int) -> str:
    return f"{name.split()[0]}_{k}"


if __name__ == "__main__":
    main(sys.argv[1:])
