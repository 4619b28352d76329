"""The `Sink` interface: a sink that wants one record per transaction with its csn (as the changelog does).

Written here against the interface alone -- the runtime is not touched --
it gathers `write` pieces and takes the whole line at `end_transaction`, and
counts what `make_durable` covered.  Through the real node pipelines of a
generated 3-node cluster its records are the expected output, line for line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from csnd.core.ids import Csn
from csnd.gtm import generate_cluster
from csnd.reader.recorded import RecordedSource
from csnd.runtime.inputs import NodePipeline
from csnd.runtime.merger import Merger
from csnd.runtime.sinks import GroupCommit
from csnd.runtime.sources import RecordedNode


class RecordSink:
    """One (csn, line) record per transaction; durable when make_durable says so."""

    group_commit: GroupCommit | None = None

    def __init__(self) -> None:
        self.transactions = 0
        self.bytes_out = 0
        self.records: list[tuple[int, bytes]] = []
        self.durable = 0  # records covered by the last make_durable
        self.committed = False
        self._parts: list[str] = []

    def start_transaction(self, csn: Csn) -> None:
        pass

    def append_lines(self, csns: Sequence[Csn], lines: Sequence[str]) -> None:
        for csn, line in zip(csns, lines, strict=True):
            self.end_transaction(csn, line)

    def relations(self, csn: Csn, entries: Sequence[tuple[str, str]]) -> None:
        pass  # (a record per transaction only)

    def write(self, text: str) -> None:
        self._parts.append(text)

    def end_transaction(self, csn: Csn, tail: str) -> None:
        self._parts.append(tail)
        line = "".join(self._parts).encode()
        self._parts.clear()
        assert not self.records or csn > self.records[-1][0]
        self.records.append((csn, line))
        self.transactions += 1
        self.bytes_out += len(line)

    def make_durable(self) -> None:
        self.durable = len(self.records)

    def commit(self) -> None:
        self.make_durable()
        self.committed = True

    def discard(self) -> None:
        pass

    def abandon(self) -> str | None:
        return None


def test_a_record_per_transaction_sink_gets_the_expected_lines_with_their_csns(tmp_path: Path) -> None:
    generate_cluster(str(tmp_path), 3, 300, seed=51, binary=True)
    inputs = [
        NodePipeline(RecordedNode(RecordedSource(str(tmp_path / f"dn{k}.pgstream"))), 1) for k in (1, 2, 3)
    ]
    sink = RecordSink()
    try:
        Merger(inputs, sink).run()
    finally:
        for p in inputs:
            p.stop()
    sink.commit()
    expected = (tmp_path / "expected.jsonl").read_bytes().splitlines()
    assert [line for _, line in sink.records] == expected
    assert [csn for csn, _ in sink.records] == [json.loads(line)["csn"] for line in expected]
    assert sink.durable == len(expected)
