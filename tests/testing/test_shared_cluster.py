"""tests/fixtures/generated.py: a shared generated cluster is what a generate_cluster of one's own writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from csnd.gtm import generate_cluster
from tests.fixtures.generated import shared_cluster


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_shared_cluster_is_made_once_per_key_and_equals_a_fresh_one(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    first = shared_cluster(tmp_path_factory, 2, 30, seed=5, binary=False)
    again = shared_cluster(tmp_path_factory, 2, 30, seed=5, binary=False)
    other = shared_cluster(tmp_path_factory, 2, 30, seed=6, binary=False)
    assert again == first and other != first
    generate_cluster(tmp_path, 2, 30, seed=5, binary=False)
    assert _files(first) == _files(tmp_path)
    assert sorted(_files(first)) == ["dn1.pgstream", "dn2.pgstream", "expected.jsonl"]
    assert _files(other) != _files(first)
