"""Row decoding: exact bodies from real pgoutput streams in both forms, and bad input.

The end-to-end tests make a real PostgreSQL 15 write pgoutput messages
(`pg_logical_slot_peek_binary_changes` gives the same messages a walsender
streams), once with `binary 'true'` and once with `binary 'false'`, decode
both, and compare each body with the one docs/design.md section 7 prescribes, written
out by hand.  The unit tests build messages with `reader.pgoutput`'s encoders.
Last, the synthetic cluster's streams must decode to exactly the changes of
its expected output, an oracle written independently of this decoder.
"""

from __future__ import annotations

import json
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import DecodeError
from csnd.core.ids import Lsn, Xid, lsn_from_str, lsn_to_str
from csnd.decoder import DecodedChange, RelationCache, relations, rowreader, rows
from csnd.decoder.rows import decode_change, row_change_body
from csnd.gtm import GenerateOptions, generate_cluster
from csnd.gtm import pgtypes as PT
from csnd.reader import pgoutput as p
from csnd.reader.events import iter_events
from csnd.reader.pgoutput import UNCHANGED, Change, Column, Relation, Truncate, TypeMsg
from csnd.reader.streamfile import StreamFileReader
from tests.fixtures.pg import PgDatabase

Message = Any

# --- end to end: a real server's stream -------------------------------------------


def slot_name(pg: PgDatabase) -> str:
    return f"decoder_{pg.name}"  # slots are cluster-wide; the database name is unique


def peek(pg: PgDatabase, binary: bool) -> list[tuple[int, Message]]:
    rows = pg.execute(
        f"SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes('{slot_name(pg)}', NULL, NULL, "
        f"'proto_version', '2', 'publication_names', 'pub', 'binary', '{str(binary).lower()}')"
    )
    parser = p.PgOutputParser()
    return [(lsn_from_str(str(lsn)), parser.parse(bytes(data))) for lsn, data in rows]  # type: ignore[call-overload]


def decode_stream(
    messages: list[tuple[int, Message]], binary: bool, cache: RelationCache | None = None
) -> list[str]:
    """Every decoded change's body after its `"lsn": "X/X", ` (checked to be the change's own)."""
    cache = cache if cache is not None else RelationCache(binary=binary)
    out = []
    for lsn, msg in messages:
        if isinstance(msg, (Relation, TypeMsg)):
            cache.apply(msg, lsn)
        elif isinstance(msg, (Change, Truncate)):
            for ch in decode_change(msg, Lsn(lsn), cache, binary):
                assert ch.lsn == lsn and ch.xid is None
                out.append(without_lsn(ch))
    return out


def without_lsn(ch: DecodedChange) -> str:
    """A body without its leading `"lsn": "X/X", `, which must name the change's own LSN."""
    head = f'"lsn": "{lsn_to_str(ch.lsn)}", '
    assert ch.body.startswith(head), ch.body
    return ch.body[len(head) :]


def both_forms(pg: PgDatabase, enums: str = "") -> list[str]:
    """The bodies of the slot's stream; binary and text forms must give the same."""
    declared = pg.execute(f"SELECT oid, typarray FROM pg_type WHERE typname IN ({enums})") if enums else []
    results = []
    for binary in (True, False):
        cache = RelationCache(binary=binary)
        for oid, array_oid in declared:
            cache.declare_enum(int(oid), int(array_oid))  # type: ignore[call-overload]
        results.append(decode_stream(peek(pg, binary), binary, cache))
    assert results[0] == results[1]
    for body in results[0]:
        json.loads("{" + body + "}")  # each body is a valid JSON object's inside
    return results[0]


def setup(pg: PgDatabase, ddl: str) -> None:
    pg.execute(ddl)
    pg.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    pg.execute(f"SELECT pg_create_logical_replication_slot('{slot_name(pg)}', 'pgoutput')")


ACCT_DDL = """
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE DOMAIN posint AS int4 CHECK (VALUE > 0);
CREATE DOMAIN dmood AS mood;
CREATE TABLE acct (
    id int PRIMARY KEY, owner text, balance numeric(12, 2), doc jsonb, big int8, f4 real, f8 float8,
    ts timestamptz, old_ts timestamp, d date, m mood, ms mood[], pos posint, dm dmood, tags text[],
    grid int4[], b bytea, u uuid, ip inet, iv interval, t time, bits varbit, flag bool, acl aclitem
);
"""


