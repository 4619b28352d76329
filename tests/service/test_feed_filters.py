"""Table filters at their edges: unknown tables, thousands of names, large lines read in pieces."""

from __future__ import annotations

import json
import os
import tracemalloc
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.consumers.client import Changefeed, fetch
from csnd.core.errors import ChangefeedRejected
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from csnd.service import FeedSettings
from csnd.service.debezium import debezium_events, to_debezium
from csnd.service.filtering import Reshaped, TableFilter, filter_line
from csnd.service.knowntables import KnownTables
from csnd.service.linescan import scan_changes
from tests.service.feedkit import FAST, TABLES, change, fill, line, serve


def body(schema: str, table: str) -> str:
    return (
        f'"schema": "{schema}", "table": "{table}", "relid": 1, "replica_identity": "default", '
        '"key": ["id"], "columns": [{"name": "id", "type": "int4", "oid": 23, "typmod": -1}]'
    )


@pytest.fixture
def log(tmp_path: object) -> Iterator[Changelog]:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        yield log


def test_a_table_no_source_publishes_is_refused(log: Changelog) -> None:
    """Today `--table public.acount` (a typo) is taken, and reads nothing for ever."""
    fill(log, range(1, 11))
    for i, (schema, table) in enumerate(TABLES, start=1):
        log.relations.add(i, "dn1", body(schema, table))
    srv = serve(log, settings=FAST)
    try:
        for tables, named in (
            (["public.acount"], "public.acount"),
            (["public.acct", "nosuch.*", "sales.acct", "public.nope"], "nosuch.*, public.nope"),
        ):
            with pytest.raises(
                ChangefeedRejected, match="no published table is named " + named.replace("*", r"\*")
            ):
                Changefeed(srv.address, tables=tables).next(timeout=30)
            with grpc.insecure_channel(srv.address) as ch, pytest.raises(grpc.RpcError) as rpc:
                list(pb_grpc.ChangefeedStub(ch).Fetch(pb.FetchRequest(tables=tables), timeout=30))
            assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert named in str(rpc.value.details())
        # known tables and schemas are taken
        with Changefeed(srv.address, tables=["public.acct", "sales.*", '"odd"."a.b"']) as feed:
            assert feed.next(timeout=30) is not None
        assert list(fetch(srv.address, tables=["public.orders"]))
    finally:
        srv.stop()


def test_known_tables_come_from_relations_and_publications(log: Changelog) -> None:
    known = KnownTables(log.relations)
    assert known.unknown(["public.anything"]) == []  # (nothing known yet: nothing refused)
    log.relations.add(1, "dn1", body("public", "acct"))
    assert known.unknown(["public.acct", "public.orders", "sales.*"]) == ["public.orders", "sales.*"]
    known.published = lambda: frozenset({("public", "orders")})
    assert known.unknown(["public.acct", "public.orders", "sales.*"]) == ["sales.*"]
    known.published = lambda: None  # (a publication that cannot be read now: what is known still counts)
    assert known.unknown(["public.orders"]) == ["public.orders"]


def test_thousands_of_table_names_filter_as_a_few_do(log: Changelog) -> None:
    written = fill(log, range(1, 201))
    names = [f"public.t{i}" for i in range(5000)] + ["public.acct", '"odd"."a.b"']
    srv = serve(log, settings=FAST)
    try:
        wanted = {("public", "acct"), ("odd", "a.b")}
        expected = [
            (c, k) for c, raw in sorted(written.items()) if (k := filter_line(raw, frozenset(wanted)))
        ]
        assert list(fetch(srv.address, tables=names)) == expected
        with Changefeed(srv.address, tables=names) as feed:
            assert [feed.next(timeout=30) for _ in expected] == expected
    finally:
        srv.stop()


names_st = st.lists(
    st.sampled_from(TABLES + [("public", f"t{i}") for i in range(30)] + [("sales", "*"), ("odd", "*")]),
    max_size=40,
)


def spec(schema: str, table: str) -> str:
    return f'"{schema}".*' if table == "*" else f'"{schema}"."{table}"'


@settings(max_examples=150, deadline=None)
@given(names=names_st, csns=st.lists(st.integers(1, 10_000), min_size=1, max_size=8))
def test_a_filter_of_many_names_agrees_with_the_oracle(names: list[tuple[str, str]], csns: list[int]) -> None:
    """The one-pass test of many names (past FEW_NAMES) keeps exactly what a per-change check keeps."""
    filt = TableFilter([spec(s, t) for s, t in names])
    tables = {(s, t) for s, t in names if t != "*"}
    schemas = {s for s, t in names if t == "*"}
    for csn in csns:
        raw = line(csn, [TABLES[(csn * 7 + j) % len(TABLES)] for j in range(csn % 4)])
        obj = json.loads(raw)
        kept = [c for c in obj["changes"] if (c["schema"], c["table"]) in tables or c["schema"] in schemas]
        want = (
            None
            if not kept
            else raw
            if len(kept) == len(obj["changes"])
            else json.dumps({**obj, "changes": kept}, ensure_ascii=False).encode()
        )
        assert filt.keep(raw) == (raw if not names else want)


