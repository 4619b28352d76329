"""Shared by the Spark tests: one local SparkSession per test session, a generated cluster's lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd.gtm import GenerateOptions
from tests.fixtures.generated import shared_cluster

# Large transactions (200+ changes) and some of every kind, as the gtm tests generate them.
OPTIONS = GenerateOptions(
    large_ratio=0.05, abort_ratio=0.15, large_txn_changes=200, ddl_every=60, truncate_every=70
)


def read_lines(path: Path) -> list[tuple[int, bytes]]:
    out = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw.rstrip(b"\n")
            out.append((json.loads(line)["csn"], line))
    return out


@pytest.fixture(scope="session")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated 3-node GTM cluster: dn1..dn3.pgstream and expected.jsonl (what csnd replay writes)."""
    return shared_cluster(tmp_path_factory, 3, 300, seed=11, binary=True, options=OPTIONS)


@pytest.fixture(scope="session")
def cluster_lines(cluster_dir: Path) -> list[tuple[int, bytes]]:
    """The cluster's transaction lines, by CSN."""
    return read_lines(cluster_dir / "expected.jsonl")


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    from csnd.consumers.spark.session import local_session

    session = local_session("csnd-tests")
    yield session
    session.stop()