def test_every_type_in_both_forms(pg: PgDatabase) -> None:
    setup(pg, ACCT_DDL)
    pg.execute(
        "INSERT INTO acct VALUES (7, 'ann é', 10.5, '{\"k\": [1, 2], \"n\": null}', 9007199254740993, 0.1, "
        "'-0', '1999-12-31 23:59:59.5+00', '1969-07-20 20:17:40', 'infinity', 'happy', '{happy,NULL,sad}', 5, "
        "'sad', '{\"a,b\",NULL,\"q\\\"\",\"NULL\"}', '{{1,NULL},{3,4}}', '\\x00ff', "
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '::ffff:1.2.3.4', '-1 days +02:03:00', '24:00:00', B'101', "
        "true, 'postgres=arwdDxt/postgres')"
    )
    pg.execute("INSERT INTO acct (id, f8, ts, old_ts) VALUES (8, 'NaN', '-infinity', '0044-03-15 BC')")
    bodies = both_forms(pg, enums="'mood'")
    assert bodies == [
        '"op": "insert", "schema": "public", "table": "acct", "key": ["id"], "old": null, "new": {"id": 7, "owner": "ann é", '
        '"balance": "10.50", "doc": {"k": [1, 2], "n": null}, "big": 9007199254740993, "f4": 0.1, "f8": -0.0, '
        '"ts": "1999-12-31T23:59:59.500000+00:00", "old_ts": "1969-07-20T20:17:40", "d": "infinity", '
        '"m": "happy", "ms": ["happy", null, "sad"], "pos": 5, "dm": "sad", "tags": ["a,b", null, "q\\"", "NULL"], '
        '"grid": [[1, null], [3, 4]], "b": "\\\\x00ff", "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", '
        '"ip": "::ffff:1.2.3.4", "iv": "-1 days +02:03:00", "t": "24:00:00", "bits": "101", "flag": true, '
        '"acl": "postgres=arwdDxt/postgres"}',
        '"op": "insert", "schema": "public", "table": "acct", "key": ["id"], "old": null, "new": {"id": 8, "owner": null, '
        '"balance": null, "doc": null, "big": null, "f4": null, "f8": "NaN", "ts": "-infinity", '
        '"old_ts": "-000043-03-15T00:00:00", "d": null, "m": null, "ms": null, "pos": null, "dm": null, '
        '"tags": null, "grid": null, "b": null, "u": null, "ip": null, "iv": null, "t": null, "bits": null, '
        '"flag": null, "acl": null}',
    ]


def test_replica_identities_and_truncate(pg: PgDatabase) -> None:
    setup(
        pg,
        """
        CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12, 2));
        CREATE TABLE full_t (id int, note text);
        ALTER TABLE full_t REPLICA IDENTITY FULL;
        CREATE TABLE idx_t (a int NOT NULL, c text, b text NOT NULL);
        CREATE UNIQUE INDEX idx_t_ba ON idx_t (b, a);
        ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_ba;
        """,
    )
    for sql in [
        "INSERT INTO acct VALUES (7, 'ann', 10.5)",
        "UPDATE acct SET balance = 3 WHERE id = 7",
        "UPDATE acct SET id = 8, owner = 'bo' WHERE id = 7",
        "DELETE FROM acct WHERE id = 8",
        "INSERT INTO full_t VALUES (1, NULL)",
        "UPDATE full_t SET note = 'x'",
        "DELETE FROM full_t",
        "INSERT INTO idx_t VALUES (1, 'v', 'k')",
        "UPDATE idx_t SET c = 'w'",
        "UPDATE idx_t SET b = 'k2'",
        "DELETE FROM idx_t",
        "TRUNCATE full_t, idx_t",
    ]:
        pg.execute(sql)
    acct = '"schema": "public", "table": "acct", "key": ["id"]'
    full = '"schema": "public", "table": "full_t", "key": ["id", "note"]'  # FULL: every column
    idx = '"schema": "public", "table": "idx_t", "key": ["a", "b"]'  # the index's, in column order
    assert both_forms(pg) == [
        f'"op": "insert", {acct}, "old": null, "new": {{"id": 7, "owner": "ann", "balance": "10.50"}}',
        f'"op": "update", {acct}, "old": null, "new": {{"id": 7, "owner": "ann", "balance": "3.00"}}',
        f'"op": "update", {acct}, "old": {{"id": 7}}, "new": {{"id": 8, "owner": "bo", "balance": "3.00"}}',
        f'"op": "delete", {acct}, "old": {{"id": 8}}, "new": null',
        f'"op": "insert", {full}, "old": null, "new": {{"id": 1, "note": null}}',
        f'"op": "update", {full}, "old": {{"id": 1, "note": null}}, "new": {{"id": 1, "note": "x"}}',
        f'"op": "delete", {full}, "old": {{"id": 1, "note": "x"}}, "new": null',
        f'"op": "insert", {idx}, "old": null, "new": {{"a": 1, "c": "v", "b": "k"}}',
        f'"op": "update", {idx}, "old": null, "new": {{"a": 1, "c": "w", "b": "k"}}',
        f'"op": "update", {idx}, "old": {{"a": 1, "b": "k"}}, "new": {{"a": 1, "c": "w", "b": "k2"}}',
        f'"op": "delete", {idx}, "old": {{"a": 1, "b": "k2"}}, "new": null',
        f'"op": "truncate", {full}, "old": null, "new": null',
        f'"op": "truncate", {idx}, "old": null, "new": null',
    ]


