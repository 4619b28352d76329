"""The transaction JSON line of docs/design.md section 7, byte for byte.

Bodies are what a decoder worker writes: the change object after `"cid": N, `,
its LSN included (`decoder.change`).
"""

from __future__ import annotations

import json
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from csnd.coordinator import JSON_TAIL, CsnMerge, GlobalTxn, NodeBatch, NodeCommit, json_head
from csnd.core.ids import PG_EPOCH, PG_TIME_MAX_US, PG_TIME_MIN_US, Csn, Lsn, Xid, lsn_to_str
from csnd.core.lines import one_change_line, single_node_line
from tests.coordinator.helpers import CLOCK

DN2 = 1 << 32  # dn2 is past the 32-bit boundary: its LSNs print as 1/...

DELETE = (
    '"lsn": "0/16B3600", "op": "delete", "schema": "public", "table": "acct", "key": ["id"], '
    '"old": {"id": 7}, "new": null'
)
INSERT = (
    '"lsn": "1/702900", "op": "insert", "schema": "public", "table": "acct", "key": ["id"], "old": null, '
    '"new": {"id": 7, "owner": "ann", "balance": "10.50", "doc": {"k": [1, 2]}}'
)
UPDATE = (
    '"lsn": "0/16B3700", "op": "update", "schema": "public", "table": "acct", "key": ["id"], "old": null, '
    '"new": {"id": 8, "owner": "bo", "balance": "3.00"}, "unchanged": ["doc"]'
)
TRUNCATE = (
    '"lsn": "0/16B3710", "op": "truncate", "schema": "public", "table": "tmp", "key": [], '
    '"old": null, "new": null'
)


def test_distributed_transaction_line_is_exact() -> None:
    """dn1's delete (cid 1) precedes dn2's insert (cid 2), whatever order the nodes arrive in."""
    m = CsnMerge(["dn1", "dn2"])
    m.add_batch(
        "dn2",
        NodeBatch(
            Csn(1042),
            "g-17",
            Xid(733),
            Lsn(DN2 | 0x702A10),
            Lsn(DN2 | 0x702A40),
            CLOCK + 100,
            2,
            [(2, DN2 | 0x702900, INSERT)],
            True,
        ),
    )
    m.add_batch(
        "dn1",
        NodeBatch(
            Csn(1042),
            "g-17",
            Xid(745),
            Lsn(0x16B3748),
            Lsn(0x16B3778),
            CLOCK + 123456,
            1,
            [(1, 0x16B3600, DELETE)],
            False,
        ),
    )
    m.add_batch(
        "dn1",
        NodeBatch(
            Csn(1042),
            "g-17",
            Xid(745),
            Lsn(0x16B3748),
            Lsn(0x16B3778),
            CLOCK + 123456,
            3,
            [(3, 0x16B3700, UPDATE), (3, 0x16B3710, TRUNCATE)],
            True,
        ),
    )
    m.node_ended("dn1")
    m.node_ended("dn2")
    [txn] = m.pop_ready()
    expected = (
        '{"csn": 1042, "gid": "g-17", "commit_time": "2026-11-22T10:00:00.123456+00:00", '
        '"nodes": {"dn1": {"xid": 745, "commit_lsn": "0/16B3748"}, "dn2": {"xid": 733, "commit_lsn": "1/702A10"}}, '
        '"changes": ['
        '{"node": "dn1", "cid": 1, "lsn": "0/16B3600", "op": "delete", "schema": "public", "table": "acct", '
        '"key": ["id"], "old": {"id": 7}, "new": null}, '
        '{"node": "dn2", "cid": 2, "lsn": "1/702900", "op": "insert", "schema": "public", "table": "acct", '
        '"key": ["id"], "old": null, "new": {"id": 7, "owner": "ann", "balance": "10.50", "doc": {"k": [1, 2]}}}, '
        '{"node": "dn1", "cid": 3, "lsn": "0/16B3700", "op": "update", "schema": "public", "table": "acct", '
        '"key": ["id"], "old": null, "new": {"id": 8, "owner": "bo", "balance": "3.00"}, "unchanged": ["doc"]}, '
        '{"node": "dn1", "cid": 3, "lsn": "0/16B3710", "op": "truncate", "schema": "public", "table": "tmp", '
        '"key": [], "old": null, "new": null}'
        "]}"
    )
    assert txn.to_json_line() == expected
    assert txn.end_lsns == {"dn1": 0x16B3778, "dn2": DN2 | 0x702A40}
    # The generator writes expected.jsonl with json.dumps; the two must agree byte for byte.
    assert json.dumps(json.loads(expected), ensure_ascii=False) == expected


