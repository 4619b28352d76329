"""Enums, composites, ranges and multiranges: the same JSON from a binary and a text stream.

Against a live server: the slot's stream is peeked in both forms and decoded
by a cache told the source's user types as a live source tells it
(`rows.USER_TYPES_QUERY`); the two must give the same bodies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from csnd.core.errors import DecodeError, StreamFormatError
from csnd.core.ids import lsn_to_str
from csnd.decoder import RelationCache
from csnd.decoder.rows import USER_TYPES_QUERY
from csnd.reader.pgoutput import Relation, TypeMsg
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import StreamHeader, StreamWriter
from tests.decoder.test_rows import decode_stream, peek, setup
from tests.fixtures.pg import PgDatabase


def declared_cache(pg: PgDatabase, binary: bool) -> RelationCache:
    cache = RelationCache(binary=binary)
    cache.declare_types((int(o), str(k), int(a), int(s)) for o, k, a, s in pg.execute(USER_TYPES_QUERY))  # type: ignore[call-overload]
    return cache


def both_forms(pg: PgDatabase) -> list[dict[str, object]]:
    """The `new` rows of the slot's stream, decoded from binary and from text; the two must agree."""
    results = [
        decode_stream(peek(pg, binary), binary, declared_cache(pg, binary)) for binary in (True, False)
    ]
    assert results[0] == results[1]
    return [json.loads("{" + body + "}")["new"] for body in results[0]]


def test_arrays_of_enums_and_composites_are_json_arrays_in_both_forms(pg: PgDatabase) -> None:
    setup(
        pg,
        "CREATE TYPE mood AS ENUM ('a', 'b c', 'd\"e');"
        "CREATE TYPE pair AS (n int, s text);"
        "CREATE TABLE u (id int PRIMARY KEY, m mood, ms mood[], p pair, ps pair[], grid mood[][])",
    )
    pg.execute(
        'INSERT INTO u VALUES (1, \'a\', \'{"b c",NULL,"d\\"e"}\', \'(1,"x, y")\', '
        "ARRAY['(2,z)'::pair, NULL, '(,\"\")'::pair], '{{a,\"b c\"},{a,a}}')"
    )
    assert both_forms(pg) == [
        {
            "id": 1,
            "m": "a",
            "ms": ["b c", None, 'd"e'],
            "p": '(1,"x, y")',
            "ps": ["(2,z)", None, '(,"")'],
            "grid": [["a", "b c"], ["a", "a"]],
        }
    ]


COMPOSITE_DDL = """
CREATE TYPE mood AS ENUM ('ok', 'not ok');
CREATE TYPE inner_t AS (m mood, tags text[]);
CREATE TYPE wide AS (
    i2 int2, i4 int4, i8 int8, o oid, t text, vc varchar(9), c char(3), nm name, b bool, n numeric,
    d date, ts timestamp, u uuid, by bytea, iv interval, tm time, tz timetz, ip inet, net cidr,
    mac macaddr, bits varbit, j json, jb jsonb, ints int4[], inner_v inner_t, r int4range
);
CREATE TABLE w (id int PRIMARY KEY, v wide, vs wide[]);
"""


def test_composites_of_every_field_type_decode_in_binary_as_in_text(pg: PgDatabase) -> None:
    setup(pg, COMPOSITE_DDL)
    row = (
        "ROW(-3, 2147483647, -9223372036854775808, 4000000000, 'a \"q\" \\ (x), [y]', 'v', 'c', 'nm', true, "
        "-10.50, '2026-02-28', '1999-12-31 23:59:59.25', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
        "'\\x00ff', '-1 days +02:03:00', '24:00:00', '10:00+05:30', '::ffff:1.2.3.4', '10.0.0.0/8', "
        "'08:00:2b:01:02:03', B'101', '{\"k\": [1, 2]}', '{\"k\": \"v w\"}', '{{1,NULL},{3,4}}', "
        'ROW(\'not ok\', \'{"",NULL,"NULL","a b","{}"}\')::inner_t, \'[1,5)\')::wide'
    )
    nulls = "'(" + "," * 25 + ")'::wide"
    pg.execute(f"INSERT INTO w VALUES (1, {row}, ARRAY[{row}, NULL, {nulls}])")
    pg.execute("INSERT INTO w VALUES (2, '(,,,,,,,,,,infinity" + "," * 15 + ")', '{}')")
    pg.execute('INSERT INTO w (id, v) VALUES (3, \'(,,,,""' + "," * 21 + ")')")
    rows = both_forms(pg)
    assert rows[0]["v"] == pg.execute(f"SELECT {row}::text")[0][0]
    assert rows[0]["vs"] == [rows[0]["v"], None, "(" + "," * 25 + ")"]
    assert rows[1]["v"] == "(,,,,,,,,,,infinity" + "," * 15 + ")" and rows[1]["vs"] == []
    assert rows[2]["v"] == '(,,,,""' + "," * 21 + ")"


RANGE_DDL = """
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TYPE textrange AS RANGE (subtype = text, collation = "C");
CREATE TABLE r (
    id int PRIMARY KEY, i4 int4range, i8 int8range, nr numrange, dr daterange, tr tsrange,
    i4m int4multirange, nm nummultirange, dm datemultirange, trm tsmultirange, txt textrange,
    txtm textmultirange, txts textrange[]
);
"""