def test_unchanged_toast(pg: PgDatabase) -> None:
    setup(
        pg,
        """
        CREATE TABLE big (id int PRIMARY KEY, payload text, n int, doc jsonb);
        ALTER TABLE big ALTER COLUMN payload SET STORAGE EXTERNAL;
        ALTER TABLE big ALTER COLUMN doc SET STORAGE EXTERNAL;
        CREATE TABLE big_full (id int, payload text, n int);
        ALTER TABLE big_full ALTER COLUMN payload SET STORAGE EXTERNAL;
        ALTER TABLE big_full REPLICA IDENTITY FULL;
        """,
    )
    pg.execute(
        "INSERT INTO big VALUES (1, repeat('x', 10000), 0, "
        "('{\"k\": \"' || repeat('y', 10000) || '\"}')::jsonb)"
    )
    pg.execute("UPDATE big SET n = 1")
    pg.execute("UPDATE big SET n = 2, payload = 'short'")
    pg.execute("INSERT INTO big_full VALUES (1, repeat('z', 10000), 0)")
    pg.execute("UPDATE big_full SET n = 1")
    bodies = both_forms(pg)
    assert len(bodies) == 5
    head = '"op": "update", "schema": "public", "table": "big", "key": ["id"], "old": null, '
    assert bodies[1] == head + '"new": {"id": 1, "n": 1}, "unchanged": ["payload", "doc"]'
    assert bodies[2] == head + '"new": {"id": 1, "payload": "short", "n": 2}, "unchanged": ["doc"]'
    last = json.loads("{" + bodies[4] + "}")
    assert last["old"] == {"id": 1, "payload": "z" * 10000, "n": 0}  # the full old row, detoasted
    assert last["new"] == {"id": 1, "n": 1} and last["unchanged"] == ["payload"]
    first = json.loads("{" + bodies[0] + "}")
    assert first["new"]["doc"] == {"k": "y" * 10000} and "unchanged" not in first


def test_ddl_mid_stream(pg: PgDatabase) -> None:
    setup(pg, "CREATE TABLE ddl (id int PRIMARY KEY, v text)")
    for sql in [
        "INSERT INTO ddl VALUES (1, 'a')",
        "ALTER TABLE ddl ALTER COLUMN v TYPE varchar(10)",
        "INSERT INTO ddl VALUES (2, 'b')",
        "ALTER TABLE ddl DROP COLUMN v",
        "INSERT INTO ddl VALUES (3)",
        "ALTER TABLE ddl ADD COLUMN w numeric(5, 1) DEFAULT 42",
        "UPDATE ddl SET id = 10 WHERE id = 1",
    ]:
        pg.execute(sql)
    relations = [m for _, m in peek(pg, True) if isinstance(m, Relation)]
    assert [[c.type_oid for c in r.columns] for r in relations] == [[23, 25], [23, 1043], [23], [23, 1700]]
    ddl = '"schema": "public", "table": "ddl", "key": ["id"]'
    assert both_forms(pg) == [
        f'"op": "insert", {ddl}, "old": null, "new": {{"id": 1, "v": "a"}}',
        f'"op": "insert", {ddl}, "old": null, "new": {{"id": 2, "v": "b"}}',
        f'"op": "insert", {ddl}, "old": null, "new": {{"id": 3}}',
        f'"op": "update", {ddl}, "old": {{"id": 1}}, "new": {{"id": 10, "w": "42.0"}}',
    ]


