"""What `csnd -v serve --snapshot initial` says while it copies, and what its records and Status hold.

A table whose row count is a multiple of the chunk size used to end in an
empty chunk, appended first since it was the quickest ("chunk 6 of 6, rows
0"); a table without statistics showed its rows as its total while still
copying.  Now the chunks hold rows, the total is the counted one, and the
log has a line as the copy starts and at each table done.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.fixtures.pg import PgDatabase
from tests.service.servekit import start_serve, subscribe, wait_for


def test_no_empty_chunk_counted_totals_and_progress_lines(pg: PgDatabase, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE loose (n int)")  # no key: one chunk; no statistics: an unknown total
    pg.execute("INSERT INTO acct SELECT i, 'v' || i FROM generate_series(1, 250) AS i")
    pg.execute("INSERT INTO loose SELECT i FROM generate_series(1, 40) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")  # (and no ANALYZE: reltuples is -1)
    config = tmp_path / "csnd.toml"
    # (key ranges: the counted totals and the never-empty last chunk are theirs; the default cuts an
    # analysed table by its pages, and autovacuum may analyse acct at any time)
    config.write_text('[snapshot]\nchunk_rows = 50\nreaders = 2\nsplit = "key"\n')
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial"
    served = start_serve([source], str(tmp_path / "log"), "--config", str(config), "-v")
    try:
        wait_for(lambda: served.status().get("snapshot", {}).get("state") == "complete", "the snapshot")
        tables = {t["table"]: t for t in served.status()["snapshot"]["tables"]}
        got = subscribe(served.address, "--idle-timeout", "2")
        assert got.returncode == 0, got.stderr
    finally:
        code, err = served.terminate()
    assert code == 0, err
    assert {k: (t["state"], int(t["rows"]), int(t["rows_estimated"])) for k, t in tables.items()} == {
        "acct": ("done", 250, 250),
        "loose": ("done", 40, 40),
    }
    marked = [json.loads(ln) for ln in got.stdout.splitlines()]
    chunks = [t["snapshot"] for t in marked if "snapshot" in t and not t["snapshot"].get("done")]
    acct = sorted((c["chunk"], c["chunks"], c["rows"]) for c in chunks if c["table"] == "acct")
    assert acct == [(i, 5, 50) for i in range(1, 6)], acct  # (250 rows in 50s: 5 chunks, none empty)
    assert all(c["rows"] > 0 for c in chunks), chunks
    lines = [ln.split(" csnd: ", 1)[1] for ln in err.splitlines() if " csnd: initial snapshot" in ln]
    assert (
        lines[0]
        == f"initial snapshot: copying the tables of node dn1 as of lsn {marked[0]['nodes']['dn1']['commit_lsn']}"
    )
    assert any(
        re.fullmatch(r"initial snapshot: 1 of 2 tables done, \d+ (of \d+ )?chunks, .*", ln) for ln in lines
    )
    assert any(
        re.fullmatch(
            r"initial snapshot: 2 of 2 tables done, 6 of 6 chunks, 290 of 290 rows \([\d,]+ rows/s\)", ln
        )
        for ln in lines
    ), lines
