"""Helpers shared by the benchmarks."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

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