def test_unreadable_binary_type_fails_at_the_relation(pg: PgDatabase) -> None:
    setup(pg, "CREATE TABLE price (id int PRIMARY KEY, amount money, r tstzrange)")
    pg.execute("INSERT INTO price VALUES (1, 1.5, '[2026-01-01 00:00+00,)')")
    messages = peek(pg, True)
    relation = next((lsn, m) for lsn, m in messages if isinstance(m, Relation))
    with pytest.raises(DecodeError) as info:
        RelationCache(binary=True).apply(relation[1], relation[0])
    text = str(info.value)
    assert 'column "amount" has type money (oid 790)' in text
    assert 'column "r" has type tstzrange (oid 3910)' in text
    assert "relation public.price" in text and "text mode" in text
    # a cache not told the stream is binary still refuses the change, never decodes it wrongly
    with pytest.raises(DecodeError, match="cannot decode in binary form"):
        decode_stream(messages, True, RelationCache())
    (body,) = decode_stream(peek(pg, False), False)
    assert json.loads("{" + body + "}")["new"] == {
        "id": 1,
        "amount": "$1.50",
        "r": json.loads("{" + body + "}")["new"]["r"],
    }


def test_undeclared_user_types_are_text_only(pg: PgDatabase) -> None:
    setup(
        pg,
        "CREATE TYPE mood AS ENUM ('happy'); CREATE TYPE pair AS (a int, b text);"
        "CREATE TABLE u (id int PRIMARY KEY, m mood, pr pair)",
    )
    pg.execute("INSERT INTO u VALUES (1, 'happy', '(1,x)')")
    with pytest.raises(DecodeError) as info:
        decode_stream(peek(pg, True), True)
    assert 'column "m" has type user type public.mood' in str(info.value)
    assert 'column "pr" has type user type public.pair' in str(info.value)
    assert decode_stream(peek(pg, False), False) == [
        '"op": "insert", "schema": "public", "table": "u", "key": ["id"], "old": null, '
        '"new": {"id": 1, "m": "happy", "pr": "(1,x)"}'
    ]


# --- unit tests: messages built with the encoders ---------------------------------


def relation(
    relid: int, *cols: tuple[str, int, bool], name: str = "acct", xid: int | None = None
) -> Relation:
    columns = [Column(1 if key else 0, n, oid, -1) for n, oid, key in cols]
    m = p.parse_message(p.encode_relation(relid, "public", name, "d", columns, xid=xid), xid is not None)
    assert isinstance(m, Relation)
    return m


def change(message: bytes, in_stream: bool = False) -> Change:
    m = p.parse_message(message, in_stream)
    assert isinstance(m, Change)
    return m


ACCT = relation(16384, ("id", 20, True), ("owner", 25, False), ("balance", 1700, False))
I8 = (1 << 62).to_bytes(8, "big")


def cache_with(*relations: Relation, binary: bool = True) -> RelationCache:
    cache = RelationCache(binary=binary)
    for r in relations:
        cache.apply(r)
    return cache


