"""The changefeed alone: CPU per transaction to serve a changelog to `csnd subscribe`.

    python -m bench feed [--transactions N]

Fills a changelog with N one-row transaction lines (as the service writes
them), serves it in this process (`start_changefeed`) and runs `csnd
subscribe --limit N` against it.  Reported: the serving process's CPU
(`time.process_time`, every thread) and the subscriber's (its rusage) per
transaction, and the wall-clock rate.  CPU, unlike the rate, holds up on a
busy machine.  No PostgreSQL: this is the part of `csnd serve` after the
changelog.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.common import out_path
from csnd.changelog import Changelog
from csnd.service import start_changefeed

# A one-row transaction line of the usual shape (about 300 bytes).
LINE = (
    '{"csn": %d, "gid": null, "commit_time": "2026-11-22T10:00:00.123456+00:00", '
    '"nodes": {"dn1": {"xid": 745, "commit_lsn": "0/16B3748"}}, "changes": [{"node": "dn1", "cid": 0, '
    '"lsn": "0/16B3600", "op": "insert", "schema": "public", "table": "acct", "key": ["id"], '
    '"old": null, "new": {"id": 7, "owner": "ann", "balance": "10.50", "note": "%s"}}]}'
)


def run(transactions: int) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="csnd-feed-bench-")
    try:
        with Changelog(work) as log:
            for csn in range(1, transactions + 1):
                log.append(csn, (LINE % (csn, "x" * 40)).encode())
                if csn % 10_000 == 0:
                    log.sync()
            log.sync()
            srv = start_changefeed(log)
            try:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu0, t0 = time.process_time(), time.perf_counter()
                cmd = [
                    sys.executable,
                    "-m",
                    "csnd.cli",
                    "subscribe",
                    srv.address,
                    "--limit",
                    str(transactions),
                ]
                subprocess.run(cmd, stdout=subprocess.DEVNULL, check=True, timeout=1800)
                wall, served = time.perf_counter() - t0, time.process_time() - cpu0
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
            finally:
                srv.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sub = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "transactions": transactions,
        "wall_s": wall,
        "transactions_per_s": transactions / wall,
        "serve_cpu_us": 1e6 * served / transactions,
        "subscriber_cpu_us": 1e6 * sub / transactions,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench feed", description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", type=int, default=100_000, metavar="N")
    r = run(p.parse_args(sys.argv[1:] if argv is None else argv).transactions)
    with open(out_path("feed.json"), "w", encoding="utf-8") as f:
        json.dump(r, f, indent=2)
    print(
        f"| changefeed alone, {r['transactions']:,} one-row transactions to `csnd subscribe`: CPU per "
        f"transaction, serving / subscriber (start-up included) | {r['serve_cpu_us']:.1f} / "
        f"{r['subscriber_cpu_us']:.1f} us ({r['transactions_per_s']:,.0f} transactions/s) |"
    )
    return r


if __name__ == "__main__":
    main()
