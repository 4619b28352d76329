"""Initial snapshot benchmark: csnd's copy against one `COPY ... TO STDOUT` and `pg_dump -j 2`, in one run.

Starts a throwaway PostgreSQL server (the Debian 15 default) and, for two
shapes -- one big table of `rows` rows, and four tables of a quarter of that
each -- times, `rounds` times in alternation:

- `COPY (SELECT * FROM t) TO STDOUT` of each table, one after the other, by
  the server's own `psql` into /dev/null: the baseline, "a single COPY's rate";
- `pg_dump --data-only -j 2 -Fd` of the same tables (the server's own binary);
- csnd's initial snapshot with the service's code and default settings
  (`csnd.snapshot`): a new slot with an exported snapshot, its tables copied
  into a fresh changelog, from the first query to the completion record's
  fsync (the slot's creation is not timed, nor is pg_dump's own snapshot's).

and prints each round's rates and the ratios to COPY's rate in that round
(the machine is shared: the spread of the rounds is the figure to trust),
with the CPU seconds each spent on the server (its backends) and in the
client's processes (psql; pg_dump and its workers; csnd's own process and
its copier processes): on a loaded machine the wall-clock ratio moves with
the load, the CPU it takes does not, and the two cores bound the wall
clock to at least half the CPU.
The table is an int key, text, numeric, timestamptz and jsonb.
`--sweep` adds the (chunk_rows, readers) settings that CHUNK_ROWS and
READERS were chosen by.

    python -m bench.snapshot_bench [rows] [--rounds N] [--sweep] [--copiers threads|processes ...] [--split key|ctid]

`--copiers` and `--split` time csnd again with that setting in each round,
beside its defaults (`run["variants"]`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
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
from csnd.testing.pgserver import PgServer, start_server

SWEEP = [(2_000, 1), (10_000, 1), (10_000, 3), (50_000, 3), (10_000, 6)]
_TABLE = "(id int PRIMARY KEY, owner text, balance numeric(12,2), at timestamptz, doc jsonb)"


def _fill(dsn: str, tables: list[str], rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for t in tables:
            conn.execute(f"CREATE TABLE {t} {_TABLE}")
            conn.execute(
                f"INSERT INTO {t} SELECT i, 'owner ' || i, i * 1.25, now(), jsonb_build_object('k', i) "
                f"FROM generate_series(1, {int(rows)}) AS i"
            )
            conn.execute(f"VACUUM ANALYZE {t}")
        conn.execute(f"CREATE PUBLICATION pub_{tables[0]} FOR TABLE {', '.join(tables)}")


_TICKS = os.sysconf("SC_CLK_TCK")


def _tree_cpu(pid: int) -> float:
    """CPU seconds of process `pid`, its reaped children and, recursively, its live ones."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except (OSError, ValueError):
        return 0.0  # (ended meanwhile: its time is in its parent's reaped children)
    own = sum(int(v) for v in fields[11:15]) / _TICKS  # utime, stime, cutime, cstime
    return own + sum(_tree_cpu(c) for c in children)


def _server_cpu(server: PgServer) -> float:
    with open(os.path.join(server.data_dir, "postmaster.pid")) as f:
        return _tree_cpu(int(f.readline()))


class _Cpu:
    """CPU seconds spent while it is open: the server's, and this process's with its descendants'."""

    def __init__(self, server: PgServer) -> None:
        self.server = server

    def __enter__(self) -> _Cpu:
        self._server0, self._client0 = _server_cpu(self.server), _tree_cpu(os.getpid())
        return self

    def __exit__(self, *exc: object) -> None:
        self.server_s = _server_cpu(self.server) - self._server0
        self.client_s = _tree_cpu(os.getpid()) - self._client0


