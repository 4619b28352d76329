"""The Debezium envelope (docs/design.md section 7): pure conversion, then through a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd import __version__
from csnd.changelog import Changelog
from csnd.consumers.client import Changefeed
from csnd.core.errors import ChangefeedRejected
from csnd.service.debezium import MAX_SAFE_INT, UNAVAILABLE, to_debezium
from tests.service.feedkit import serve

LINE: dict[str, Any] = {
    "csn": 1042,
    "gid": "g-17",
    "commit_time": "2026-11-22T10:00:00.123456+00:00",
    "nodes": {"dn1": {"xid": 745, "commit_lsn": "0/16B3748"}, "dn2": {"xid": 733, "commit_lsn": "0/1702A10"}},
    "changes": [
        {"node": "dn1", "cid": 0, "lsn": "0/16B3600", "op": "delete", "schema": "public", "table": "acct",
         "key": ["id"], "old": {"id": 7}, "new": None},
        {"node": "dn2", "cid": 1, "lsn": "0/1702900", "op": "insert", "schema": "public", "table": "acct",
         "key": ["id"], "old": None, "new": {"id": 7, "owner": "ann", "big": 2**60, "doc": {"k": [1, 2]}}},
        {"node": "dn1", "cid": 2, "lsn": "0/16B3700", "op": "update", "schema": "public", "table": "acct",
         "key": ["id"], "old": None, "new": {"id": 8, "owner": "bo"}, "unchanged": ["doc"]},
        {"node": "dn1", "cid": 2, "lsn": "1/0", "op": "truncate", "schema": "public", "table": "tmp",
         "key": [], "old": None, "new": None},
    ],
}  # fmt: skip


def events(line: dict[str, Any]) -> list[dict[str, Any]]:
    out = to_debezium(json.dumps(line, ensure_ascii=False).encode())
    return [] if out is None else [json.loads(e) for e in out.decode().split("\n")]


def test_each_change_is_one_event_in_order() -> None:
    got = events(LINE)
    assert [e["op"] for e in got] == ["d", "c", "u", "t"]
    ts = 1_795_341_600_123  # 2026-11-22T10:00:00.123456Z in whole milliseconds
    assert got[0] == {
        "before": {"id": 7},
        "after": None,
        "source": {
            "version": __version__,
            "connector": "csnd",
            "name": "csnd",
            "ts_ms": ts,
            "snapshot": "false",
            "db": None,
            "schema": "public",
            "table": "acct",
            "txId": 745,
            "lsn": 0x16B3600,
            "xmin": None,
            "csn": 1042,
            "node": "dn1",
            "gid": "g-17",
        },
        "op": "d",
        "ts_ms": ts,
        "transaction": {"id": "1042", "total_order": 1, "data_collection_order": 1},
    }
    assert got[1]["after"] == {"id": 7, "owner": "ann", "big": str(2**60), "doc": {"k": [1, 2]}}
    assert got[1]["source"]["txId"] == 733 and got[1]["source"]["node"] == "dn2"
    assert got[2]["after"] == {"id": 8, "owner": "bo", "doc": UNAVAILABLE}
    assert got[3]["before"] is None and got[3]["after"] is None and got[3]["source"]["lsn"] == 1 << 32
    assert [e["transaction"]["data_collection_order"] for e in got] == [1, 2, 3, 1]
    assert [e["transaction"]["total_order"] for e in got] == [1, 2, 3, 4]


def test_snapshot_rows_are_reads_and_an_empty_transaction_gives_nothing() -> None:
    read = {**LINE, "changes": [{**LINE["changes"][1], "op": "read"}], "snapshot": {"chunk": 1}}
    (e,) = events(read)
    assert (e["op"], e["source"]["snapshot"]) == ("r", "true")
    (e,) = events({**read, "snapshot": {"chunk": 1, "incremental": "j1"}})
    assert (e["op"], e["source"]["snapshot"]) == ("r", "incremental")
    assert to_debezium(json.dumps({**LINE, "changes": []}).encode()) is None


@pytest.mark.parametrize(
    "bad", [b"[]", b"{}", b'{"csn": 1}', b"not json", json.dumps({**LINE, "changes": [{}]}).encode()]
)
def test_a_line_that_is_not_a_transaction_is_a_value_error(bad: bytes) -> None:
    with pytest.raises(ValueError, match="not a transaction line"):
        to_debezium(bad)


@given(st.lists(st.integers(-(2**63), 2**64), min_size=1, max_size=8))
def test_integers_are_numbers_up_to_2_53_and_strings_beyond(values: list[int]) -> None:
    row = {f"c{i}": v for i, v in enumerate(values)}
    change = {**LINE["changes"][1], "new": row}
    (e,) = events({**LINE, "changes": [change]})
    assert e["after"] == {k: v if abs(v) <= MAX_SAFE_INT else str(v) for k, v in row.items()}


def test_a_subscriber_asks_for_debezium_events(tmp_path: object) -> None:
    lines = [
        dict(LINE, csn=1),
        dict(LINE, csn=2, changes=[]),  # (no change: not sent)
        dict(LINE, csn=3, changes=LINE["changes"][3:]),
    ]
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        for obj in lines:
            log.append(obj["csn"], json.dumps(obj, ensure_ascii=False).encode())
        log.sync()
        srv = serve(log)
        try:
            with Changefeed(srv.address, format="debezium") as feed:
                got = [rec for _ in range(2) if (rec := feed.next(timeout=60)) is not None]
                assert feed.next(timeout=0.3) is None
            assert [c for c, _ in got] == [1, 3]
            assert got[0][1].decode().split("\n") == [
                json.dumps(e, ensure_ascii=False) for e in events(lines[0])
            ]
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "csnd.cli",
                    "subscribe",
                    srv.address,
                    "--format",
                    "debezium",
                    "--limit",
                    "2",
                ],
                capture_output=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            printed = [json.loads(x) for x in proc.stdout.decode().splitlines()]
            assert printed == events(lines[0]) + events(lines[2])
            with pytest.raises(ChangefeedRejected, match="unknown format 'avro'"):
                Changefeed(srv.address, format="avro").next(timeout=60)
        finally:
            srv.stop()
