"""What PostgreSQL 18 adds to a stream, as csnd delivers it: stored generated columns.

PostgreSQL 18 publishes a table's stored generated columns when its
publication says `publish_generated_columns = stored` (before 18, and without
it, pgoutput leaves them out).  Their values are computed on the primary and
stored in the row, so test_decoding prints them; csnd's output must carry the
same values, in binary and in text mode.  These tests run on a PostgreSQL 18
server whatever the run's version (`pg18`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import witness
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import start_serve, subscribe, wait_for

CSND = [sys.executable, "-m", "csnd.cli"]

# (op, new row or None, old row or None) of each change of the table, in stream order
Change = tuple[str, dict[str, Any] | None, dict[str, Any] | None]


def _witness_changes(pg: PgDatabase, upto: str) -> list[Change]:
    rows = pg.execute(
        "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_changes("
        f"'witness', '{upto}', NULL, 'include-xids', '1', 'skip-empty-xacts', '1')"
    )
    txns, _ = witness.transactions(rows)
    out: list[Change] = []
    for txn in txns:
        for row in txn.rows:
            new = witness.typed_values(row.new)[0] if row.new is not None else None
            old = witness.typed_values(row.old)[0] if row.old is not None else None
            out.append((row.op.lower(), new, old))
    return out


def _csnd_changes(out: Path) -> list[Change]:
    changes: list[Change] = []
    for line in out.read_text().splitlines():
        for c in json.loads(line)["changes"]:
            changes.append((c["op"], c["new"], c["old"]))
    return changes


@pytest.mark.parametrize("mode", ["binary", "text"])
def test_a_stored_generated_column_comes_out_as_test_decoding_prints_it(
    pg18: PgDatabase, tmp_path: Path, mode: str
) -> None:
    pg = pg18
    pg.execute(
        "CREATE TABLE gen (id int PRIMARY KEY, a int, "
        "twice int GENERATED ALWAYS AS (a * 2) STORED, "
        "label text GENERATED ALWAYS AS ('n=' || a) STORED)"
    )
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE gen WITH (publish_generated_columns = stored)")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding')")
    pg.execute("INSERT INTO gen (id, a) VALUES (1, 10), (2, 20), (3, NULL)")
    pg.execute("UPDATE gen SET a = 11 WHERE id = 1")
    pg.execute("UPDATE gen SET a = 5 WHERE id = 3")
    pg.execute("DELETE FROM gen WHERE id = 2")
    end = pg.current_lsn()

    out = tmp_path / "out.jsonl"
    text = ["--text"] if mode == "text" else []
    args = [f"dn1={pg.url}", "--slot", "csnd", "--publication", "csnd_pub", *text, "--until-lsn", end]
    run = subprocess.run(
        [*CSND, "replay", *args, "--output", str(out)], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr

    theirs = _witness_changes(pg, end)
    ours = _csnd_changes(out)
    assert ours == theirs
    # (the witness's rows themselves, so the comparison cannot pass with the column left out on both sides)
    assert ("insert", {"id": 1, "a": 10, "twice": 20, "label": "n=10"}, None) in ours
    assert ("update", {"id": 3, "a": 5, "twice": 10, "label": "n=5"}, None) in ours
    assert ("delete", None, {"id": 2}) in ours


def test_an_initial_snapshot_carries_the_stored_generated_columns_the_stream_carries(
    pg18: PgDatabase, tmp_path: Path
) -> None:
    """A consumer's copy built from the snapshot and then the stream must have the same columns throughout."""
    pg = pg18
    pg.execute("CREATE TABLE gen (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED)")
    pg.execute("INSERT INTO gen (id, a) SELECT i, i FROM generate_series(1, 5) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE gen WITH (publish_generated_columns = stored)")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial"
    served = start_serve([source], str(tmp_path / "log"))
    try:
        wait_for(lambda: served.status().get("snapshot", {}).get("state") == "complete", "the snapshot")
        pg.execute("INSERT INTO gen (id, a) VALUES (6, 6)")
        wait_for(lambda: int(served.status()["totals"]["transactions"]) >= 1, "the streamed insert")
        got = subscribe(served.address, "--idle-timeout", "2")
    finally:
        code, err = served.terminate()
    assert code == 0, err
    assert got.returncode == 0, got.stderr
    rows = {
        c["new"]["id"]: (c["op"], c["new"])
        for line in got.stdout.splitlines()
        for c in json.loads(line)["changes"]
    }
    assert rows == {
        i: ("read" if i <= 5 else "insert", {"id": i, "a": i, "twice": 2 * i}) for i in range(1, 7)
    }
