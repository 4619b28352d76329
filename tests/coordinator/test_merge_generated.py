"""The merge reproduces the synthetic cluster's expected.jsonl byte for byte.

`gtm.generate_cluster` writes, beside the node streams, the global stream the
whole pipeline must produce.  Here it is cut back into per-node transactions
(as node senders would release them), fed to the merge in several
interleavings with valid watermarks, and the merged JSON lines compared with
the file.  With one batch per node and cid -- the replay's cut for ordinary
statements -- the order is exactly the generator's (node order inside a cid)
however the nodes interleave; with many small batches, only the order inside
one cid across nodes may differ (batch rotation).
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from csnd.coordinator import CsnMerge, GlobalTxn, NodeBatch
from csnd.core.ids import Csn, Lsn
from tests.fixtures.generated import shared_cluster

NODES = ["dn1", "dn2", "dn3"]


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = shared_cluster(tmp_path_factory, len(NODES), 300, seed=11, binary=True)
    lines = (d / "expected.jsonl").read_text(encoding="utf-8").splitlines()
    assert any(len(json.loads(line)["nodes"]) > 1 for line in lines)
    return lines


def node_batches(lines: list[str], batch_size: int) -> dict[str, list[NodeBatch]]:
    """Each node's part of each line, cut like csnd.replay: a new batch per cid or every batch_size changes."""
    out: dict[str, list[NodeBatch]] = {n: [] for n in NODES}
    for line in lines:
        txn: dict[str, Any] = json.loads(line)
        for node, info in txn["nodes"].items():
            commit_lsn = int(info["commit_lsn"].split("/")[0], 16) << 32 | int(
                info["commit_lsn"].split("/")[1], 16
            )
            changes = [
                (
                    ch["cid"],
                    int(ch["lsn"].split("/")[0], 16) << 32 | int(ch["lsn"].split("/")[1], 16),
                    json.dumps({k: v for k, v in ch.items() if k not in ("node", "cid")}, ensure_ascii=False)[
                        1:-1
                    ],
                )
                for ch in txn["changes"]
                if ch["node"] == node
            ]
            chunks: list[list[tuple[int, int, str]]] = []
            for ch in changes:
                if chunks and chunks[-1][-1][0] == ch[0] and len(chunks[-1]) < batch_size:
                    chunks[-1].append(ch)
                else:
                    chunks.append([ch])
            chunks = chunks or [[]]
            time = _commit_time(txn["commit_time"])  # per-node times are not in the file; their max is
            for j, chunk in enumerate(chunks):
                cid = chunk[0][0] if chunk else 0
                out[node].append(
                    NodeBatch(
                        txn["csn"],
                        txn["gid"],
                        info["xid"],
                        Lsn(commit_lsn),
                        Lsn(commit_lsn + 0x30),
                        time,
                        cid,
                        chunk,
                        j == len(chunks) - 1,
                    )
                )
    return out


def _commit_time(iso: str) -> int:
    from datetime import datetime

    from csnd.core.ids import PG_EPOCH

    delta = datetime.fromisoformat(iso) - PG_EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def merge_all(
    batches: dict[str, list[NodeBatch]], rng: random.Random | None, limit: int = 8
) -> list[GlobalTxn]:
    """Feed every node (in turn, or in a random interleaving with watermarks), popping as we go."""
    m = CsnMerge(NODES, max_pending_batches=limit)
    out: list[GlobalTxn] = []
    pos = dict.fromkeys(NODES, 0)
    live = list(NODES)
    while live:
        # The I/O layer reads only nodes the merge wants more from; one always does (no deadlock).
        wanted = [n for n in live if m.wants_more(n)]
        if not wanted:
            out.extend(m.pop_ready())
            wanted = [n for n in live if m.wants_more(n)]
            assert wanted, "back-pressure deadlock"
        node = wanted[0] if rng is None else rng.choice(wanted)
        seq = batches[node]
        for _ in range(1 if rng is None else rng.randint(1, 4)):
            if pos[node] == len(seq):
                m.node_ended(node)
                live.remove(node)
                break
            b = seq[pos[node]]
            m.add_batch(node, b)
            pos[node] += 1
            nxt = seq[pos[node]].csn if pos[node] < len(seq) else None
            if rng is not None and b.last_of_txn and nxt is not None and rng.random() < 0.3:
                m.add_watermark(node, Csn(rng.randint(b.csn, nxt - 1)))  # valid: below its next csn
        if rng is None or rng.random() < 0.5:
            out.extend(m.pop_ready())
        m._check()
    out.extend(m.pop_ready())
    assert not m.has_pending()
    return out


@pytest.mark.parametrize("seed", [None, 1, 2, 3, 4])
def test_one_batch_per_cid_is_byte_exact(expected: list[str], seed: int | None) -> None:
    got = merge_all(node_batches(expected, 10**9), None if seed is None else random.Random(seed))
    assert [t.to_json_line() for t in got] == expected


@pytest.mark.parametrize("seed", [None, 5, 6])
def test_small_batches_keep_cid_and_node_order(expected: list[str], seed: int | None) -> None:
    # In turn and unbounded, every node's batches of a cid are all there when its first one is taken.
    got = merge_all(
        node_batches(expected, 2), None if seed is None else random.Random(seed), 8 if seed else 10**9
    )
    lines = [t.to_json_line() for t in got]
    if seed is None:
        assert lines == expected  # nothing was late: node order inside each cid
    assert len(lines) == len(expected)
    for line, want in zip(lines, expected, strict=True):
        a, b = json.loads(line), json.loads(want)
        assert {k: v for k, v in a.items() if k != "changes"} == {
            k: v for k, v in b.items() if k != "changes"
        }
        cids = [c["cid"] for c in a["changes"]]
        assert cids == sorted(cids)
        for node in b["nodes"]:
            assert [c for c in a["changes"] if c["node"] == node] == [
                c for c in b["changes"] if c["node"] == node
            ]
