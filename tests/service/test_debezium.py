"""The Debezium envelope (docs/design.md section 7): pure conversion, then through a real server."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd import __version__
from csnd.changelog import Changelog
from csnd.consumers.client import Changefeed
from csnd.core.errors import ChangefeedRejected
from csnd.decoder import temporal
from csnd.service.changefeed import FeedSettings
from csnd.service.config import ServedSource
from csnd.service.debezium import (
    MAX_SAFE_INT,
    UNAVAILABLE,
    ColumnTypesUnknown,
    DebeziumFormat,
    column_rules,
    to_debezium,
)
from csnd.service.debezium_time import (
    converter,
    days_since_epoch,
    interval_us,
    time_of_day_us,
    timestamp_us,
    zoned_time,
    zoned_timestamp,
)
from csnd.service.serve import node_databases
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
            "ts_us": ts * 1000 + 456,
            "ts_ns": (ts * 1000 + 456) * 1000,
            "sequence": f'["{0x16B3748}","{0x16B3600}"]',
        },
        "op": "d",
        "ts_ms": ts,
        "transaction": {"id": "1042", "total_order": 1, "data_collection_order": 1},
        "ts_us": ts * 1000 + 456,
        "ts_ns": (ts * 1000 + 456) * 1000,
        "key": {"id": 7},
    }
    assert got[1]["after"] == {"id": 7, "owner": "ann", "big": str(2**60), "doc": {"k": [1, 2]}}
    assert got[1]["source"]["txId"] == 733 and got[1]["source"]["node"] == "dn2"
    assert got[1]["key"] == {"id": 7} and got[1]["source"]["sequence"] == f'["{0x1702A10}","{0x1702900}"]'
    assert got[2]["after"] == {"id": 8, "owner": "bo", "doc": UNAVAILABLE} and got[2]["key"] == {"id": 8}
    assert got[3]["before"] is None and got[3]["after"] is None and got[3]["source"]["lsn"] == 1 << 32
    assert got[3]["key"] is None  # (a truncate names no row)
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
    change = {**LINE["changes"][1], "new": row, "key": []}
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


# --- what a Debezium consumer reads (tests/fixtures/debezium_postgresql_events.json) -------------------

DOCUMENTED: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "debezium_postgresql_events.json").read_text(
        encoding="utf-8"
    )
)
ROWS = frozenset(DOCUMENTED["rows"])
DATABASES = {"dn1": "shop", "dn2": "shop_eu"}


def _json_type(v: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}[
        type(v)
    ]


def conforms(ours: Any, documented: Any, path: str = "") -> list[str]:
    """Where `ours` is not what a consumer of the documented event can read (a schema check, written from the docs).

    Every documented field is there with a value of its JSON type; a field
    documented null may hold anything; a row (`before`, `after`, `key`) is an
    object of columns or null; fields of ours the documentation lacks are
    left alone (Debezium's consumers ignore what they do not know).
    """
    if documented is None:
        return []
    if path.rsplit(".", 1)[-1] in ROWS:
        return [] if ours is None or isinstance(ours, dict) else [f"{path}: a row must be an object or null"]
    found = "null" if ours is None else _json_type(ours)
    if found != _json_type(documented):
        return [f"{path}: {_json_type(documented)} expected, found {json.dumps(ours)}"]
    wrong: list[str] = []
    if isinstance(documented, dict):
        for key, value in documented.items():
            if key not in ours:
                wrong.append(f"{path}.{key}: missing")
            else:
                wrong.extend(conforms(ours[key], value, f"{path}.{key}"))
    return wrong


def read_as_debezium_consumer(event: dict[str, Any], documented: dict[str, Any]) -> None:
    """What a consumer of Debezium's events relies on, checked: shapes, then the meaning of the fields."""
    value = dict(event)
    key = value.pop("key", "(none)")
    wrong = conforms(value, documented["value"], "value") + conforms(key, documented["key"], "key")
    assert not wrong, wrong
    source = value["source"]
    row = value["after"] if value["op"] != "d" else value["before"]
    assert key == {k: row[k] for k in key}  # (the key's columns, valued as in the row)
    for where in (value, source):
        assert where["ts_us"] // 1000 == where["ts_ms"] and where["ts_ns"] // 1000 == where["ts_us"]
    sequence = json.loads(source["sequence"])
    assert len(sequence) == 2 and all(s is None or s.isdigit() for s in sequence)
    assert int(sequence[1]) == source["lsn"]
    assert source["db"] == DATABASES[source["node"]]
    assert value["op"] in ("c", "u", "d", "r", "t")


def test_events_read_as_a_debezium_consumer_reads_them() -> None:
    """Failed before: no key, ts_us, ts_ns, source.sequence; source.db null."""
    out = DebeziumFormat(DATABASES).convert(json.dumps(LINE, ensure_ascii=False).encode())
    assert out is not None
    got = {e["op"]: e for e in map(json.loads, out.decode().split("\n"))}
    for documented in DOCUMENTED["events"]:
        read_as_debezium_consumer(got[documented["value"]["op"]], documented)
    # the sequence orders a node's events as their transactions and positions do
    per_node = [
        json.loads(e["source"]["sequence"]) for e in map(json.loads, out.decode().split("\n"))
        if e["source"]["node"] == "dn1"
    ]  # fmt: skip
    assert per_node == sorted(per_node, key=lambda s: [int(x) for x in s])


def _types(columns: dict[str, tuple[str, int]]) -> Any:
    rules = column_rules([{"name": n, "type": t, "typmod": m} for n, (t, m) in columns.items()])
    return lambda node, schema, table, csn: rules


@pytest.mark.parametrize("case", DOCUMENTED["adaptive"], ids=lambda c: f"{c['type']}({c['typmod']})")
def test_adaptive_temporal_values_are_debeziums(case: dict[str, Any]) -> None:
    """`debezium-adaptive` writes the value Debezium's connector documents; `debezium` keeps the text."""
    change = {**LINE["changes"][1], "new": {"id": 7, "v": case["text"], "vs": [case["text"], None]}}
    line = json.dumps({**LINE, "changes": [change]}).encode()
    adaptive = DebeziumFormat(DATABASES, _types({"v": (case["type"], case["typmod"]),
                                                 "vs": ("_" + case["type"], case["typmod"])})).convert(line)  # fmt: skip
    assert adaptive is not None and json.loads(adaptive)["after"] == {
        "id": 7, "v": case["value"], "vs": [case["value"], None]
    }  # fmt: skip
    plain = DebeziumFormat(DATABASES).convert(line)
    assert plain is not None and json.loads(plain)["after"]["v"] == case["text"]


def test_adaptive_leaves_infinities_and_other_types_and_names_a_bad_value() -> None:
    rules = _types({"d": ("date", -1), "t": ("timestamptz", -1), "n": ("numeric", -1)})
    change = {**LINE["changes"][1], "new": {"id": 1, "d": "infinity", "t": "-infinity", "n": "1.50"}}
    out = DebeziumFormat({}, rules).convert(json.dumps({**LINE, "changes": [change]}).encode())
    assert out is not None and json.loads(out)["after"] == {
        "id": 1,
        "d": "infinity",
        "t": "-infinity",
        "n": "1.50",
    }
    bad = {**change, "new": {"id": 1, "d": "20/11/2026"}}
    with pytest.raises(ValueError, match=r"column 'd': date '20/11/2026'"):
        DebeziumFormat({}, rules).convert(json.dumps({**LINE, "changes": [bad]}).encode())
    with pytest.raises(ColumnTypesUnknown, match=r"node dn2's public.acct at csn 1042"):
        DebeziumFormat({}, lambda *a: None).convert(json.dumps({**LINE, "changes": [change]}).encode())


# --- the adaptive rules against the decoder's own text forms (an oracle: plain arithmetic) ----------------

_PG_EPOCH_US = 10_957 * 86_400_000_000  # 2000-01-01 after 1970-01-01


@given(st.integers(-(2**31) + 1, 2**31 - 2))
def test_dates_count_days_since_1970(pg_days: int) -> None:
    assert days_since_epoch(temporal.date_binary(struct.pack("!i", pg_days))) == pg_days + 10_957


@given(st.integers(-(2**63) + 1, 2**63 - 2))
def test_timestamps_count_microseconds_since_1970(pg_us: int) -> None:
    text = temporal.timestamp_iso(pg_us, utc=False)
    assert timestamp_us(text) == pg_us + _PG_EPOCH_US
    assert converter("timestamp", 3) is not None
    zoned = zoned_timestamp(temporal.timestamp_iso(pg_us, utc=True))
    assert zoned.endswith("Z") and timestamp_us(zoned[:-1]) == pg_us + _PG_EPOCH_US


@given(st.integers(0, 86_400_000_000), st.integers(-15 * 3600 - 59 * 60, 15 * 3600 + 59 * 60))
def test_times_count_microseconds_of_the_day_and_zoned_ones_are_in_utc(us: int, west: int) -> None:
    assert time_of_day_us(temporal.time_binary(struct.pack("!q", us))) == us
    zoned = zoned_time(temporal.timetz_binary(struct.pack("!qi", us, west)))
    assert zoned.endswith("Z") and time_of_day_us(zoned[:-1]) == (us + west * 1_000_000) % 86_400_000_000


@given(st.integers(-(2**40), 2**40), st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1))
def test_intervals_count_microseconds_with_debeziums_average_month(us: int, days: int, months: int) -> None:
    text = temporal.interval_binary(struct.pack("!qii", us, days, months))
    month_us = Fraction(365.25) / 12 * 86_400_000_000  # (MicroDuration's DAYS_PER_MONTH_AVG)
    assert interval_us(text) == months * month_us + days * 86_400_000_000 + us