def test_single_node_line_gid_null_whole_second_empty_changes_non_ascii() -> None:
    txn = GlobalTxn(
        Csn(0x16B3748),
        None,
        {"nœud-1": NodeCommit(Xid(745), Lsn(0x16B3748), CLOCK)},
        {"nœud-1": Lsn(0x16B3778)},
        [],
    )
    assert txn.to_json_line() == (
        '{"csn": 23803720, "gid": null, "commit_time": "2026-11-22T10:00:00+00:00", '
        '"nodes": {"nœud-1": {"xid": 745, "commit_lsn": "0/16B3748"}}, "changes": []}'
    )


def test_quotes_in_names_are_escaped() -> None:
    nodes = {'d"n': NodeCommit(Xid(1), Lsn(2), CLOCK - 1)}
    txn = GlobalTxn(
        Csn(5), 'g "€"', nodes, {'d"n': Lsn(3)}, [('d"n', [(0, 16, '"lsn": "0/10", "op": "truncate"')])]
    )
    line = txn.to_json_line()
    assert line == (
        '{"csn": 5, "gid": "g \\"€\\"", "commit_time": "2026-11-22T09:59:59.999999+00:00", '
        '"nodes": {"d\\"n": {"xid": 1, "commit_lsn": "0/2"}}, '
        '"changes": [{"node": "d\\"n", "cid": 0, "lsn": "0/10", "op": "truncate"}]}'
    )
    assert json.loads(line)["gid"] == 'g "€"'


_nodes = st.dictionaries(
    st.text(min_size=1, max_size=12),
    st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)),
    min_size=1,
    max_size=3,
)


@given(_nodes, st.integers(1, 2**63 - 1), st.one_of(st.none(), st.text(max_size=20)), st.integers(0, 10**15))
def test_the_head_is_the_json_of_the_transaction(
    nodes: dict[str, tuple[int, int]], csn: int, gid: str | None, commit_time: int
) -> None:
    commits = {name: NodeCommit(Xid(xid), Lsn(lsn), commit_time) for name, (xid, lsn) in nodes.items()}
    line = json.loads(json_head(csn, gid, commit_time, commits) + JSON_TAIL)
    assert line == {
        "csn": csn,
        "gid": gid,
        "commit_time": (PG_EPOCH + timedelta(microseconds=commit_time)).isoformat(),
        "nodes": {name: {"xid": xid, "commit_lsn": lsn_to_str(lsn)} for name, (xid, lsn) in nodes.items()},
        "changes": [],
    }
    assert list(line["nodes"]) == list(nodes)  # (in the order given)


@given(
    node=st.text(min_size=1, max_size=8),
    commit_lsn=st.integers(0, 2**64 - 1),
    xid=st.integers(0, 2**32 - 1),
    commit_time=st.one_of(
        st.integers(PG_TIME_MIN_US, PG_TIME_MAX_US), st.integers(-(10**6), 10**6).map(lambda s: s * 1_000_000)
    ),
    body=st.text(max_size=20),
)
def test_a_one_change_line_is_the_single_node_line_of_one_change(
    node: str, commit_lsn: int, xid: int, commit_time: int, body: str
) -> None:
    """The decoder workers' one-format line of a one-row transaction, against the general one (any node name)."""
    want = single_node_line(node, commit_lsn, None, xid, commit_lsn, commit_time, 0, [body])
    assert one_change_line(node, commit_lsn, xid, commit_time, body) == want
