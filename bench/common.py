"""Helpers shared by the benchmarks."""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from csnd.core.ids import lsn_to_str
from csnd.testing.pgserver import PgServer

OUT_DIR = os.environ.get("CSND_BENCH_DIR", "bench-out")
T = TypeVar("T")


def out_path(*parts: str) -> str:
    path = os.path.join(OUT_DIR, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def best_of(n: int, fn: Callable[[], T]) -> tuple[float, T]:
    """The fastest of n runs (the least disturbed by other load) and its result."""
    best = float("inf")
    result: T | None = None
    for _ in range(n):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return best, result


@contextmanager
def timed() -> Iterator[list[float]]:
    box: list[float] = []
    t0 = time.perf_counter()
    yield box
    box.append(time.perf_counter() - t0)


def children_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def pg_recvlogical_command(server: PgServer, slot: str, publication: str) -> list[str]:
    """`pg_recvlogical` streaming pgoutput slot `slot` with csnd's own options (protocol 2, binary, streaming)."""
    cmd = [server.bin("pg_recvlogical"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres"]
    cmd += ["-d", "postgres", "--slot", slot, "--start", "--no-loop", "-o", "proto_version=2"]
    return [*cmd, "-o", f"publication_names={publication}", "-o", "binary=true", "-o", "streaming=on"]


def pg_recvlogical_seconds(server: PgServer, slot: str, publication: str, end_lsn: int) -> float:
    """How long `pg_recvlogical` takes to drain pgoutput slot `slot` up to `end_lsn`: one walsender's pace.

    The options are csnd's own (protocol 2, binary, streaming), and the
    output goes to /dev/null, so this is what the walsender can send.
    """
    cmd = [*pg_recvlogical_command(server, slot, publication), "-E", lsn_to_str(end_lsn), "-f", "/dev/null"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0