def test_bodies_and_decoded_change_fields() -> None:
    cache = cache_with(ACCT)
    ins = change(p.encode_insert(16384, [I8, "é", None], xid=745), in_stream=True)
    [got] = decode_change(ins, Lsn(0x16B3600), cache, True)
    assert got == DecodedChange(
        Lsn(0x16B3600),
        Xid(745),
        "insert",
        '"lsn": "0/16B3600", "op": "insert", "schema": "public", "table": "acct", "key": ["id"], "old": null, '
        '"new": {"id": 4611686018427387904, "owner": "é", "balance": null}',
    )
    upd = change(p.encode_update(16384, [I8, UNCHANGED, "1.50"], [I8, None, None], "K"))
    [got] = decode_change(upd, Lsn(1), cache, True)
    assert got.op == "update" and got.xid is None
    assert got.body == (
        '"lsn": "0/1", "op": "update", "schema": "public", "table": "acct", "key": ["id"], '
        '"old": {"id": 4611686018427387904}, '
        '"new": {"id": 4611686018427387904, "balance": "1.50"}, "unchanged": ["owner"]'
    )
    dele = change(p.encode_delete(16384, [I8, "x", None], "O"))
    [got] = decode_change(dele, Lsn(2), cache, True)
    assert got.body.endswith('"old": {"id": 4611686018427387904, "owner": "x", "balance": null}, "new": null')
    trunc = p.parse_message(p.encode_truncate([16384, 16384]), False)
    assert isinstance(trunc, Truncate)
    assert [c.body for c in decode_change(trunc, Lsn(3), cache, True)] == [
        '"lsn": "0/3", "op": "truncate", "schema": "public", "table": "acct", "key": ["id"], "old": null, '
        '"new": null'
    ] * 2


def test_a_later_relation_replaces_the_table() -> None:
    cache = cache_with(ACCT)
    cache.apply(relation(16384, ("id", 20, True), ("owner", 1043, False), name="acct2"))
    [got] = decode_change(change(p.encode_insert(16384, [I8, "v"])), Lsn(0), cache, True)
    assert got.body.endswith(
        '"table": "acct2", "key": ["id"], "old": null, "new": {"id": 4611686018427387904, "owner": "v"}'
    )
    assert len(cache) == 1 and 16384 in cache


def test_domains_resolve_through_type_messages() -> None:
    cache = RelationCache(binary=True)
    cache.apply(TypeMsg(None, 16500, "", "int4"))  # CREATE DOMAIN posint AS int4
    cache.apply(TypeMsg(None, 16501, "", "_int4"))  # CREATE DOMAIN ints AS int4[]
    cache.apply(TypeMsg(None, 16510, "public", "mood"))  # the enum
    cache.apply(TypeMsg(None, 16520, "public", "mood"))  # CREATE DOMAIN dmood AS mood
    cache.declare_enum(16510, 16509)
    cache.apply(
        relation(1, ("p", 16500, True), ("ps", 16501, False), ("m", 16510, False), ("dm", 16520, False))
    )
    array = b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x17\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x04\x00\x00\x00\x09"
    for values in ([b"\x00\x00\x00\x05", array, b"sad", b"happy"], ["5", "{9}", "sad", "happy"]):
        [got] = decode_change(change(p.encode_insert(1, list(values))), Lsn(0), cache, True)
        assert got.body.endswith('"new": {"p": 5, "ps": [9], "m": "sad", "dm": "happy"}')


def test_types_sent_as_text_in_binary_streams_are_fine() -> None:
    cache = cache_with(relation(1, ("id", 23, True), ("acl", 1033, False), ("n", 19, False)), binary=True)
    values: list[p.TupleValue] = [b"\x00\x00\x00\x01", "a=r/b", "nm"]
    [got] = decode_change(change(p.encode_insert(1, values)), Lsn(0), cache, True)
    assert got.body.endswith('"new": {"id": 1, "acl": "a=r/b", "n": "nm"}')
    # and a binary value of a text-only type in a stream said to be text is refused
    text_cache = cache_with(relation(2, ("amount", 790, False)), binary=False)
    with pytest.raises(DecodeError, match=r'column "amount" of type money .* arrived in binary form'):
        decode_change(change(p.encode_insert(2, [b"\x00" * 8])), Lsn(5), text_cache, False)


def test_unknown_relation() -> None:
    with pytest.raises(DecodeError) as info:
        decode_change(
            change(p.encode_insert(99, [None], xid=12), in_stream=True), Lsn(0x16B3748), RelationCache(), True
        )
    assert str(info.value) == (
        "change for unknown relation id 99: no Relation message for it came first; "
        "the stream began after it was sent (a cut or resumed recording) or is corrupt (xid 12) at 0/16B3748"
    )
    trunc = p.parse_message(p.encode_truncate([99]), False)
    assert isinstance(trunc, Truncate)
    with pytest.raises(DecodeError, match="truncate: change for unknown relation id 99"):
        decode_change(trunc, Lsn(0), RelationCache(), True)


