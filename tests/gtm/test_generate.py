"""The synthetic cluster: streams parse, GTM causality holds, expected.jsonl is the oracle."""

from __future__ import annotations

import bisect
import hashlib
import json
import struct
from datetime import date, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from csnd.core.ids import PG_EPOCH
from csnd.gtm import GenerateOptions, generate_cluster
from csnd.reader.events import iter_events
from csnd.reader.streamfile import StreamFileReader
from tests.gtm.conftest import OPTIONS, Cluster
from tests.gtm.streamcheck import NodeView, SeenChange, lsn_str, read_node


def _lines(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _views(cluster: Cluster) -> dict[str, NodeView]:
    views = {}
    for p in cluster.streams():
        v = read_node(str(p))
        views[v.node] = v
    return views


# --- (a) every file parses ---------------------------------------------------------


@pytest.mark.parametrize("name", ["cluster3", "cluster3_text", "cluster1"])
def test_streams_parse(name: str, request: pytest.FixtureRequest) -> None:
    cluster: Cluster = request.getfixturevalue(name)
    binary = name != "cluster3_text"
    for i, path in enumerate(cluster.streams()):
        with StreamFileReader(str(path)) as f:
            assert f.header.node == f"dn{i + 1}"
            assert (f.header.mode, f.header.proto_version, f.header.binary) == ("gtm", 2, binary)
            n = sum(1 for _ in iter_events(f, f.header.node, str(path)))
        assert n == cluster.summary.per_node_frames[f.header.node]


# --- (b) causality per node --------------------------------------------------------


def _check_causality(view: NodeView) -> tuple[int, int]:
    """Returns (commits, out-of-CSN-order commits) after asserting the GTM invariants."""
    committing: dict[str, tuple[int, int]] = {}
    aborted: set[str] = set()
    committed: set[str] = set()
    ticks: list[tuple[int, int]] = []
    commits: list[int] = []
    for idx, kind, gid, value in view.timeline:
        if kind == "committing":
            assert gid is not None and value is not None and gid not in committing
            committing[gid] = (value, idx)
        elif kind == "abort":
            assert gid in committing, f"{view.node}: abort of {gid} without committing"
            assert gid not in committed
            aborted.add(gid)
        elif kind == "tick":
            assert value is not None
            assert not ticks or value >= ticks[-1][1], "ticks never go back"
            ticks.append((idx, value))
        else:
            assert kind == "commit"
            assert gid is not None and value is not None, f"{view.node}: committed txn without commit marker"
            assert gid in committing and gid not in aborted, f"{view.node}: {gid} commits without committing"
            c_csn, c_idx = committing[gid]
            assert value > c_csn, f"{view.node}: {gid} commit csn {value} <= committing csn {c_csn}"
            for t_idx, t in ticks:
                if value <= t:
                    assert c_idx < t_idx, f"{view.node}: {gid} csn {value} commits after tick {t}"
            committed.add(gid)
            commits.append(value)
    assert set(committing) == committed | aborted, "every committing txn ends"
    disorder = sum(1 for a, b in pairwise(commits) if a > b)
    return len(commits), disorder


def _sender_release_order(view: NodeView) -> list[int]:
    """docs/design.md section 3, equivalent form: release the smallest committed CSN while it is
    <= the smallest committing CSN still open.  Correct streams make this CSN order."""
    open_committing: dict[str, int] = {}
    waiting: list[int] = []
    released: list[int] = []
    for _, kind, gid, value in view.timeline:
        if kind == "committing":
            assert gid is not None and value is not None
            open_committing[gid] = value
        elif kind == "abort":
            assert gid is not None
            open_committing.pop(gid)
        elif kind == "commit":
            assert gid is not None and value is not None
            open_committing.pop(gid)
            bisect.insort(waiting, value)
        while waiting and (not open_committing or waiting[0] <= min(open_committing.values())):
            released.append(waiting.pop(0))
    assert not waiting and not open_committing
    return released


@pytest.mark.parametrize("name", ["cluster3", "cluster1"])
def test_causality(name: str, request: pytest.FixtureRequest) -> None:
    cluster: Cluster = request.getfixturevalue(name)
    views = _views(cluster)
    total_disorder = 0
    aborted_gids: set[str] = set()
    released: set[int] = set()
    for view in views.values():
        commits, disorder = _check_causality(view)
        assert commits > 0
        order = _sender_release_order(view)
        assert all(a < b for a, b in pairwise(order)), f"{view.node}: a smaller CSN committed too late"
        released.update(order)
        total_disorder += disorder
        aborted_gids |= {gid for _, kind, gid, _ in view.timeline if kind == "abort" and gid}
    assert total_disorder > 0, "some commit records must be out of CSN order"
    assert aborted_gids, "some txns abort after committing"
    committed_gids = {t.gid for v in views.values() for t in v.committed}
    assert not aborted_gids & committed_gids, "aborted txns never have committed data"
    assert not aborted_gids & {e["gid"] for e in _lines(cluster.expected)}
    assert released == {e["csn"] for e in _lines(cluster.expected)}


# --- (c) expected.jsonl ------------------------------------------------------------


def test_expected_order(cluster3: Cluster) -> None:
    lines = _lines(cluster3.expected)
    assert len(lines) == cluster3.summary.committed
    assert sum(len(e["changes"]) for e in lines) == cluster3.summary.changes
    csns = [e["csn"] for e in lines]
    assert csns == sorted(set(csns)), "strictly increasing CSNs"
    gids = [e["gid"] for e in lines]
    assert len(gids) == len(set(gids)), "a distributed txn appears once"
    assert sum(1 for e in lines if len(e["nodes"]) > 1) > 10
    order = {f"dn{i + 1}": i for i in range(3)}
    for e in lines:
        assert list(e) == ["csn", "gid", "commit_time", "nodes", "changes"]
        assert [order[n] for n in e["nodes"]] == sorted(order[n] for n in e["nodes"])
        keys = [(c["cid"], order[c["node"]]) for c in e["changes"]]
        assert keys == sorted(keys), "changes by cid, then node order"
        for c in e["changes"]:
            assert c["node"] in e["nodes"]
            assert list(c)[:9] == ["node", "cid", "lsn", "op", "schema", "table", "key", "old", "new"]


def test_expected_format_is_exact(cluster3: Cluster) -> None:
    """The lines are json.dumps with default separators and ensure_ascii=False."""
    with open(cluster3.expected, encoding="utf-8") as f:
        for line in f:
            assert line == json.dumps(json.loads(line), ensure_ascii=False) + "\n"


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_deterministic_per_seed(tmp_path: Path) -> None:
    small = GenerateOptions(large_txn_changes=80)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate_cluster(a, 2, 60, seed=11, options=small)
    generate_cluster(b, 2, 60, seed=11, options=small)
    generate_cluster(c, 2, 60, seed=12, options=small)
    assert _digest(a) == _digest(b)
    assert _digest(a)["expected.jsonl"] != _digest(c)["expected.jsonl"]


# --- (d) text and binary give the same oracle ---------------------------------------


def test_text_and_binary_same_expected(cluster3: Cluster, cluster3_text: Cluster) -> None:
    assert cluster3.expected.read_bytes() == cluster3_text.expected.read_bytes()
    assert cluster3.streams()[0].read_bytes() != cluster3_text.streams()[0].read_bytes()


# --- the oracle agrees with what was written ----------------------------------------


def _value(oid: int, kind: str, raw: bytes, binary: bool) -> Any:
    """A few types read back from the wire, enough to prove the columns line up."""
    if oid in (23, 20):
        return int.from_bytes(raw, "big", signed=True) if binary else int(raw)
    if oid in (25, 1043):
        return raw.decode("utf-8")
    if oid == 16:
        return raw == (b"\x01" if binary else b"t")
    if oid == 17:
        return "\\x" + raw.hex() if binary else raw.decode()
    if oid == 2950:
        return str(UUID(bytes=raw)) if binary else raw.decode()
    if oid == 3802:
        return json.loads(raw[1:] if binary else raw)
    if oid == 1082 and binary:
        days = int.from_bytes(raw, "big", signed=True)
        return {2**31 - 1: "infinity", -(2**31): "-infinity"}.get(days) or (
            date(2000, 1, 1) + timedelta(days=days)
        ).isoformat()
    if oid == 1184 and binary:
        us = int.from_bytes(raw, "big", signed=True)
        return {2**63 - 1: "infinity", -(2**63): "-infinity"}.get(us) or (
            PG_EPOCH + timedelta(microseconds=us)
        ).isoformat()
    if oid == 701:
        f = struct.unpack("!d", raw)[0] if binary else float(raw)
        return {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}.get(repr(f), f)
    if oid == 1700 and not binary:
        return raw.decode()
    return ...  # not checked here (test_pgtypes compares every encoder with the server)


def _check_change(sc: SeenChange, ec: dict[str, Any], binary: bool) -> None:
    assert (ec["lsn"], ec["op"], ec["table"], ec["cid"]) == (lsn_str(sc.lsn), sc.op, sc.table, sc.cid)
    cols = sc.relation.columns
    names = [c.name for c in cols]
    if sc.op == "truncate":
        assert ec["old"] is None and ec["new"] is None
        return
    if sc.new is None:
        assert ec["new"] is None
    else:
        assert len(sc.new) == len(cols)
        unchanged = [n for n, (k, _) in zip(names, sc.new, strict=True) if k == "u"]
        assert ec.get("unchanged", []) == unchanged
        assert list(ec["new"]) == [n for n, (k, _) in zip(names, sc.new, strict=True) if k != "u"]
        for col, (k, raw) in zip(cols, sc.new, strict=True):
            if k in "tb":
                assert k == ("b" if binary else "t")
                assert raw is not None
                v = _value(col.type_oid, k, raw, binary)
                if v is not ...:
                    assert v == ec["new"][col.name] or (col.type_oid == 3802 and ec["new"][col.name] is None)
            elif k == "n":
                assert ec["new"][col.name] is None
    if sc.old_kind is None:
        assert ec["old"] is None
    elif sc.old_kind == "O":
        assert sc.relation.replident == "f" and sc.old is not None
        assert list(ec["old"]) == names
    else:
        assert sc.old is not None and sc.relation.replident in "di"
        keys = [c.name for c in cols if c.is_key]
        assert list(ec["old"]) == keys
        assert all(k == "n" for c, (k, _) in zip(cols, sc.old, strict=True) if not c.is_key)


@pytest.mark.parametrize("name", ["cluster3", "cluster3_text", "cluster1"])
def test_expected_matches_streams(name: str, request: pytest.FixtureRequest) -> None:
    cluster: Cluster = request.getfixturevalue(name)
    views = _views(cluster)
    by_gid = {e["gid"]: e for e in _lines(cluster.expected)}
    pairs = 0
    for node, view in views.items():
        for t in view.committed:
            assert t.gid is not None
            e = by_gid[t.gid]
            assert e["csn"] == t.csn
            assert e["nodes"][node] == {"xid": t.xid, "commit_lsn": lsn_str(t.commit_lsn)}
            mine = [c for c in e["changes"] if c["node"] == node]
            assert len(mine) == len(t.changes)
            for sc, ec in zip(t.changes, mine, strict=True):
                _check_change(sc, ec, view.binary)
            assert [c.lsn for c in t.changes] == sorted(c.lsn for c in t.changes)
            pairs += 1
    assert pairs == sum(len(e["nodes"]) for e in by_gid.values())


# --- the workload covers what it promises ---------------------------------------------


def test_features_present(cluster3: Cluster) -> None:
    views = _views(cluster3)
    all_txns = [t for v in views.values() for t in v.committed]
    changes = [c for t in all_txns for c in t.changes]
    assert sum(v.stream_blocks for v in views.values()) > 5
    aborts = [a for v in views.values() for a in v.stream_aborts]
    assert any(x != sub for x, sub in aborts), "a streamed subtransaction rolled back"
    assert any(x == sub for x, sub in aborts), "a whole streamed txn rolled back"
    assert any(t.streamed and t.gid for t in all_txns), "streamed txns commit with their marker"
    assert any(c.xid is not None and c.xid != t.xid for t in all_txns for c in t.changes), "subxact xids"
    assert any(c.new and any(k == "u" for k, _ in c.new) for c in changes), "unchanged TOAST"
    assert any(c.op == "update" and c.table == "audit" and c.new and ("u", None) in c.new for c in changes)
    assert {c.old_kind for c in changes} >= {"K", "O", None}
    assert {c.table for c in changes if c.old_kind == "K"} >= {"acct", "wide", "item"}
    assert {c.op for c in changes if c.table == "event_log"} <= {"insert", "truncate"}
    truncs: dict[int, int] = {}
    for c in changes:
        if c.op == "truncate":
            truncs[c.lsn] = truncs.get(c.lsn, 0) + 1
    assert truncs and max(truncs.values()) >= 2, "a multi-table truncate"
    rels = [r for v in views.values() for r in v.relations]
    item = next(r for r in rels if r.name == "item")
    assert [c.name for c in item.columns if c.is_key] == ["sku", "region"] and item.replident == "i"
    assert all(c.is_key for r in rels if r.replident == "f" for c in r.columns)
    shapes = {tuple((c.name, c.type_oid) for c in r.columns) for r in rels if r.name == "evolve"}
    assert len(shapes) >= 3, "DDL gives evolve new shapes"
    assert any(("t0", 1043) in s for s in shapes) and any(("t0", 25) in s for s in shapes)
    assert any(r.xid is not None for r in rels), "Relation inside a stream block carries the xid"
    assert all(v.keepalives > 0 for v in views.values())
    assert all(any(k == "tick" for _, k, _, _ in v.timeline) for v in views.values())
    assert any(len(t.cids) > 0 for t in all_txns), "cid markers"
    for v in views.values():
        assert all(frame <= first for frame, first in v.begin_positions), "Begin at the txn's first record"
        assert any(frame == first for frame, first in v.begin_positions)


def test_single_node_has_no_cid_markers(cluster1: Cluster) -> None:
    (view,) = _views(cluster1).values()
    assert all(not t.cids for t in view.committed)
    assert all(len(e["nodes"]) == 1 for e in _lines(cluster1.expected))


def test_wide_rows_and_big_values_are_tunable(tmp_path: Path) -> None:
    opts = GenerateOptions(extra_columns=6, toast_bytes=5000, large_ratio=0.0)
    s = generate_cluster(tmp_path, 1, 40, seed=5, options=opts)
    assert s.committed + s.aborted == 40
    wide = [c for e in _lines(tmp_path / "expected.jsonl") for c in e["changes"] if c["table"] == "wide"]
    assert any(c["new"] and "x6" in c["new"] for c in wide)
    bodies = [c["new"]["body"] for c in wide if c["op"] == "insert" and isinstance(c["new"]["body"], str)]
    assert max(len(b.encode()) for b in bodies) >= 5000


def test_zero_transactions(tmp_path: Path) -> None:
    s = generate_cluster(tmp_path, 2, 0)
    assert (s.committed, s.aborted, s.changes) == (0, 0, 0)
    assert (tmp_path / "expected.jsonl").read_text() == ""
    for p in s.files:
        view = read_node(p)
        assert not view.committed


def test_overrides_and_stale_files(tmp_path: Path) -> None:
    s = generate_cluster(tmp_path, 2, 10, seed=1, large_txn_changes=50, initial_rows=5)
    assert s.expected_bytes == (tmp_path / "expected.jsonl").stat().st_size
    with pytest.raises(TypeError):
        generate_cluster(tmp_path, 2, 10, no_such_option=1)
    generate_cluster(tmp_path, 2, 10, seed=2)  # same names: overwritten
    with pytest.raises(FileExistsError, match=r"dn2\.pgstream"):
        generate_cluster(tmp_path, 1, 10)
    with pytest.raises(ValueError, match="concurrency must be >= 1"):
        generate_cluster(tmp_path, 2, 10, concurrency=0)
    with pytest.raises(ValueError, match="at least one node"):
        generate_cluster(tmp_path / "x", 0, 10)


def test_options_are_used(cluster3: Cluster) -> None:
    assert cluster3.summary.committed + cluster3.summary.aborted == 400
    assert OPTIONS.large_ratio > 0
