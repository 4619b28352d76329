"""`make bench`: every benchmark in one run, printed as the README's table.

Ratios (live capture vs pg_recvlogical, 2 decoders vs 1) are measured inside
this one run, so the noise of this shared machine mostly cancels; absolute
rates are what this run saw.  Raw figures go to bench-out/results.json.

`python -m bench NAME [options]` runs one of the benchmarks kept out of that
run (`BY_NAME`: they take many minutes and print a table of their own):
`load`, the service's memory and latency under slow, stopped and many
subscribers, a 1 GB transaction and an idle node (bench/load_bench.py);
`drain`, a backlog drained by `csnd serve` and by `pg_recvlogical` over the
same WAL, steady rates and CPU per transaction of every process
(bench/drain_bench.py); `feed`, the changefeed alone serving a changelog to
`csnd subscribe`, CPU per transaction (bench/feed_bench.py); `hotpath`, a
live node's reader, decoder pool and sender over canned frames, with no
server, CPU per transaction (bench/hotpath_bench.py); `latency`, commit to
consumer latency of `csnd serve` -> `csnd subscribe` and of `pg_recvlogical`
on the same pgbench load at the same time, 100 to 10,000 transactions/s
(bench/latency_bench.py); `types`, decoder CPU per change by column type,
the compiled row reader against its Python twin, and two decoders against
one over wide rows of such types (bench/types_bench.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from bench import (
    bigtxn_bench,
    changelog_bench,
    decode_bench,
    drain_bench,
    feed_bench,
    gtm_bench,
    hotpath_bench,
    latency_bench,
    load_bench,
    merge_bench,
    reader_bench,
    serve_bench,
    types_bench,
)
from bench.common import out_path

BIG_TXN_MB = 1024
# Run alone by name, each with its own options and table.
BY_NAME: dict[str, Callable[[list[str]], Any]] = {
    "load": load_bench.main,
    "drain": drain_bench.main,
    "feed": feed_bench.main,
    "hotpath": hotpath_bench.main,
    "latency": latency_bench.main,
    "types": types_bench.main,
}


def _f(x: Any, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def table(r: dict[str, Any]) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    rd = r["reader"]
    live = rd["live"]
    rows.append(("reader: parse a recorded file", f"{_f(rd['reader_parse_frames_per_s'])} frames/s"))
    rows.append(
        (
            "reader: scan the same file into runs of raw change frames (`csnd replay`'s path)",
            f"{_f(rd['reader_scan_frames_per_s'])} frames/s",
        )
    )
    rows.append(
        (
            "reader: live capture (`csnd record`) vs `pg_recvlogical`, same WAL",
            f"{_f(live['ours_rows_per_s'])} vs {_f(live['pg_recvlogical_rows_per_s'])} rows/s "
            f"(ratio {live['ratio']:.2f})",
        )
    )
    d = r["decode"]
    rows.append(
        (
            f"`csnd replay`, {d['rows']:,} wide rows, `--decoders 1` (best of {d['rounds']})",
            f"{_f(d['decoders_1']['rows_per_s'])} rows/s",
        )
    )
    rows.append(
        (
            f"`csnd replay`, {d['rows']:,} wide rows, `--decoders 2` (best of {d['rounds']})",
            f"{_f(d['decoders_2']['rows_per_s'])} rows/s (speedup {d['speedup']:.2f}x best against best; "
            f"median of rounds {d['speedup_median_of_rounds']:.2f}x: "
            f"{' / '.join(f'{x:.2f}' for x in d['speedup_by_round'])})",
        )
    )
    rows.append(
        (
            "this machine's own 2-process ratio for a pure CPU loop, beside each of those rounds",
            f"median {d['machine_ratio_median']:.2f}x: {' / '.join(f'{x:.2f}' for x in d['machine_ratio_by_round'])} "
            f"(decoder speedup over it, median of rounds: {d['efficiency_median']:.2f})",
        )
    )
    rows.append(
        (
            "`csnd replay --decoders 2` of a stream with no rows (start-up and shutdown, in every replay figure)",
            f"{d['startup_s']:.2f} s",
        )
    )
    st = d["small_transactions"]
    rows.append(
        (
            f"`csnd replay`, {st['transactions']:,} one-row transactions, `--decoders 2` (best of 3)",
            f"{_f(st['transactions_per_s'])} transactions/s",
        )
    )
    ins = d.get("instructions")
    if ins:
        rows.append(
            (
                "instructions per wide row (valgrind, noise-free): main process / decoders",
                f"{_f(ins['main_per_row'])} / {_f(ins['worker_per_row'])}: two dedicated cores "
                f"allow 2W/(W+M) = {ins['two_core_bound']:.2f}x",
            )
        )
    w = d["walsender"]
    rows.append(
        (
            f"one walsender sending {w['rows']:,} wide rows of the same shape (`pg_recvlogical`, binary pgoutput)",
            f"{_f(w['rows_per_s'])} rows/s (`--decoders 2` best: "
            f"{d['decoders_2']['rows_per_s'] / w['rows_per_s']:.2f}x of it)",
        )
    )
    b = r["bigtxn"]
    rows.append(
        (
            f"`csnd replay` of one {b['txn_mb']:.0f} MB transaction: peak RSS",
            f"{b['peak_rss_mb']:.0f} MB (all processes: {b['peak_rss_all_mb']:.0f} MB)"
            if "peak_rss_all_mb" in b
            else f"{b['peak_rss_mb']:.0f} MB",
        )
    )
    m = r["merge"]
    for n in (1, 2, 3):
        rows.append(
            (
                f"`csnd replay`, generated {n}-node cluster",
                f"{_f(m[f'replay_{n}']['changes_per_s'])} changes/s",
            )
        )
    rows.append(
        (
            "merge alone (`CsnMerge`), per transaction, 1 / 2 / 3 nodes",
            " / ".join(f"{m[f'merge_only_{n}']['us_per_txn']:.1f}" for n in (1, 2, 3)) + " µs",
        )
    )
    if "changelog" in r:
        rows.extend(changelog_bench.table(r["changelog"]))
    g = r.get("gtm")
    if g:
        tp = g["throughput"]
        rows.append(
            (
                f"`csnd workload`: distributed transactions, {tp['nodes']} local servers, {tp['writers']} writer "
                "processes, shared GTM",
                f"{_f(tp['transactions_per_s'])} transactions/s",
            )
        )
        lat = g["tick_latency"]
        rows.append(
            (
                "`tick` emit to a logical replication client, idle server: alone / in a flushing transaction",
                f"p50 {lat['unflushed']['p50_ms']:.0f} ms / {lat['flushed']['p50_ms']:.1f} ms",
            )
        )
    if "serve" in r:
        rows.extend(serve_bench.table(r["serve"]))
    return rows


def main() -> None:
    results: dict[str, Any] = {}
    print("bench: reader ...", file=sys.stderr)
    results["reader"] = reader_bench.main()
    print("bench: decoding ...", file=sys.stderr)
    results["decode"] = decode_bench.main()
    print("bench: merge ...", file=sys.stderr)
    results["merge"] = merge_bench.main()
    print(f"bench: one {BIG_TXN_MB} MB transaction ...", file=sys.stderr)
    results["bigtxn"] = bigtxn_bench.run(BIG_TXN_MB)
    print("bench: changelog ...", file=sys.stderr)
    results["changelog"] = changelog_bench.main()
    print("bench: cluster kit (3 servers, 4 writers) ...", file=sys.stderr)
    results["gtm"] = gtm_bench.main()
    print("bench: the service end to end ...", file=sys.stderr)
    results["serve"] = serve_bench.main()
    with open(out_path("results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2, default=str)
    print("| benchmark | result |")
    print("| --- | --- |")
    for name, value in table(results):
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        if sys.argv[1] not in BY_NAME:
            raise SystemExit(f"python -m bench: no benchmark {sys.argv[1]!r}; one of {', '.join(BY_NAME)}")
        BY_NAME[sys.argv[1]](sys.argv[2:])
    else:
        main()