def test_bad_values_name_the_column() -> None:
    cache = cache_with(ACCT)
    with pytest.raises(DecodeError) as info:
        decode_change(
            change(p.encode_insert(16384, [b"\x00\x01", None, None], xid=9), True), Lsn(0x10), cache, True
        )
    err = info.value
    assert (err.lsn, err.xid) == (0x10, 9)
    assert 'cannot decode column "id" (int8, binary value of 2 bytes) of public.acct (relid 16384)' in str(
        err
    )
    again = pickle.loads(pickle.dumps(err))  # errors cross process boundaries
    assert str(again) == str(err) and type(again) is DecodeError
    with pytest.raises(DecodeError, match='column "id" \\(int8, text value of 3 characters\\)'):
        decode_change(change(p.encode_insert(16384, ["abc", None, None])), Lsn(0), cache, False)


def test_corrupt_changes() -> None:
    cache = cache_with(ACCT)
    with pytest.raises(DecodeError, match=r"tuple of 2 columns for public.acct \(relid 16384\) of 3 columns"):
        decode_change(change(p.encode_insert(16384, [I8, None])), Lsn(0), cache, True)
    with pytest.raises(DecodeError, match=r"tuple of 1 columns"):
        decode_change(change(p.encode_delete(16384, [I8], "K")), Lsn(0), cache, True)
    with pytest.raises(DecodeError, match=r"update of public.acct \(relid 16384\): update data truncated"):
        decode_change(Change("U", None, 16384, b"K\x00\x00"), Lsn(0x20), cache, True)
    with pytest.raises(DecodeError, match=r"old key of public\.acct .* has an unchanged TOAST value"):
        decode_change(change(p.encode_delete(16384, [UNCHANGED, None, None], "K")), Lsn(0), cache, True)
    with pytest.raises(DecodeError, match=r"old row of public\.acct .* has unchanged TOAST values"):
        decode_change(change(p.encode_delete(16384, [I8, UNCHANGED, None], "O")), Lsn(0), cache, True)
    with pytest.raises(DecodeError, match="unknown change kind 'X'"):
        decode_change(Change("X", None, 16384, b""), Lsn(0), cache, True)


def _outcome(kind: str, data: bytes, cache: RelationCache, binary: bool) -> tuple[str, ...]:
    try:
        return ("body", row_change_body(kind, None, 16384, data, 0x10, cache, binary))
    except DecodeError as e:
        return ("error", str(e))


_CELL = st.one_of(
    st.none(),
    st.just(UNCHANGED),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("int8", v)),
    st.text(max_size=8).map(lambda v: ("text", v)),
    st.decimals(allow_nan=False, allow_infinity=False, places=2).map(lambda v: ("numeric", v)),
    st.binary(max_size=9),  # anything at all in binary
)


@settings(max_examples=300, deadline=None)
@given(
    cells=st.lists(_CELL, min_size=2, max_size=4),
    binary=st.booleans(),
    stream_binary=st.booleans(),
    kind=st.sampled_from(["I", "U"]),
    cut=st.none() | st.integers(0, 60),
    flip=st.none() | st.tuples(st.integers(0, 60), st.integers(1, 255)),
    junk=st.binary(max_size=2),
)
def test_the_insert_fast_path_says_what_the_checked_path_says(
    cells: list[Any],
    binary: bool,
    stream_binary: bool,
    kind: str,
    cut: int | None,
    flip: tuple[int, int] | None,
    junk: bytes,
) -> None:
    """Row tuples read straight off the wire give the body -- or the error -- of split + `_row`.

    Both fast paths, each alone and together: the table's compiled reader and the `_row_wire` loop
    behind it, in binary and text streams (they differ in which value kind the reader tries first).
    Tuples of valid and arbitrary values, of the table's width or not, cut short, with a byte changed or
    bytes added after: the fast path must never say something the checked path would not.
    """
    types = {"int8": PT.INT8, "text": PT.TEXT, "numeric": PT.NUMERIC}
    wire: list[Any] = []
    for c in cells:
        if isinstance(c, tuple):
            wire.append(types[c[0]].cell(c[1], binary)[0])
        else:
            wire.append(c)
    data = bytearray(p.encode_insert(16384, wire)[5:])  # after 'I' and the relid: 'N' tuple
    if cut is not None:
        del data[cut:]
    if flip is not None and flip[0] < len(data):
        data[flip[0]] ^= flip[1]
    data += junk
    never = lambda *_: None  # noqa: E731 - a fast path that always gives up
    outcomes = []
    for compiled, loop in [(True, True), (True, False), (False, True), (False, False)]:
        # (the name `Table` builds its reader by: the C reader's or its twin's, whichever runs)
        with mock.patch.object(
            relations, "row_reader", rowreader.row_reader if compiled else lambda *_: never
        ):
            cache = cache_with(ACCT, binary=stream_binary)
        with mock.patch.object(rows, "_row_wire", rows._row_wire if loop else never):
            outcomes.append(_outcome(kind, bytes(data), cache, binary))
    assert outcomes[1:] == outcomes[:-1], "compiled+loop, compiled only, loop only, checked"


