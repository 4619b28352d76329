"""NodeSender over the synthetic GaussDB-style cluster (`gtm.generate`), against its expected.jsonl.

The generator writes what a PostgreSQL 15 walsender would send for a
GaussDB-style workload (out-of-order commits, aborts after committing,
streamed large transactions, savepoints, DDL, truncates) and, independently,
the transactions that must come out.  Here each node's stream goes through a
NodeSender (changes "decoded" to placeholders: values are the decoder's
business) and every node's released sequence must match the expected lines
that involve it: CSN order, gid, xid, commit LSN, and each change's cid and LSN.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csnd.core.ids import lsn_to_str
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.gtm import GenerateOptions
from csnd.reader.pgoutput import Change, ChangeFrames, Truncate, TxnRun
from csnd.reader.recorded import RecordedSource
from csnd.sender import NodeSender
from tests.fixtures.generated import shared_cluster

OPTIONS = GenerateOptions(
    large_ratio=0.05, abort_ratio=0.15, large_txn_changes=200, ddl_every=60, truncate_every=70
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_cluster(tmp_path_factory, 3, 300, seed=11, binary=True, options=OPTIONS)


@pytest.mark.parametrize("spill_bytes", [64 * 1024 * 1024, 2048])
def test_nodes_release_the_expected_transactions(cluster: Path, spill_bytes: int, tmp_path: Path) -> None:
    expected = [json.loads(line) for line in (cluster / "expected.jsonl").read_text().splitlines()]
    spilled = 0
    for path in sorted(cluster.glob("dn*.pgstream")):
        src = RecordedSource(str(path))
        ns = NodeSender(src.node, src.mode, spill_bytes=spill_bytes, spill_dir=str(tmp_path))
        got = []
        watermarks: list[int] = []
        confirmable = 0
        for lsn, m in src.events():
            items: list[DecodedItem]
            if isinstance(m, Change):
                items = [DecodedRun(m.xid, [lsn], [f"b{lsn}"], m.kind)]
            elif isinstance(m, Truncate):
                items = [DecodedRun(m.xid, [lsn] * len(m.relids), [f"t{r}" for r in m.relids], "truncate")]
            else:
                assert not isinstance(m, (ChangeFrames, TxnRun))  # (only with raw_changes, from a live node)
                items = [m]
            for item in items:
                for t in ns.feed(lsn, item):
                    assert not watermarks or t.csn > watermarks[-1]
                    changes = [(cid, lsn_to_str(c_lsn)) for cid, c_lsn, _ in t.changes]
                    got.append((t.csn, t.gid, t.xid, lsn_to_str(t.commit_lsn), changes))
                wm = ns.watermark
                if wm is not None:
                    assert not watermarks or wm >= watermarks[-1]
                    watermarks.append(wm)
                assert ns.confirmable_lsn >= confirmable
                confirmable = ns.confirmable_lsn
        ns.finish()
        ns._check()
        spilled += ns.statistics().spilled_txns
        want = [
            (
                e["csn"],
                e["gid"],
                e["nodes"][src.node]["xid"],
                e["nodes"][src.node]["commit_lsn"],
                [(c["cid"], c["lsn"]) for c in e["changes"] if c["node"] == src.node],
            )
            for e in expected
            if src.node in e["nodes"]
        ]
        assert len(got) == len(want) > 50
        assert got == want
        assert watermarks and watermarks[-1] >= got[-1][0]
    assert (spilled > 0) == (spill_bytes < 1024 * 1024)
    assert list(tmp_path.iterdir()) == []
