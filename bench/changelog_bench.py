"""Changelog benchmarks (the changelog's append rate with its fsync policy).

* append rate of 1 KiB and 200-byte records, group-committed (one sync() for
  every 1 ms worth of appended records, as `csnd serve` syncs what piled up
  while the last fsync ran) against one sync() per record: records/s, MB/s,
  and how many records each fsync carried;
* read rate of a reader starting in the middle of the log (index seek,
  then CRC-checked records to the end), best of three.

The log lives under bench-out/ (the real disk: a tmpfs fsync costs nothing).
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any

from bench.common import out_path
from csnd.changelog import Changelog

GROUP_BYTES = 128 << 20  # appended per size in the group-commit run
PER_RECORD_SECONDS = 3.0  # the sync-per-record run stops after this (or PER_RECORD_MAX records)
PER_RECORD_MAX = 20_000
GROUP_WINDOW_S = 0.001


def _line(size: int, csn: int) -> bytes:
    head = b'{"csn": %d, "gid": null, "changes": [' % csn
    return head + b"x" * (size - len(head) - 2) + b"]}"


def _fresh(name: str) -> str:
    d = out_path("changelog", name, "x")[:-2]
    shutil.rmtree(d, ignore_errors=True)
    return d


def group_commit(size: int) -> dict[str, Any]:
    d = _fresh(f"group-{size}")
    n = GROUP_BYTES // size
    lines = [_line(size, i) for i in range(1, 1001)]
    syncs = 0
    with Changelog(d) as log:
        now = time.perf_counter
        t0 = last_sync = now()
        for csn in range(1, n + 1):
            log.append(csn, lines[csn % 1000])
            t = now()
            if t - last_sync >= GROUP_WINDOW_S:
                log.sync()
                syncs += 1
                last_sync = now()
        log.sync()
        syncs += 1
        secs = now() - t0
        read = read_from_middle(log, n, size)
    shutil.rmtree(d, ignore_errors=True)
    return {
        "records": n,
        "seconds": secs,
        "records_per_s": n / secs,
        "mb_per_s": n * size / secs / 1e6,
        "syncs": syncs,
        "records_per_sync": n / syncs,
        "read": read,
    }


def sync_per_record(size: int) -> dict[str, Any]:
    d = _fresh(f"each-{size}")
    line = _line(size, 0)
    n = 0
    with Changelog(d) as log:
        t0 = time.perf_counter()
        while n < PER_RECORD_MAX and time.perf_counter() - t0 < PER_RECORD_SECONDS:
            n += 1
            log.append(n, line)
            log.sync()
        secs = time.perf_counter() - t0
    shutil.rmtree(d, ignore_errors=True)
    return {"records": n, "seconds": secs, "records_per_s": n / secs, "mb_per_s": n * size / secs / 1e6}


def read_from_middle(log: Changelog, n: int, size: int) -> dict[str, Any]:
    best = float("inf")
    count = 0
    for _ in range(3):
        t0 = time.perf_counter()
        count = sum(1 for _ in log.read(n // 2))
        best = min(best, time.perf_counter() - t0)
    return {
        "records": count,
        "seconds": best,
        "records_per_s": count / best,
        "mb_per_s": count * size / best / 1e6,
    }


def main() -> dict[str, Any]:
    results: dict[str, Any] = {}
    for size in (1024, 200):
        print(f"bench: changelog, {size}-byte records ...", file=sys.stderr)
        results[f"group_{size}"] = group_commit(size)
        results[f"each_{size}"] = sync_per_record(size)
    return results


def table(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for size in (1024, 200):
        g, e = r[f"group_{size}"], r[f"each_{size}"]
        rows.append(
            (
                f"changelog append, {size}-byte records, a sync per 1 ms of records (group commit)",
                f"{g['records_per_s']:,.0f} records/s, {g['mb_per_s']:,.1f} MB/s "
                f"({g['records_per_sync']:,.0f} records per fsync)",
            )
        )
        rows.append(
            (
                f"changelog append, {size}-byte records, a sync per record",
                f"{e['records_per_s']:,.0f} records/s, {e['mb_per_s']:,.2f} MB/s",
            )
        )
        rows.append(
            (
                f"changelog read from the middle, {size}-byte records",
                f"{g['read']['records_per_s']:,.0f} records/s, {g['read']['mb_per_s']:,.1f} MB/s",
            )
        )
    return rows


if __name__ == "__main__":
    res = main()
    print("| benchmark | result |")
    print("| --- | --- |")
    for name, value in table(res):
        print(f"| {name} | {value} |")
