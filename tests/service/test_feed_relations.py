"""Relation lines over Subscribe and in the Python client: in force at the start, then in place, once.

A served changelog with relation versions; the client with `schemas=True`
gets the versions in force at its start first, each later one right before
the first transaction it is in force with, only for the tables its filter
keeps, and after a lost stream none it already handed out.
"""

from __future__ import annotations

import json
from pathlib import Path

from csnd.consumers.client import Changefeed, RelationRecord
from tests.service.feedkit import FAST, fill, open_log, serve


def body(table: str, version: int) -> str:
    cols = json.dumps([{"name": f"c{i}", "type": "int4", "oid": 23, "typmod": -1} for i in range(version)])
    return (
        f'"schema": "public", "table": "{table}", "relid": 1, "replica_identity": "default", '
        f'"key": ["c0"], "columns": {cols}'
    )


def kinds(records: list[tuple[int, bytes]]) -> list[tuple[str, int]]:
    return [("r" if type(r) is RelationRecord else "t", r[0]) for r in records]


def test_versions_come_in_force_first_then_in_place_and_never_twice(tmp_path: Path) -> None:
    log = open_log(str(tmp_path))
    written = fill(log, range(1, 41))
    for csn, table, version in [(3, "acct", 1), (5, "orders", 1), (20, "acct", 2), (30, "orders", 2)]:
        log.relations.add(csn, "dn1", body(table, version))
    server = serve(log, settings=FAST)
    try:
        with Changefeed(server.address, after_csn=10, schemas=True) as feed:
            got = [feed.next(timeout=30) for _ in range(30 + 4)]
            assert all(g is not None for g in got)
            records = [g for g in got if g is not None]
            assert kinds(records)[:2] == [("r", 3), ("r", 5)]  # in force at 10, by csn
            assert kinds(records)[2:] == (
                [("t", c) for c in range(11, 20)] + [("r", 20), ("t", 20)]
                + [("t", c) for c in range(21, 30)] + [("r", 30)] + [("t", c) for c in range(30, 41)]
            )  # fmt: skip
            assert [r for r in records if type(r) is not RelationRecord] == [
                (c, written[c]) for c in range(11, 41)
            ]
            line = json.loads(records[0][1])["relation"]
            assert (line["csn"], line["table"], len(line["columns"])) == (3, "acct", 1)
            # A lost stream: the next one sends the versions in force at 40 again; none is repeated.
            feed.ack(40)
            call = feed._call
            assert call is not None
            feed._lost(call, None)  # (as when the service ends the stream)
            more = fill(log, [41])
            rec = feed.next(timeout=30)
            assert rec == (41, more[41]) and type(rec) is not RelationRecord
            assert feed.reconnects == 1
    finally:
        server.stop()
        log.close()


def test_a_filter_keeps_its_tables_versions_only(tmp_path: Path) -> None:
    log = open_log(str(tmp_path))
    fill(log, range(1, 21))
    log.relations.add(3, "dn1", body("acct", 1))
    log.relations.add(5, "dn1", body("orders", 1))
    server = serve(log, settings=FAST)
    try:
        with Changefeed(server.address, tables=["public.orders"], schemas=True) as feed:
            records = []
            while (rec := feed.next(timeout=2)) is not None:
                records.append(rec)
            [i] = [i for i, r in enumerate(records) if type(r) is RelationRecord]  # (not acct's)
            rel = records[i]
            assert isinstance(rel, RelationRecord)
            assert json.loads(rel.line)["relation"]["table"] == "orders"
            assert records[i - 1][0] < 5 <= records[i + 1][0]  # right before the first transaction from 5
    finally:
        server.stop()
        log.close()