@pytest.mark.parametrize("binary", [True, False])
def test_the_compiled_row_reader_takes_plain_rows_and_odd_column_names(binary: bool) -> None:
    """A row of values and NULLs is read by the table's compiled reader (not the fallbacks), names as JSON.

    Column names reach the reader's %-format: a `%` or a quote in one must come out as the name.
    """
    odd = relation(16390, ("100%s", 20, True), ('say "%d"', 25, False), ("n", 1700, False), name="odd")
    cache = cache_with(odd, binary=binary)
    wire = [PT.INT8.cell(7, binary)[0], PT.TEXT.cell("hé %s", binary)[0], None]
    data = p.encode_insert(16390, wire)[5:]
    table = cache.table(16390)
    read = table.read_row(data, 1, len(data))
    assert read is not None and read[1] == len(data)
    with mock.patch.object(rows, "_row_wire", lambda *_: None):  # the compiled reader alone
        body = row_change_body("I", None, 16390, data, 0x10, cache, binary)
    assert json.loads("{" + body + "}")["new"] == {"100%s": 7, 'say "%d"': "hé %s", "n": None}
    unchanged = p.encode_insert(16390, [wire[0], UNCHANGED, None])[5:]
    assert table.read_row(unchanged, 1, len(unchanged)) is None  # left to `_row_wire`
    assert '"unchanged": ["say \\"%d\\""]' in row_change_body(
        "I", None, 16390, unchanged, 0x10, cache, binary
    )


# --- the synthetic cluster's streams against its expected output -------------------


@pytest.mark.parametrize("binary", [True, False])
def test_generated_cluster_decodes_to_its_expected_changes(tmp_path: Path, binary: bool) -> None:
    """Every change of gtm's expected output (an independent oracle) comes out of decoding, byte for byte."""
    options = GenerateOptions(large_ratio=0.05, abort_ratio=0.15, large_txn_changes=100, ddl_every=40)
    summary = generate_cluster(tmp_path, 2, 200, seed=11, binary=binary, options=options)
    decoded: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in summary.files:
        with StreamFileReader(path) as f:
            assert f.header.binary == binary
            cache = RelationCache(binary=binary)
            for lsn, msg in iter_events(f, f.header.node, path):
                if isinstance(msg, (Relation, TypeMsg)):
                    cache.apply(msg, lsn)
                elif isinstance(msg, (Change, Truncate)):
                    for ch in decode_change(msg, lsn, cache, binary):
                        decoded[(f.header.node, lsn_to_str(ch.lsn))].append(ch.body)
    checked = 0
    for line in (tmp_path / "expected.jsonl").read_text().splitlines():
        for c in json.loads(line)["changes"]:
            keys = [
                "lsn",
                "op",
                "schema",
                "table",
                "key",
                "old",
                "new",
                *(["unchanged"] if "unchanged" in c else []),
            ]
            body = ", ".join(f"{json.dumps(k)}: {json.dumps(c[k], ensure_ascii=False)}" for k in keys)
            assert body in decoded[(c["node"], c["lsn"])], (c["node"], c["lsn"])
            checked += 1
    assert checked > 500
