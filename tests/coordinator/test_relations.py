"""Relation versions from the sender to the changelog: the wire, the merge, the store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from csnd.changelog import Changelog, RelationStore
from csnd.coordinator import CsnMerge, NodeBatch, TxnStart, relation_line
from csnd.coordinator.wire import batch_from_pb, batch_to_pb
from csnd.core.errors import ChangelogCorrupt
from csnd.core.ids import Csn, Lsn, Xid
from tests.coordinator.helpers import CLOCK


def body(table: str, *columns: str) -> str:
    cols = json.dumps([{"name": c, "type": "int4", "oid": 23, "typmod": -1} for c in columns])
    return (
        f'"schema": "public", "table": "{table}", "relid": 1, "replica_identity": "default", '
        f'"key": ["{columns[0]}"], "columns": {cols}'
    )


def test_a_relation_line_is_what_json_dumps_writes() -> None:
    line = relation_line(42, "dn1", body("acct", "id", "n"))
    obj = json.loads(line)
    assert list(obj["relation"])[:4] == ["csn", "node", "schema", "table"]
    assert json.dumps(obj, ensure_ascii=False) == line


def test_the_wire_and_the_merge_carry_a_transactions_relations() -> None:
    a, b = body("acct", "id"), body("item", "id", "v")
    first = NodeBatch(
        Csn(7), "g", Xid(70), Lsn(0x10), Lsn(0x18), CLOCK, 0, [(0, 0x8, '"op": "x"')], False, (a,)
    )
    again, _, _ = batch_from_pb(batch_to_pb(first, 0, 0x18))
    assert again == first
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch("dn2", NodeBatch(Csn(7), "g", Xid(71), Lsn(0x30), Lsn(0x38), CLOCK, 0, [], True, (b,)))
    m.add_batch("dn1", first)
    m.add_batch(
        "dn1", NodeBatch(Csn(7), "g", Xid(70), Lsn(0x10), Lsn(0x18), CLOCK, 1, [(1, 0x9, '"op": "y"')], True)
    )
    m.node_ended("dn1")
    m.node_ended("dn2")
    [start] = [e for e in m.pop_events() if isinstance(e, TxnStart)]
    assert start.relations == [("dn1", a), ("dn2", b)]  # (node order, whoever came first)


def test_the_store_keeps_new_versions_durably_and_says_what_is_in_force(tmp_path: Path) -> None:
    s = RelationStore(str(tmp_path))
    v1, v2 = body("acct", "id"), body("acct", "id", "note")
    assert s.add(10, "dn1", v1) is not None
    assert s.add(12, "dn1", v1) is None  # (sent again after a reconnect: the same version)
    assert s.add(11, "dn2", v1) is not None  # (another node's table)
    assert s.add(20, "dn1", v2) is not None
    assert s.add(30, "dn1", body("item", "k")) is not None
    s._check()
    assert [(e.csn, e.node) for e in s.between(0, 25)] == [(11, "dn2"), (20, "dn1")]  # in force at 25
    assert [e.csn for e in s.between(0, 15)] == [10, 11]
    assert [e.csn for e in s.between(15, 40)] == [20, 30]
    assert [e.csn for e in s.between(15, 40, lambda schema, table: table == "item")] == [30]
    assert s.has_between(19, 20) and not s.has_between(20, 29)
    s.close()
    again = RelationStore(str(tmp_path))
    assert [e.line for e in again.between(0, 99)] == [e.line for e in s.between(0, 99)]
    assert again.between(0, 99)[0].line == relation_line(11, "dn2", v1)
    again._check()


def test_a_torn_last_line_is_cut_and_other_damage_named(tmp_path: Path) -> None:
    s = RelationStore(str(tmp_path))
    s.add(10, "dn1", body("acct", "id"))
    s.close()
    path = tmp_path / "relations.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"relation": {"csn": 11, "no')  # (a crash mid-append)
    assert len(RelationStore(str(tmp_path))) == 1 and path.read_bytes() == whole
    path.write_bytes(whole + b'{"csn": 11}\n' + whole)
    with pytest.raises(ChangelogCorrupt, match=f"relations.jsonl.*offset {len(whole)}"):
        RelationStore(str(tmp_path))


def test_the_changelog_keeps_its_relations_beside_it(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.relations.add(1, "dn1", body("acct", "id"))
    assert os.path.exists(tmp_path / "relations.jsonl")
    with Changelog(str(tmp_path)) as log:
        assert len(log.relations) == 1