def big_txn(csn: int, rows: int, small_every: int = 0) -> bytes:
    """A large line: `rows` changes of public.orders with a long value each; every `small_every`-th of public.acct."""
    changes = []
    for i in range(rows):
        table = "acct" if small_every and i % small_every == 0 else "orders"
        c = change(i, "public", table)
        if table == "orders":
            c["new"]["note"] = "x" * 60_000 + f' ]}} {i} "q" ünï'
        changes.append(c)
    obj = {
        "csn": csn,
        "gid": f"g-{csn}",
        "commit_time": "2026-11-22T10:00:00.123456+00:00",
        "nodes": {"dn1": {"xid": 700 + csn, "commit_lsn": f"0/{csn:X}"}},
        "changes": changes,
    }
    return json.dumps(obj, ensure_ascii=False).encode()


def pieces_of(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(0, 12),
    size=st.integers(1, 400),
    keep=st.sets(st.sampled_from([t for t in TABLES]), max_size=3),
)
def test_a_line_in_pieces_filters_and_converts_as_a_whole_one(
    rows: int, size: int, keep: set[tuple[str, str]]
) -> None:
    raw = line(rows + 1, [TABLES[(rows + j) % len(TABLES)] for j in range(rows)])
    filt = TableFilter([spec(s, t) for s, t in sorted(keep)])
    whole = filt.keep(raw) if filt else raw
    got = b"".join(filt.keep_pieces(pieces_of(raw, size), 7)) if filt else raw
    assert got == (whole or b"")
    assert all(len(p) == 7 for p in list(filt.keep_pieces(pieces_of(raw, size), 7))[:-1])
    reshaped = Reshaped(filt, to_debezium, debezium_events)
    assert b"".join(reshaped.keep_pieces(pieces_of(raw, size), 5)) == (reshaped.keep(raw) or b"")
    assert [c for _, c in scan_changes(pieces_of(raw, size))] == json.loads(raw)["changes"]


@pytest.mark.parametrize(
    "bad",
    [b'{"csn": 1, "changes": [{"a": 1} {"b": 2}]}', b'{"csn": 1}', b'[1]', b'{"csn": 1, "changes": [1]}',
     b'{"csn": 1, "changes": [{"a": "\xff"}]}', b'{"csn": 1, "changes": [{"a": 1}]', b'{"csn": 1, "changes": [{"a": tru}]}'],
)  # fmt: skip
def test_a_broken_line_in_pieces_is_a_value_error(bad: bytes) -> None:
    for size in (1, 3, 1000):
        with pytest.raises(ValueError, match="not a transaction line"):
            list(scan_changes(pieces_of(bad, size)))


def test_a_large_filtered_line_is_held_a_change_at_a_time(log: Changelog) -> None:
    """Today a filtered or Debezium stream reads a large record whole (`filt.keep(line.read())`)."""
    big = big_txn(2, 400, small_every=50)  # about 24 MB; the stream keeps 8 small changes of it
    assert len(big) > 20 << 20
    log.append(1, line(1, [("public", "acct")]))
    log.append(2, big)
    log.append(3, line(3, [("public", "acct")]))
    log.sync()
    del big
    srv = serve(log, settings=FeedSettings(max_batch_bytes=256 << 10, keepalive_s=0.2, client_timeout_s=30))
    try:
        for fmt in ("native", "debezium"):
            tracemalloc.start()
            try:
                with Changefeed(srv.address, tables=["public.acct"], format=fmt) as feed:
                    got = [feed.next(timeout=60) for _ in range(3)]
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert [g[0] for g in got if g is not None] == [1, 2, 3]
            kept = got[1][1] if got[1] is not None else b""
            if fmt == "native":
                assert [c["cid"] for c in json.loads(kept)["changes"]] == list(range(0, 400, 50))
            else:
                assert [json.loads(e)["transaction"]["total_order"] for e in kept.split(b"\n")] == list(
                    range(1, 9)
                )
            # a change (60 KB) and a few pieces (256 KB) at a time, not the 24 MB line
            assert peak < 8 << 20, f"{fmt}: peak {peak} bytes"
    finally:
        srv.stop()


def test_an_incremental_chunk_without_changes_goes_to_its_tables_subscribers() -> None:
    """A table's empty last chunk is what says the table is done (docs/design.md section 7, "Deleted rows")."""
    txn = json.loads(line(5, []))
    txn["snapshot"] = {"node": "dn1", "schema": "public", "table": "acct", "incremental": "j", "chunk": 3,
                       "last": True, "since": 2, "rows": 0, "left_out": 0}  # fmt: skip
    chunk = json.dumps(txn).encode()
    assert TableFilter(["public.acct"]).keep(chunk) == chunk
    assert TableFilter(["public.*"]).keep(chunk) == chunk
    assert TableFilter(["public.other"]).keep(chunk) is None
    assert TableFilter([]).keep(chunk) == chunk
    assert (
        Reshaped(TableFilter(["public.acct"]), to_debezium, debezium_events).keep(chunk) is None
    )  # (no event)
    # a line without changes and without such a marker goes to no filtered subscriber, as before
    assert filter_line(line(6, []), frozenset({("public", "acct")})) is None
    txn["snapshot"] = {"done": True, "nodes": ["dn1"], "tables": 1, "rows": 0, "first_csn": 1}
    assert filter_line(json.dumps(txn).encode(), frozenset({("public", "acct")})) is None