def test_ranges_and_multiranges_decode_in_binary_as_in_text(pg: PgDatabase) -> None:
    setup(pg, RANGE_DDL)
    pg.execute(
        "INSERT INTO r VALUES (1, '[1,5)', '(,10]', '(1.50,2.250]', '[2026-01-01,)', "
        "'[\"1999-12-31 23:59:59.5\",\"2000-01-01 00:00:00\")', '{[1,3), [5,7)}', '{}', "
        '\'{[2026-01-01,2026-02-01)}\', \'{["2000-01-01 00:00:00",)}\', \'["a b","q\\"")\', '
        '\'{[a,b), (" ","z,"]}\', \'{"[a,b)",NULL,empty}\')'
    )
    pg.execute("INSERT INTO r (id, i4, nr, txt) VALUES (2, 'empty', '(,)', '[\"\",\"\"]')")
    rows = both_forms(pg)
    assert rows[0]["i4"] == "[1,5)" and rows[0]["i8"] == "(,11)" and rows[0]["nr"] == "(1.50,2.250]"
    assert rows[0]["tr"] == '["1999-12-31 23:59:59.5","2000-01-01 00:00:00")'
    assert rows[0]["i4m"] == "{[1,3),[5,7)}" and rows[0]["nm"] == "{}"
    assert rows[0]["txt"] == '["a b","q""")' and rows[0]["txts"] == ["[a,b)", None, "empty"]
    assert rows[1]["i4"] == "empty" and rows[1]["nr"] == "(,)" and rows[1]["txt"] == '["",""]'


def test_a_range_whose_bounds_have_no_exact_binary_form_is_refused_per_column_at_the_real_lsn(
    pg: PgDatabase,
) -> None:
    setup(
        pg,
        "CREATE TYPE floatrange AS RANGE (subtype = float8);"
        "CREATE TABLE z (id int PRIMARY KEY, ok int4range, tz tstzrange, fr floatrange, amount money)",
    )
    pg.execute("INSERT INTO z VALUES (1, '[1,2)', '[2026-01-01 00:00+00,)', '[1.5,2)', 1)")
    cache = declared_cache(pg, True)
    with pytest.raises(DecodeError) as info:
        for lsn, msg in peek(pg, True):  # (the Type messages, then the Relation)
            if isinstance(msg, Relation | TypeMsg):
                cache.apply(msg, lsn)
    assert isinstance(msg, Relation)
    text = str(info.value)
    assert '"ok"' not in text  # a range of int4 is read in binary
    assert 'column "tz" has type tstzrange (oid 3910)' in text and "TimeZone" in text
    assert 'column "fr" has type range public.floatrange' in text
    assert 'column "amount" has type money (oid 790)' in text
    assert info.value.lsn == lsn and lsn_to_str(lsn) in text and "0/0" not in text
    text_rows = [
        json.loads("{" + b + "}")["new"]
        for b in decode_stream(peek(pg, False), False, declared_cache(pg, False))
    ]
    assert text_rows == [
        {"id": 1, "ok": "[1,2)", "tz": text_rows[0]["tz"], "fr": "[1.5,2)", "amount": "$1.00"}
    ]


# --- end to end: `csnd replay` of a live source in both forms ------------------------

CSND = [sys.executable, "-m", "csnd.cli"]


def replay_new_rows(pg: PgDatabase, text: bool, until: str) -> list[object]:
    """The `new` row of every change `csnd replay` writes from the slot, in one form."""
    slot = f"replay_{pg.name}_{int(text)}"
    args = [*CSND, "replay", pg.url, "--slot", slot, "--publication", "pub", "--until-lsn", until]
    run = subprocess.run(
        [*args, "--decoders", "1", *(["--text"] if text else [])], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return [c["new"] for line in run.stdout.splitlines() for c in json.loads(line)["changes"]]


def test_replay_writes_the_same_lines_from_a_text_and_a_binary_stream(pg: PgDatabase) -> None:
    """The live source tells its decoders the user types in both forms (`USER_TYPES_QUERY`)."""
    pg.execute(
        "CREATE TYPE mood AS ENUM ('a', 'b c'); CREATE TYPE pair AS (n int, s text);"
        "CREATE TABLE u (id int PRIMARY KEY, ms mood[], p pair, ps pair[], r int4range, dm datemultirange);"
        "CREATE PUBLICATION pub FOR ALL TABLES"
    )
    for text in (False, True):
        pg.execute(f"SELECT pg_create_logical_replication_slot('replay_{pg.name}_{int(text)}', 'pgoutput')")
    pg.execute(
        "INSERT INTO u VALUES (1, '{a,\"b c\",NULL}', '(1,\"x y\")', '{\"(2,z)\",NULL}', '[1,5)', '{[2026-01-01,)}')"
    )
    until = pg.current_lsn()
    binary_rows, text_rows = replay_new_rows(pg, False, until), replay_new_rows(pg, True, until)
    assert (
        binary_rows
        == text_rows
        == [
            {
                "id": 1,
                "ms": ["a", "b c", None],
                "p": '(1,"x y")',
                "ps": ["(2,z)", None],
                "r": "[1,5)",
                "dm": "{[2026-01-01,)}",
            }
        ]
    )


def test_a_recording_carries_the_user_types_and_an_older_one_its_enums(tmp_path: Path) -> None:
    rows = [(16390, "e", 16389, 0), (16395, "c", 16394, 0), (16400, "r", 16399, 701)]
    new, old, bad = tmp_path / "new.pgstream", tmp_path / "old.pgstream", tmp_path / "bad.pgstream"
    for path, extra in (
        (new, {"types": [list(r) for r in rows]}),
        (old, {"enums": [[16390, 16389]]}),
        (bad, {"types": [[1, "e"]]}),
    ):
        with StreamWriter(str(path), StreamHeader(node="dn1", binary=False, mode="single", extra=extra)):
            pass
    assert RecordedSource(str(new)).user_types() == rows
    assert RecordedSource(str(old)).user_types() == [(16390, "e", 16389, 0)]
    with pytest.raises(StreamFormatError, match='header "types"'):
        RecordedSource(str(bad)).user_types()