# --- through a real server ------------------------------------------------------------------------------


def _relation(table: str, columns: list[tuple[str, str, int]]) -> str:
    cols = ", ".join(f'{{"name": "{n}", "type": "{t}", "oid": 0, "typmod": {m}}}' for n, t, m in columns)
    return (
        f'"schema": "public", "table": "{table}", "relid": 1, "replica_identity": "default", '
        f'"key": ["id"], "columns": [{cols}]'
    )


def test_a_subscriber_asks_for_adaptive_events_with_the_nodes_databases(tmp_path: Path) -> None:
    """Failed before: `debezium-adaptive` was an unknown format and `source.db` null."""
    columns = [("id", "int4", -1), ("at", "timestamp", -1), ("day", "date", -1)]
    rows = [{"id": i, "at": f"2018-06-20T15:13:16.{i:06d}", "day": "2018-06-20"} for i in range(1, 4)]
    later = [("id", "int4", -1), ("at", "timestamp", 3), ("day", "text", -1)]  # (ALTER TABLE at csn 3)
    with Changelog(str(tmp_path / "log")) as log:
        log.relations.add(1, "dn1", _relation("acct", columns))
        log.relations.add(3, "dn1", _relation("acct", later))
        for i, row in enumerate(rows, 1):
            if i == 3:
                row = {"id": 3, "at": "2018-06-20T15:13:16.003", "day": "2018-06-20"}
            change = {**LINE["changes"][1], "node": "dn1", "new": row}
            log.append(i, json.dumps({**LINE, "csn": i, "changes": [change]}).encode())
        log.sync()
        srv = serve(log, databases={"dn1": "shop"})
        try:
            with Changefeed(srv.address, format="debezium-adaptive") as feed:
                got = [json.loads(rec[1]) for _ in range(3) if (rec := feed.next(timeout=60)) is not None]
            assert [e["after"] for e in got] == [
                {"id": 1, "at": 1529507596000001, "day": 17702},
                {"id": 2, "at": 1529507596000002, "day": 17702},
                {"id": 3, "at": 1529507596003, "day": "2018-06-20"},  # (timestamp(3): ms; text stays text)
            ]
            assert {e["source"]["db"] for e in got} == {"shop"}
            with Changefeed(srv.address, format="debezium") as feed:
                rec = feed.next(timeout=60)
            assert rec is not None and json.loads(rec[1])["after"]["at"] == rows[0]["at"]
            assert json.loads(rec[1])["source"]["db"] == "shop"
        finally:
            srv.stop()


