"""Generated clusters shared by the gtm tests (generation is deterministic, so once per session)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from csnd.gtm import GenerateOptions, GenerateSummary, generate_cluster

# Enough large and failing txns that every feature shows up with this seed.
OPTIONS = GenerateOptions(
    large_ratio=0.05, abort_ratio=0.15, large_txn_changes=200, ddl_every=60, truncate_every=70
)
SEED = 7


@dataclass
class Cluster:
    dir: Path
    summary: GenerateSummary

    @property
    def expected(self) -> Path:
        return self.dir / "expected.jsonl"

    def streams(self) -> list[Path]:
        return [Path(p) for p in self.summary.files]


@pytest.fixture(scope="session")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    d = tmp_path_factory.mktemp("k3bin")
    return Cluster(d, generate_cluster(d, 3, 400, seed=SEED, binary=True, options=OPTIONS))


@pytest.fixture(scope="session")
def cluster3_text(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    d = tmp_path_factory.mktemp("k3text")
    return Cluster(d, generate_cluster(d, 3, 400, seed=SEED, binary=False, options=OPTIONS))


@pytest.fixture(scope="session")
def cluster1(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    d = tmp_path_factory.mktemp("k1")
    return Cluster(d, generate_cluster(d, 1, 150, seed=3, binary=True, options=OPTIONS))
