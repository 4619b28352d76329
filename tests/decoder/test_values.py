"""Value decoders against a real PostgreSQL 15, in both wire forms.

pgoutput writes a column with the type's send function (binary streams) or
its output function (text streams).  So for every test value the server
itself produces both forms -- `<typsend>(x)` and `<typoutput>(x)` -- and both
decoders must give the JSON value docs/design.md section 7 prescribes, written out by
hand here.  Values are compared as JSON text, so 1 and 1.0, -0.0 and 0.0,
"1" and 1 all differ.

Random batches then check the two forms agree with each other (and with the
server's own text where that is the JSON form) far beyond the hand-picked
edge cases: float4 bit patterns, intervals, timestamps, IPv6 addresses and
text arrays.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import random
import struct
from collections.abc import Callable, Iterator
from decimal import Decimal
from random import Random
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.decoder import jsontext as J
from csnd.decoder import values as V
from csnd.gtm import pgtypes as T
from csnd.gtm.randvalues import Values
from tests.fixtures.pg import PgServer

Conn = psycopg.Connection[tuple[Any, ...]]


@pytest.fixture(scope="module")
def conn(pg_server: PgServer) -> Iterator[Conn]:
    """One database for the module; the session's TimeZone makes timestamptz text carry offsets."""
    name = f"decoder_values_{os.getpid()}"
    with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        with psycopg.connect(pg_server.dsn(name), autocommit=True) as c:
            c.execute(b"SET TimeZone = 'America/New_York'")
            c.execute(b"CREATE TYPE mood AS ENUM ('happy', 'sad', 'a b', '\xc3\xa9', 'NULL')")
            yield c
    finally:
        with psycopg.connect(pg_server.dsn(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def wire(conn: Conn, sql_type: str, literal: str | None) -> tuple[int, bytes, str]:
    """(type oid, send-format bytes, output-function text) of `literal::sql_type`."""
    row = conn.execute(
        b"SELECT oid, typsend::regproc::text, typoutput::regproc::text FROM pg_type WHERE oid = %s::regtype",
        (sql_type,),
    ).fetchone()
    assert row is not None
    oid, send, out = row
    got = conn.execute(
        f"SELECT {send}(x), {out}(x)::text FROM (SELECT %s::{sql_type} AS x) s".encode(), (literal,)
    )
    b, t = got.fetchone() or (None, None)
    return int(oid), bytes(b), str(t)


def bdec(oid: int) -> V.BinaryDecoder:
    decode = V.binary_decoder(oid)
    assert decode is not None, f"no binary decoder for type {oid}"
    return decode


def as_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def check_both(conn: Conn, sql_type: str, literal: str, expected: Any) -> None:
    oid, binary, text = wire(conn, sql_type, literal)
    decode = V.binary_decoder(oid)
    assert decode is not None, f"{sql_type} has no binary decoder"
    assert V.binary_readable(oid)
    assert as_json(decode(binary)) == as_json(expected), f"binary {sql_type} {literal!r}: {binary!r}"
    assert as_json(V.text_decoder(oid)(text)) == as_json(expected), f"text {sql_type} {literal!r}: {text!r}"
    check_builders(oid, binary, text, expected)


def check_builders(oid: int, binary: bytes | None, text: str, expected: Any) -> None:
    """The rows' JSON-text builders write what the decoders' values encode to, in both forms.

    jsonb is the exception by design: its builders pass jsonb_out's text
    through, which is the same JSON value with numbers as PostgreSQL wrote
    them; both forms still give the same text.
    """
    by_text = J.text_json(V.text_decoder(oid))(text)
    if binary is not None:
        decode = bdec(oid)
        assert J.binary_json(decode)(binary) == by_text, f"type {oid}: {binary!r} / {text!r}"
    if "jsonb" in (V.builtin_type_name(oid) or ""):
        assert json.loads(by_text) == expected, text
    else:
        assert by_text == as_json(expected), f"type {oid}: {text!r}"


INF = "Infinity"

CASES: list[tuple[str, str, Any]] = [
    # integers: JSON numbers, int8 beyond 2^53 exact
    ("int2", "-32768", -32768),
    ("int2", "32767", 32767),
    ("int4", "-2147483648", -2147483648),
    ("int4", "0", 0),
    ("int8", "9007199254740993", 9007199254740993),
    ("int8", "-9223372036854775808", -9223372036854775808),
    ("int8", "9223372036854775807", 9223372036854775807),
    ("oid", "4294967295", 4294967295),
    # float4: the shortest decimal that reads back as the same float4
    ("float4", "0.1", 0.1),
    ("float4", "1.1", 1.1),
    ("float4", "1e-45", 1e-45),
    ("float4", "1.17549435e-38", 1.1754944e-38),
    ("float4", "3.4028235e38", 3.4028235e38),
    ("float4", "16777217", 16777216.0),
    ("float4", "-0", -0.0),
    ("float4", "0", 0.0),
    ("float4", "100", 100.0),
    ("float4", "NaN", "NaN"),
    ("float4", "Infinity", INF),
    ("float4", "-Infinity", "-Infinity"),
    # float8
    ("float8", "-0", -0.0),
    ("float8", "5e-324", 5e-324),
    ("float8", "0.1", 0.1),
    ("float8", "1e300", 1e300),
    ("float8", "1.7976931348623157e308", 1.7976931348623157e308),
    ("float8", "42", 42.0),
    ("float8", "NaN", "NaN"),
    ("float8", "Infinity", INF),
    ("float8", "-Infinity", "-Infinity"),
    # numeric: exact strings keeping the scale
    ("numeric", "7.00", "7.00"),
    ("numeric(12,2)", "10.5", "10.50"),
    ("numeric", "0", "0"),
    ("numeric", "0.000", "0.000"),
    ("numeric", "-123456.7890", "-123456.7890"),
    ("numeric", "1e100", "1" + "0" * 100),
    ("numeric", "1e-20", "0." + "0" * 19 + "1"),
    ("numeric", "123456789012345678901234567890.123456789", "123456789012345678901234567890.123456789"),
    ("numeric", "NaN", "NaN"),
    ("numeric", "Infinity", INF),
    ("numeric", "-Infinity", "-Infinity"),
    ("bool", "true", True),
    ("bool", "false", False),
    # strings
    ("text", "", ""),
    ("text", 'é ü 😀 "quoted" back\\slash\ttab\nnewline', 'é ü 😀 "quoted" back\\slash\ttab\nnewline'),
    ("varchar(5)", "abc", "abc"),
    ("char(5)", "ab", "ab   "),
    ("name", "pg_class", "pg_class"),
    ('"char"', "a", "a"),
    ('"char"', "é", "\\303"),  # the first byte of é, as charout prints a high-bit byte
    ('"char"', "", ""),
    # identifiers and addresses: PostgreSQL's text forms
    ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("inet", "192.168.1.1", "192.168.1.1"),
    ("inet", "192.168.1.1/24", "192.168.1.1/24"),
    ("inet", "::1", "::1"),
    ("inet", "::", "::"),
    ("inet", "::ffff:1.2.3.4", "::ffff:1.2.3.4"),
    ("inet", "::1.2.3.4", "::1.2.3.4"),
    ("inet", "1:0:0:2:0:0:0:3", "1:0:0:2::3"),
    ("inet", "1:0:0:0:2:0:0:3/100", "1::2:0:0:3/100"),
    ("inet", "2001:DB8::1/64", "2001:db8::1/64"),
    ("inet", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"),
    ("cidr", "10/8", "10.0.0.0/8"),
    ("cidr", "1.2.3.4/32", "1.2.3.4/32"),
    ("cidr", "2001:db8::/32", "2001:db8::/32"),
    ("cidr", "::/0", "::/0"),
    ("macaddr", "08-00-2B-01-02-03", "08:00:2b:01:02:03"),
    ("macaddr8", "08:00:2b:01:02:03:04:05", "08:00:2b:01:02:03:04:05"),
    ("pg_lsn", "16/B374D848", "16/B374D848"),
    ("xid8", "18446744073709551615", "18446744073709551615"),
    ("xid", "4294967295", "4294967295"),
    ("cid", "7", "7"),
    ("tid", "(4294967295,65535)", "(4294967295,65535)"),
    # dates and times
    ("date", "2024-02-29", "2024-02-29"),
    ("date", "1999-12-31", "1999-12-31"),
    ("date", "0001-01-01", "0001-01-01"),
    ("date", "infinity", "infinity"),
    ("date", "-infinity", "-infinity"),
    ("date", "0044-03-15 BC", "-000043-03-15"),
    ("date", "0001-12-31 BC", "0000-12-31"),
    ("date", "4713-01-01 BC", "-004712-01-01"),
    ("date", "10000-01-01", "+010000-01-01"),
    ("date", "5874897-12-31", "+5874897-12-31"),
    ("timestamp", "2024-01-01 10:00:00", "2024-01-01T10:00:00"),
    ("timestamp", "2024-01-01 10:00:00.5", "2024-01-01T10:00:00.500000"),
    ("timestamp", "1999-12-31 23:59:59.999999", "1999-12-31T23:59:59.999999"),
    ("timestamp", "1900-06-15 12:00:00.000001", "1900-06-15T12:00:00.000001"),
    ("timestamp", "infinity", "infinity"),
    ("timestamp", "-infinity", "-infinity"),
    ("timestamp", "0044-03-15 12:00:00.25 BC", "-000043-03-15T12:00:00.250000"),
    ("timestamp", "294276-12-31 23:59:59.999999", "+294276-12-31T23:59:59.999999"),
    ("timestamptz", "2024-01-01 10:00:00+05:30", "2024-01-01T04:30:00+00:00"),
    ("timestamptz", "2024-07-01 00:00:00.123+00", "2024-07-01T00:00:00.123000+00:00"),
    ("timestamptz", "1800-01-01 00:00:00+00", "1800-01-01T00:00:00+00:00"),  # LMT offset -04:56:02
    ("timestamptz", "1969-07-20 20:17:40Z", "1969-07-20T20:17:40+00:00"),
    ("timestamptz", "infinity", "infinity"),
    ("timestamptz", "-infinity", "-infinity"),
    ("timestamptz", "0044-03-15 12:00:00+00 BC", "-000043-03-15T12:00:00+00:00"),
    ("time", "00:00:00", "00:00:00"),
    ("time", "12:34:56.5", "12:34:56.5"),
    ("time", "23:59:59.999999", "23:59:59.999999"),
    ("time", "24:00:00", "24:00:00"),
    ("timetz", "12:34:56+05:30", "12:34:56+05:30"),
    ("timetz", "12:34:56.25-08", "12:34:56.25-08"),
    ("timetz", "00:00:00+00", "00:00:00+00"),
    ("timetz", "12:00:00+05:45:30", "12:00:00+05:45:30"),
    ("interval", "0", "00:00:00"),
    ("interval", "1 year 2 mons 3 days 04:05:06.789", "1 year 2 mons 3 days 04:05:06.789"),
    ("interval", "-1 year", "-1 years"),
    ("interval", "-1 days +02:03:00", "-1 days +02:03:00"),
    ("interval", "1 mon -1 days", "1 mon -1 days"),
    ("interval", "-00:00:01", "-00:00:01"),
    ("interval", "100000 hours", "100000:00:00"),
    ("interval", "-1 year -2 mons +3 days -04:05:06", "-1 years -2 mons +3 days -04:05:06"),
    ("interval", "-1 mon 5 secs", "-1 mons +00:00:05"),
    ("interval", "0.000001 secs", "00:00:00.000001"),
    # xml: xml_out and xml_send both drop a plain version-1.0 declaration
    ("xml", '<?xml version="1.0"?><a>é</a>', "<a>é</a>"),
    ("xml", '<?xml version="1.0" standalone="yes"?><a/>', '<?xml version="1.0" standalone="yes"?><a/>'),
    ("xml", '<?xml version="1.0" encoding="LATIN1"?><a>x</a>', "<a>x</a>"),
    ("xml", "<a/><b>text &amp; more</b>", "<a/><b>text &amp; more</b>"),
    # bit strings
    ("bit(4)", "1010", "1010"),
    ("bit(9)", "100000001", "100000001"),
    ("varbit", "", ""),
    ("varbit", "10101010101", "10101010101"),
    # bytea
    ("bytea", "\\x", "\\x"),
    ("bytea", "\\x00FF10", "\\x00ff10"),
    # json / jsonb: the JSON value itself
    ("json", ' {"b": [1, 2.5, "x"],\n "a": null, "a": 2} ', {"b": [1, 2.5, "x"], "a": 2}),
    ("json", '"str"', "str"),
    ("json", "null", None),
    (
        "jsonb",
        '{"doc": {"k": [1, 2, {"n": null}]}, "é": "ü\\n"}',
        {"é": "ü\n", "doc": {"k": [1, 2, {"n": None}]}},
    ),
    ("jsonb", "12345678901234567890", 12345678901234567890),
    ("jsonb", "1.5", 1.5),
    ("jsonb", "[]", []),
    ("jsonb", "null", None),
    # arrays: JSON arrays (nested for several dimensions) of the element rule
    ("int4[]", "{}", []),
    ("int4[]", "{1,NULL,3}", [1, None, 3]),
    ("int4[]", "{{1,2},{3,NULL}}", [[1, 2], [3, None]]),
    ("int4[]", "[0:1]={1,2}", [1, 2]),
    ("int4[]", "[-1:0][2:3]={{1,2},{3,4}}", [[1, 2], [3, 4]]),
    ("int4[]", "{{{1},{2}},{{3},{NULL}}}", [[[1], [2]], [[3], [None]]]),
    ("int8[]", "{9007199254740993}", [9007199254740993]),
    (
        "text[]",
        '{"a b",NULL,"NULL","null","","x\\"y","back\\\\s","{x}",é,"a,b"," lead"}',
        ["a b", None, "NULL", "null", "", 'x"y', "back\\s", "{x}", "é", "a,b", " lead"],
    ),
    ("text[]", '{{a,NULL},{"}",d}}', [["a", None], ["}", "d"]]),
    ("numeric[]", "{1.50,NaN,-0.001}", ["1.50", "NaN", "-0.001"]),
    ("float8[]", "{NaN,-0,1e-300}", ["NaN", -0.0, 1e-300]),
    ("float4[]", "{0.1,-Infinity}", [0.1, "-Infinity"]),
    ("bool[]", "{t,f,NULL}", [True, False, None]),
    ("bytea[]", '{"\\\\x0102",NULL,"\\\\x"}', ["\\x0102", None, "\\x"]),
    ("jsonb[]", '{"{\\"a\\": [1]}",NULL,"null"}', [{"a": [1]}, None, None]),
    ("json[]", '{"[1, 2]"}', [[1, 2]]),
    ("timestamptz[]", '{"2024-01-01 00:00:00+00",infinity}', ["2024-01-01T00:00:00+00:00", "infinity"]),
    ("timestamp[]", '{"2024-01-01 00:00:00.5"}', ["2024-01-01T00:00:00.500000"]),
    ("date[]", "{2024-01-01,-infinity}", ["2024-01-01", "-infinity"]),
    ("interval[]", '{"1 day",-00:00:01}', ["1 day", "-00:00:01"]),
    ("uuid[]", "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("inet[]", "{::1,10.0.0.1/8}", ["::1", "10.0.0.1/8"]),
    ("varchar[]", "{a,b}", ["a", "b"]),
    ("char(2)[]", "{a,bb}", ["a ", "bb"]),
    ("varbit[]", '{101,""}', ["101", ""]),
    ("name[]", "{pg_class}", ["pg_class"]),
    ('"char"[]', "{a,b}", ["a", "b"]),
    # ranges and multiranges: their text form, rendered from binary (decoder.pgtext)
    ("int4range", "[1,5)", "[1,5)"),
    ("int4range", "empty", "empty"),
    ("int8range", "(,)", "(,)"),
    ("int8range", "[-9223372036854775808,0]", "[-9223372036854775808,1)"),
    ("numrange", "(-1.50,NaN]", "(-1.50,NaN]"),
    ("daterange", "[0044-03-15 BC,infinity)", '["0044-03-15 BC",infinity)'),
    ("daterange", "[10000-01-01,)", "[10000-01-01,)"),
    ("tsrange", "[-infinity,0044-03-15 10:00:00.25 BC]", '[-infinity,"0044-03-15 10:00:00.25 BC"]'),
    ("tsrange", "(1999-12-31 23:59:59.999999,)", '("1999-12-31 23:59:59.999999",)'),
    ("int4range[]", '{"[1,5)",empty,NULL}', ["[1,5)", "empty", None]),
    ("int4multirange", "{[1,3),[5,7),(9,10]}", "{[1,3),[5,7),[10,11)}"),
    ("nummultirange", "{}", "{}"),
    ("datemultirange", "{[2026-01-01,2026-02-01)}", "{[2026-01-01,2026-02-01)}"),
    ("tsmultirange", "{[2000-01-01 00:00:00,)}", '{["2000-01-01 00:00:00",)}'),
    ("int8multirange[]", '{"{[1,2)}","{}"}', ["{[1,2)}", "{}"]),
]


@pytest.mark.parametrize(
    ("sql_type", "literal", "expected"), CASES, ids=[f"{c[0]}:{c[1][:30]}" for c in CASES]
)
def test_both_forms(conn: Conn, sql_type: str, literal: str, expected: Any) -> None:
    check_both(conn, sql_type, literal, expected)


def test_enum_and_enum_arrays(conn: Conn) -> None:
    """Enum labels are text in both forms; their arrays carry the enum's OID."""
    row = conn.execute(b"SELECT oid, typarray FROM pg_type WHERE typname = 'mood'").fetchone()
    assert row is not None
    enum_oid, array_oid = row
    _, binary, text = wire(conn, "mood", "happy")
    assert V.enum_binary(binary) == V.enum_text(text) == "happy"
    _, binary, text = wire(conn, "mood[]", '{happy,NULL,"a b","NULL",é}')
    expected = ["happy", None, "a b", "NULL", "é"]
    assert V.binary_array(enum_oid, V.enum_binary)(binary) == expected
    assert V.text_array(V.enum_text)(text) == expected
    # user types are unknown to the built-in catalogue
    assert V.binary_decoder(enum_oid) is None and V.binary_decoder(array_oid) is None
    assert not V.binary_readable(enum_oid)


TEXT_ONLY: list[tuple[str, str, Any]] = [
    ("money", "12.34", "$12.34"),
    ("money", "-1234567.891", "-$1,234,567.89"),
    ("money[]", "{1,2}", ["$1.00", "$2.00"]),
    ("tstzrange", "empty", "empty"),  # (its bounds are printed in the session's TimeZone)
    ("tstzmultirange[]", '{"{}"}', ["{}"]),
    ("tsvector", "a fat cat", "'a' 'cat' 'fat'"),
    ("box[]", "{(1,1),(0,0);(2,2),(1,1)}", ["(1,1),(0,0)", "(2,2),(1,1)"]),
    ("jsonpath", "$.a", '$."a"'),
    ("point", "(1,2)", "(1,2)"),
    ("line", "{1,2,3}", "{1,2,3}"),
    ("oidvector", "1 2", "1 2"),
]


@pytest.mark.parametrize(("sql_type", "literal", "expected"), TEXT_ONLY)
def test_text_only_types(conn: Conn, sql_type: str, literal: str, expected: Any) -> None:
    """Types whose binary form csnd cannot render exactly: text form in text mode, unreadable in binary."""
    oid, _, text = wire(conn, sql_type, literal)
    assert as_json(V.text_decoder(oid)(text)) == as_json(expected)
    assert V.binary_decoder(oid) is None
    assert not V.binary_readable(oid)


def test_types_without_a_send_function(conn: Conn) -> None:
    """pgoutput sends them as text even in binary streams, so those can carry them."""
    row = conn.execute(b"SELECT aclitemout('postgres=arwdDxt/postgres'::aclitem)::text").fetchone()
    assert row is not None
    assert V.binary_readable(1033) and V.binary_decoder(1033) is None
    assert V.text_decoder(1033)(row[0]) == "postgres=arwdDxt/postgres"


def test_timestamptz_text_in_other_zones(conn: Conn) -> None:
    try:
        for zone in ("UTC", "Asia/Kathmandu", "America/St_Johns"):
            conn.execute(f"SET TimeZone = '{zone}'".encode())
            check_both(
                conn, "timestamptz", "2024-03-10 06:59:59.000001+00", "2024-03-10T06:59:59.000001+00:00"
            )
            check_both(conn, "timestamptz", "0001-01-01 00:00:00+00", "0001-01-01T00:00:00+00:00")
            check_both(conn, "timestamptz[]", "{2000-01-01 00:00:00+00}", ["2000-01-01T00:00:00+00:00"])
    finally:
        conn.execute(b"SET TimeZone = 'America/New_York'")


def test_bytea_escape_output(conn: Conn) -> None:
    """With bytea_output = 'escape' the text form differs; the JSON value does not."""
    try:
        conn.execute(b"SET bytea_output = 'escape'")
        check_both(conn, "bytea", "\\x00015c27ff41", "\\x00015c27ff41")
        check_both(conn, "bytea", "\\x", "\\x")
    finally:
        conn.execute(b"SET bytea_output = 'hex'")


# --- random batches: both forms agree, and agree with the server ----------------


def test_float4_shortest_matches_float4out(conn: Conn) -> None:
    rng = random.Random(20240601)
    values = [struct.unpack("!f", struct.pack("!I", rng.getrandbits(32)))[0] for _ in range(3000)]
    values += [2.0**e for e in range(-149, 128)] + [-(2.0**e) * 1.5 for e in range(-148, 127)]
    values = [v for v in values if not math.isnan(v)]
    rows = conn.execute(
        b"SELECT float4send(x::float4), float4out(x::float4)::text FROM unnest(%s::text[]) x",
        ([repr(v) for v in values],),
    ).fetchall()
    for binary, text in rows:
        got = bdec(700)(bytes(binary))
        assert as_json(got) == as_json(V.text_decoder(700)(text))
        check_builders(700, bytes(binary), text, got)
        if text not in ("Infinity", "-Infinity"):
            assert Decimal(repr(got)).normalize() == Decimal(text).normalize(), text


def test_random_intervals(conn: Conn) -> None:
    rng = random.Random(7)
    n = 2000
    months = [rng.choice([0, 0, 1, -1, 12, -13, rng.randint(-(2**31), 2**31 - 1)]) for _ in range(n)]
    days = [rng.choice([0, 0, 1, -1, rng.randint(-(2**31), 2**31 - 1)]) for _ in range(n)]
    us = [rng.choice([0, 0, 1, -1, 10**6, rng.randint(-(2**53), 2**53)]) for _ in range(n)]
    rows = conn.execute(
        b"SELECT interval_send(x), interval_out(x)::text FROM ("
        b" SELECT make_interval(months => m, days => d) + u * interval '1 microsecond' AS x"
        b" FROM unnest(%s::int4[], %s::int4[], %s::int8[]) AS t(m, d, u)) s",
        (months, days, us),
    ).fetchall()
    for binary, text in rows:
        assert bdec(1186)(bytes(binary)) == text


@pytest.mark.parametrize(
    ("sql_type", "send"), [("timestamp", "timestamp_send"), ("timestamptz", "timestamptz_send")]
)
def test_random_timestamps(conn: Conn, sql_type: str, send: str) -> None:
    rng = random.Random(11)
    lo, hi = -211_813_488_000_000_000, 9_223_371_331_199_999_999  # 4713 BC .. 294276 AD
    us = [rng.randint(lo, hi) for _ in range(1000)] + [rng.randint(-(10**16), 10**16) for _ in range(1000)]
    rows = conn.execute(
        f"SELECT {send}(x), x::text FROM (SELECT '2000-01-01 00:00:00+00'::{sql_type}"
        f" + u * interval '1 microsecond' AS x FROM unnest(%s::int8[]) u) s".encode(),
        (us,),
    ).fetchall()
    oid = 1114 if sql_type == "timestamp" else 1184
    for binary, text in rows:
        assert bdec(oid)(bytes(binary)) == V.text_decoder(oid)(text), text


def test_random_dates(conn: Conn) -> None:
    rng = random.Random(5)
    days = [rng.randint(-2_451_545, 2_145_031_948) for _ in range(1000)] + list(
        range(-800_000, -700_000, 997)
    )
    rows = conn.execute(
        b"SELECT date_send(x), x::text FROM (SELECT '2000-01-01'::date + d AS x FROM unnest(%s::int4[]) d) s",
        (days,),
    ).fetchall()
    for binary, text in rows:
        assert bdec(1082)(bytes(binary)) == V.text_decoder(1082)(text), text


def test_random_ipv6(conn: Conn) -> None:
    rng = random.Random(3)
    addrs = []
    for _ in range(1500):
        words = [rng.choice([0, 0, 0, 0xFFFF, 1, rng.getrandbits(16)]) for _ in range(8)]
        addr = ipaddress.IPv6Address(b"".join(w.to_bytes(2, "big") for w in words))
        addrs.append(f"{addr}/{rng.choice([128, 128, 64, 0, 127])}")
    rows = conn.execute(
        b"SELECT inet_send(x::inet), inet_out(x::inet)::text FROM unnest(%s::text[]) x", (addrs,)
    ).fetchall()
    for binary, text in rows:
        assert bdec(869)(bytes(binary)) == text


def test_random_text_arrays(conn: Conn) -> None:
    rng = random.Random(9)
    alphabet = ['"', "\\", ",", "{", "}", " ", "\t", "a", "é", "N", "U", "L", "x", "'", ";", "\n"]
    arrays: list[list[str | None]] = []
    for _ in range(300):
        arr: list[str | None] = []
        for _ in range(rng.randint(0, 6)):
            word = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
            arr.append(rng.choice([word, word, "NULL", None, ""]))
        arrays.append(arr)
    for arr in arrays:
        row = conn.execute(
            b"SELECT array_send(%s::text[]), array_out(%s::text[])::text", (arr, arr)
        ).fetchone()
        assert row is not None
        binary, text = bytes(row[0]), row[1]
        assert bdec(1009)(binary) == arr
        assert V.text_decoder(1009)(text) == arr, text
        check_builders(1009, binary, text, arr)


def array_literal(items: list[str | None], shape: list[int]) -> str:
    """array_in's text of `items` laid out in `shape` (outermost dimension first)."""
    if not items:
        return "{}"
    texts = ["NULL" if x is None else x for x in items]
    for size in reversed(shape):
        texts = ["{" + ",".join(texts[i : i + size]) + "}" for i in range(0, len(texts), size)]
    return texts[0]


NUMBER_ARRAY_ITEMS: dict[str, Callable[[Random], str]] = {
    "int2": lambda rng: str(rng.randint(-(2**15), 2**15 - 1)),
    "int4": lambda rng: str(rng.randint(-(2**31), 2**31 - 1)),
    "int8": lambda rng: str(rng.randint(-(2**63), 2**63 - 1)),
    "oid": lambda rng: str(rng.randint(0, 2**32 - 1)),
    "float8": lambda rng: rng.choice([repr(rng.uniform(-1e9, 1e9)), "NaN", "-Infinity", "1e-300"]),
}


@pytest.mark.parametrize("sql_type", sorted(NUMBER_ARRAY_ITEMS))
def test_random_number_arrays(conn: Conn, sql_type: str) -> None:
    """Number arrays (a one-dimensional int array without NULLs is one struct call) against the server."""
    rng = random.Random(sql_type)
    item = NUMBER_ARRAY_ITEMS[sql_type]
    literals = []
    for _ in range(300):
        shape = rng.choice([[rng.randint(0, 7)], [rng.randint(1, 3), rng.randint(1, 3)], [2, 1, 2]])
        nulls = 0.1 if rng.random() < 0.5 else 0.0
        items = [None if rng.random() < nulls else item(rng) for _ in range(math.prod(shape))]
        literals.append(array_literal(items, shape))
    rows = conn.execute(
        f"SELECT array_send(x::{sql_type}[]), array_out(x::{sql_type}[])::text "
        f"FROM unnest(%s::text[]) x".encode(),
        (literals,),
    ).fetchall()
    oid = V.builtin_type_oid("_" + sql_type)
    assert oid is not None
    for binary, text in rows:
        check_builders(oid, bytes(binary), text, bdec(oid)(bytes(binary)))


def test_jsonb_keeps_numbers_exactly(conn: Conn) -> None:
    """jsonb's text is passed through: digits beyond a double and trailing zeros stay as PostgreSQL wrote them."""
    literal = (
        '{"a": 1.10, "big": 1e400, "long": 0.1000000000000000000001, "s": "\\u00e9\\n", "e": [-0, 2.5e-7]}'
    )
    oid, binary, text = wire(conn, "jsonb", literal)
    assert J.binary_json(bdec(oid))(binary) == J.text_json(V.text_decoder(oid))(text) == text
    assert text.startswith('{"a": 1.10, "e": [0, 0.00000025], "s": "é\\n", "big": 1000')
    assert json.loads(text)["long"] == 0.1  # a JSON reader's float; the text kept every digit


# --- bad input: an exception (made a DecodeError by the row decoder), never a value --


@pytest.mark.parametrize(
    ("oid", "data"),
    [
        (23, b"\x00\x00\x01"),  # int4 of 3 bytes
        (20, b"\x00" * 9),
        (16, b"\x02"),
        (701, b"\x00" * 4),
        (1700, b"\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01"),  # numeric: 2 digits announced, 1 sent
        (1700, b"\x00\x00\x00\x00\x12\x34\x00\x00"),  # bad sign
        (1082, b"\x00\x00\x01"),
        (1114, b"\x00" * 7),
        (1184, b"\x00" * 9),
        (1083, b"\x00" * 4),
        (1266, b"\x00" * 8),
        (1186, b"\x00" * 15),
        (2950, b"\x00" * 15),
        (869, b"\x02\x20\x00\x04\x01\x02\x03"),
        (869, b"\x05\x20\x00\x04\x01\x02\x03\x04"),
        (829, b"\x00" * 5),
        (1562, b"\x00\x00\x00\x09\x00"),  # 9 bits need 2 bytes
        (3802, b"\x02{}"),  # jsonb version 2
        (3802, b"\x01{"),
        (3802, b"\x01"),
        (
            1005,
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x15\x00\x00\x00\x01\x00\x00\x00\x01"
            b"\x00\x00\x00\x04\x00\x00\x00\x01",
        ),  # int2[] whose element says 4 bytes
        (25, b"\xff"),
        (
            1007,
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x19\x00\x00\x00\x01\x00\x00\x00\x01",
        ),  # elem oid 25
        (
            1007,
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x17\x00\x00\x00\x01\x00\x00\x00\x01",
        ),  # no elements
        (
            1007,
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x17\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x08",
        ),
        (
            1007,
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x17\x00\x00\x00\x01\x00\x00\x00\x01"
            b"\x00\x00\x00\x04\x00\x00\x00\x01!",
        ),  # trailing byte
    ],
)
def test_corrupt_binary_values_raise(oid: int, data: bytes) -> None:
    decode = V.binary_decoder(oid)
    assert decode is not None
    with pytest.raises((ValueError, KeyError, IndexError, struct.error, psycopg.DataError)):
        decode(data)
    with pytest.raises((ValueError, KeyError, IndexError, struct.error, psycopg.DataError)):
        J.binary_json(decode)(data)


@pytest.mark.parametrize(
    ("oid", "text"),
    [
        (23, "x"),
        (16, "true"),  # boolout writes t/f; `true` is bool::text, never pgoutput
        (1082, "01/02/2024"),  # DateStyle SQL
        (1082, "2024-01-02x"),
        (1114, "Tue Jan 02 10:00:00 2024"),  # DateStyle Postgres
        (1184, "2024-01-02 10:00:00"),  # timestamptz without offset
        (1114, "2024-01-02 10:00:00+00"),  # timestamp with offset
        (1007, "{1,2"),
        (1007, "{1,2}}"),
        (1007, "{1}x"),
        (17, "\\xzz"),
        (17, "a\\9b"),
        (3802, "{"),
        (3802, ""),
        (3802, '{"a": 1'),
        (700, "1e39"),
    ],
)
def test_corrupt_text_values_raise(oid: int, text: str) -> None:
    with pytest.raises((ValueError, KeyError, IndexError, OverflowError)):
        V.text_decoder(oid)(text)
    with pytest.raises((ValueError, KeyError, IndexError, OverflowError)):
        J.text_json(V.text_decoder(oid))(text)


def test_catalogue() -> None:
    assert V.builtin_type_oid("int4") == 23
    assert V.builtin_type_oid("_int4") == 1007
    assert V.builtin_type_oid("char") == 18
    assert V.builtin_type_oid("no_such_type") is None
    assert V.builtin_type_name(1184) == "timestamptz"
    assert V.text_decoder(999_999)("anything") == "anything"  # unknown: its text form
    assert V.binary_decoder(999_999) is None and not V.binary_readable(999_999)


# --- pure properties -------------------------------------------------------------


@given(
    st.decimals(allow_nan=True, allow_infinity=False)  # (Infinity: the server cases above)
    | st.builds(
        lambda d, e: d.scaleb(e), st.decimals(allow_nan=False, allow_infinity=False), st.integers(-40, 40)
    )
)
def test_numeric_text_is_the_plain_notation(value: Decimal) -> None:
    """Binary numeric -> text: `str()` of psycopg's Decimal, or format 'f' where that is in E notation."""
    if value.is_snan():
        return  # not a PostgreSQL numeric
    data = T.NUMERIC.cell(value, True)[0]
    assert isinstance(data, bytes)
    loaded = V._load_numeric(data)
    assert V.binary_decoder(1700)(data) == format(loaded, "f")  # type: ignore[misc]


@given(st.integers(0, 2**32 - 1))
def test_float4_shortest_reads_back(bits: int) -> None:
    x = struct.unpack("!f", struct.pack("!I", bits))[0]
    got = V.float4_shortest(x)
    if math.isnan(x) or math.isinf(x):
        assert got in ("NaN", "Infinity", "-Infinity")
        return
    assert struct.unpack("!f", struct.pack("!f", got))[0] == x
    assert math.copysign(1.0, got) == math.copysign(1.0, x)
    assert len(Decimal(repr(got)).normalize().as_tuple().digits) <= 9


@pytest.mark.parametrize(
    ("array", "elem", "code", "bits"),
    [(1005, 21, "h", 16), (1007, 23, "i", 32), (1016, 20, "q", 64), (1028, 26, "I", 32)],
)
@given(data=st.data())
def test_int_arrays_fast_path_agrees_with_the_walk(
    array: int, elem: int, code: str, bits: int, data: st.DataObject
) -> None:
    """One-dimensional int arrays (the one-struct-call path up to 256 elements, the walk beyond) as JSON."""
    low, high = (0, 2**bits - 1) if code == "I" else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    items = data.draw(st.lists(st.integers(low, high), max_size=300))
    lower = data.draw(st.integers(-5, 5))
    wire = struct.pack("!iiIii", 1, 0, elem, len(items), lower)
    wire += b"".join(struct.pack("!i" + code, bits // 8, v) for v in items)
    assert J.binary_json(bdec(array))(wire) == json.dumps(items)
    with pytest.raises((ValueError, KeyError, IndexError, struct.error)):
        J.binary_json(bdec(array))(wire + b"!")  # a trailing byte: the walk names it


@pytest.mark.parametrize("type_name", sorted(T.TYPES))
def test_agrees_with_the_generator(type_name: str) -> None:
    """The synthetic cluster's oracle (gtm.pgtypes) and the decoders agree, value by value, both forms."""
    t = T.TYPES[type_name]
    values = Values(Random(type_name), binary=True, toast_bytes=100)
    generate = {
        "int4": values.int4,
        "int8": values.int8,
        "numeric": lambda: values.numeric(-1 if values.rng.random() < 0.5 else T.numeric_typmod(12, 2)),
        "timestamptz": values.timestamptz,
        "date": values.date,
        "text": values.short_text,
        "varchar": values.short_text,
        "float8": values.float8,
        "jsonb": values.jsonb,
        "_int4": values.int4_array,
        "_text": values.text_array,
        "bool": lambda: values.rng.random() < 0.5,
        "uuid": values.uuid,
        "bytea": values.bytea,
    }[type_name]
    for _ in range(300):
        v = generate()
        if v is None:
            continue
        for binary in (True, False):
            wire, expected, _ = t.cell(v, binary)
            assert isinstance(wire, bytes if binary else str)
            got = bdec(t.oid)(wire) if isinstance(wire, bytes) else V.text_decoder(t.oid)(wire)
            assert as_json(got) == as_json(expected), f"{type_name} {v!r} binary={binary}"