def _copy_seconds(server: PgServer, dbname: str, tables: list[str]) -> float:
    script = "".join(f"COPY (SELECT * FROM {t}) TO STDOUT;\n" for t in tables)
    t0 = time.perf_counter()
    subprocess.run(
        [server.bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", server.dsn(dbname)],
        input=script.encode(),
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return time.perf_counter() - t0


def _pg_dump_seconds(server: PgServer, dbname: str, tables: list[str]) -> float:
    out = tempfile.mkdtemp(prefix="csnd-snapbench-dump-")
    shutil.rmtree(out)  # (pg_dump -Fd makes the directory itself)
    args = [
        server.bin("pg_dump"),
        "--data-only",
        "-j",
        "2",
        "-Fd",
        "-Z",
        "0",
        "-f",
        out,
        "-d",
        server.dsn(dbname),
    ]
    try:
        t0 = time.perf_counter()
        subprocess.run([*args, *(f"--table={t}" for t in tables)], check=True)
        return time.perf_counter() - t0
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _csnd_seconds(
    dsn: str, publication: str, slot: str, settings: SnapshotSettings, cpu: _Cpu | None = None
) -> float:
    source = LiveSource("dn1", LiveOptions(dsn, slot, publication, create_slot=True))
    exported = source.prepare("initial")
    assert exported is not None
    reader = NodeSnapshot(
        "dn1", dsn, publication, exported.consistent_lsn, binary=True, enums=[], settings=settings
    )
    try:
        reader.open(exported.name)
    finally:
        exported.release()
    directory = tempfile.mkdtemp(prefix="csnd-snapbench-")
    try:
        with Changelog(directory) as log, cpu or contextlib.nullcontext():  # (timed as the wall clock is)
            t0 = time.perf_counter()
            SnapshotRun([SnapshotNode(reader, "single", exported.made_at)], SnapshotProgress()).run(log)
            return time.perf_counter() - t0
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def _shape(
    server: PgServer,
    name: str,
    tables: list[str],
    rows: int,
    rounds: int,
    variants: tuple[tuple[str, SnapshotSettings], ...] = (),
) -> dict[str, Any]:
    dsn = server.dsn()
    _fill(dsn, tables, rows)
    total = rows * len(tables)
    runs = []
    for r in range(rounds):
        with _Cpu(server) as copy_cpu:
            copy_s = _copy_seconds(server, "postgres", tables)
        with _Cpu(server) as dump_cpu:
            dump_s = _pg_dump_seconds(server, "postgres", tables)
        csnd_cpu = _Cpu(server)
        csnd_s = _csnd_seconds(
            dsn, f"pub_{tables[0]}", f"bench_{tables[0]}_{r}", SnapshotSettings(), csnd_cpu
        )
        others: dict[str, Any] = {}
        for v, (label, settings) in enumerate(variants):  # (the same snapshot set otherwise, same round)
            kind_cpu = _Cpu(server)
            kind_s = _csnd_seconds(
                dsn,
                f"pub_{tables[0]}",
                f"bench_{tables[0]}_{r}_{v}",
                settings,
                kind_cpu,
            )
            others[label] = {
                "csnd_s": round(kind_s, 3),
                "csnd_vs_copy": round(copy_s / kind_s, 3),
                "cpu_s": [round(kind_cpu.server_s, 3), round(kind_cpu.client_s, 3)],
            }
        run: dict[str, Any] = {
            "copy_s": round(copy_s, 3),
            "pg_dump_s": round(dump_s, 3),
            "csnd_s": round(csnd_s, 3),
            "csnd_vs_copy": round(copy_s / csnd_s, 3),
            "pg_dump_vs_copy": round(copy_s / dump_s, 3),
            "load": round(os.getloadavg()[0], 1),
            # CPU seconds (server, client) of each: what the wall clock cannot go below half of on 2 cores
            "cpu_s": {
                "copy": [round(copy_cpu.server_s, 3), round(copy_cpu.client_s, 3)],
                "pg_dump": [round(dump_cpu.server_s, 3), round(dump_cpu.client_s, 3)],
                "csnd": [round(csnd_cpu.server_s, 3), round(csnd_cpu.client_s, 3)],
            },
        }
        if others:
            run["variants"] = others
        runs.append(run)
        print(
            f"{name} round {r + 1}: COPY {total / copy_s:>10,.0f} rows/s, pg_dump -j 2 {total / dump_s:>10,.0f}, "
            f"csnd {total / csnd_s:>10,.0f}  (csnd/COPY {run['csnd_vs_copy']:.2f}, "
            f"pg_dump/COPY {run['pg_dump_vs_copy']:.2f}), load {run['load']}\n"
            f"    cpu s (server + client): COPY {copy_cpu.server_s:.2f} + {copy_cpu.client_s:.2f}, "
            f"pg_dump {dump_cpu.server_s:.2f} + {dump_cpu.client_s:.2f}, "
            f"csnd {csnd_cpu.server_s:.2f} + {csnd_cpu.client_s:.2f}",
            flush=True,
        )
        for label, c in others.items():
            print(
                f"    {label}: csnd {total / c['csnd_s']:>10,.0f} rows/s (csnd/COPY {c['csnd_vs_copy']:.2f}), "
                f"cpu s {c['cpu_s'][0]:.2f} + {c['cpu_s'][1]:.2f}",
                flush=True,
            )
    ratios = [x["csnd_vs_copy"] for x in runs]
    dumps = [x["pg_dump_vs_copy"] for x in runs]
    summary = {
        "tables": len(tables),
        "rows": total,
        "runs": runs,
        "csnd_vs_copy": {"min": min(ratios), "median": statistics.median(ratios), "max": max(ratios)},
        "pg_dump_vs_copy": {"min": min(dumps), "median": statistics.median(dumps), "max": max(dumps)},
    }
    print(
        f"{name}: csnd/COPY median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), "
        f"pg_dump -j 2/COPY median {statistics.median(dumps):.2f} ({min(dumps):.2f}-{max(dumps):.2f})",
        flush=True,
    )
    return summary


def _sweep(server: PgServer, rows: int) -> list[dict[str, Any]]:
    dsn = server.dsn()
    _fill(dsn, ["sweep"], rows)
    results = []
    for i, (chunk_rows, readers) in enumerate(SWEEP):
        seconds = _csnd_seconds(dsn, "pub_sweep", f"bench_sweep_{i}", SnapshotSettings(chunk_rows, readers))
        results.append({"chunk_rows": chunk_rows, "readers": readers, "rows_per_s": round(rows / seconds)})
        print(f"chunk_rows {chunk_rows:>6,} readers {readers}: {rows / seconds:>10,.0f} rows/s", flush=True)
    return results


def run(
    rows: int = 200_000,
    rounds: int = 5,
    sweep: bool = False,
    variants: tuple[tuple[str, SnapshotSettings], ...] = (),
) -> dict[str, Any]:
    server = start_server()
    try:
        result: dict[str, Any] = {
            "one_table": _shape(server, "one table", ["big"], rows, rounds, variants),
            "four_tables": _shape(
                server, "four tables", [f"part{i}" for i in range(4)], rows // 4, rounds, variants
            ),
        }
        if sweep:
            result["sweep"] = _sweep(server, rows)
        return result
    finally:
        server.stop("immediate")
        shutil.rmtree(server.base_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("rows", nargs="?", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument(
        "--copiers",
        action="append",
        choices=("threads", "processes"),
        default=[],
        help="also time the snapshot with its copiers run so, in each round (repeatable)",
    )
    parser.add_argument(
        "--split",
        choices=("ctid", "key"),
        help="also time the snapshot with its tables cut so, in each round",
    )
    options = parser.parse_args()
    variants = [(f"copiers {kind}", SnapshotSettings(copiers=kind)) for kind in options.copiers]
    if options.split:
        variants.append((f"split {options.split}", SnapshotSettings(split=options.split)))
    result = run(options.rows, options.rounds, options.sweep, tuple(variants))
    with open(out_path("snapshot.json"), "w") as f:
        json.dump(result, f, indent=2)
