"""A binary source that meets a column csnd cannot read in binary: refused at the change's real LSN.

The walsender may send a table's Relation message without a position, so
the refusal waits for the table's first change and names that change's LSN
and xid, never "at 0/0".  On PostgreSQL 18 (`pg18`), where the issue saw
"at 0/0"; the same holds on 15 (tests/decoder/test_rows.py).
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys

import pytest

from csnd.core.errors import DecodeError
from csnd.core.ids import Lsn, lsn_from_str
from csnd.decoder.rows import RelationCache, row_change_body
from csnd.reader.pgoutput import Column, Relation
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]


def test_a_binary_refusal_names_the_first_change_s_lsn_and_xid(pg18: PgDatabase) -> None:
    pg = pg18
    pg.execute("CREATE TABLE price (id int PRIMARY KEY, amount money)")  # (money: lc_monetary's text)
    pg.execute("CREATE PUBLICATION p FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    before = lsn_from_str(pg.current_lsn())
    pg.execute("INSERT INTO price SELECT g, 1.5 FROM generate_series(1, 5000) g")
    xid = int(str(pg.execute("SELECT xmin::text FROM price LIMIT 1")[0][0]))
    end = pg.current_lsn()
    proc = subprocess.run(
        [*CSND, "replay", f"dn1={pg.url}", "--slot", "s", "--publication", "p", "--until-lsn", end],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1, proc.stderr
    assert 'column "amount" has type money' in proc.stderr and "text mode" in proc.stderr, proc.stderr
    assert "at 0/0" not in proc.stderr, proc.stderr
    at = re.search(r" at ([0-9A-F]+/[0-9A-F]+)", proc.stderr)
    assert at is not None, proc.stderr
    assert before <= lsn_from_str(at.group(1)) <= lsn_from_str(end), proc.stderr
    assert f"(xid {xid})" in proc.stderr, proc.stderr


def test_a_refusal_without_a_position_claims_none() -> None:
    """A row read outside the stream (an incremental snapshot's chunk: position 0) is refused without "at 0/0".

    0/0 is no position; the error said "at 0/0" as if the change were there.
    """
    c = RelationCache(binary=True)
    columns = (Column(1, "id", 23, -1), Column(0, "amount", 790, -1))
    c.apply(Relation(None, 16384, "public", "price", "d", columns), Lsn(0))
    row = b"N" + struct.pack("!H", 2) + b"b" + struct.pack("!Ii", 4, 1) + b"b" + struct.pack("!Iq", 8, 150)
    with pytest.raises(DecodeError) as info:
        row_change_body("I", None, 16384, row, 0, c, True)
    assert 'column "amount" has type money' in str(info.value) and "text mode" in str(info.value)
    assert info.value.lsn is None and "0/0" not in str(info.value), str(info.value)
    with pytest.raises(DecodeError) as info:  # (in the stream: the change's own position)
        row_change_body("I", 745, 16384, row, 0x16B3748, c, True)
    assert info.value.lsn == 0x16B3748 and str(info.value).endswith("(xid 745) at 0/16B3748")