def test_adaptive_events_of_a_line_in_pieces_equal_the_whole_lines(tmp_path: Path) -> None:
    """A line larger than a message is converted a change at a time (csnd.service.linescan), the same way."""
    columns = [("id", "int4", -1), ("at", "timestamp", -1), ("pad", "text", -1)]
    changes = [
        {**LINE["changes"][1], "node": "dn1", "new": {"id": i, "at": f"2018-06-20T15:13:{i % 60:02d}", "pad": "x" * 500}}
        for i in range(200)
    ]  # fmt: skip
    big = json.dumps({**LINE, "csn": 1, "changes": changes}).encode()
    with Changelog(str(tmp_path / "log")) as log:
        log.relations.add(1, "dn1", _relation("acct", columns))
        log.append(1, big)
        log.sync()
        srv = serve(log, settings=FeedSettings(max_batch_bytes=16 << 10))
        try:
            with Changefeed(srv.address, format="debezium-adaptive") as feed:
                rec = feed.next(timeout=60)
        finally:
            srv.stop()
    whole = DebeziumFormat({}, _types({"at": ("timestamp", -1)})).convert(big)
    assert rec is not None and rec[1] == whole
    assert json.loads(rec[1].split(b"\n")[61])["after"]["at"] == 1529507581000000


def test_adaptive_without_the_column_types_is_refused_by_name(tmp_path: Path) -> None:
    with Changelog(str(tmp_path / "log")) as log:
        log.append(
            1, json.dumps(LINE).encode()
        )  # (no relation version: a changelog from before they were kept)
        log.sync()
        srv = serve(log)
        try:
            with pytest.raises(
                ChangefeedRejected, match=r"debezium-adaptive needs the column types of node dn1"
            ):
                Changefeed(srv.address, format="debezium-adaptive").next(timeout=60)
        finally:
            srv.stop()


def test_the_service_knows_each_live_nodes_database_as_libpq_does() -> None:
    sources = [
        ServedSource("postgresql://csnd@db1:5432/shop?sslmode=disable", "dn1"),
        ServedSource("postgresql://csnd@db2/", "dn2"),
        ServedSource("postgresql://db3/", None),
        ServedSource("/var/lib/csnd/dn4.pgstream", "dn4"),
    ]
    assert node_databases(sources, {"PGDATABASE": "eu"}) == {"dn1": "shop", "dn2": "eu", "dn3": "eu"}
    assert node_databases(sources[:2], {}) == {"dn1": "shop", "dn2": "csnd"}  # (libpq: the user's name)
