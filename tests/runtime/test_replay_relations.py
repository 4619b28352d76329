"""`csnd replay --schemas`: every change has its table's version in force, exactly its columns.

The oracle is the generated cluster itself: its DDL (ADD COLUMN, DROP COLUMN,
a type change) moves the tables through versions while transactions commit
out of CSN order (GTM markers) on several nodes, streamed and not.  Reading
the output in order, keeping the latest relation line of each (node, schema,
table), every insert's and update's new row (with its unchanged columns) has
exactly the columns of the version in force, in their order, and every
change's key is that version's key.  Without the relation lines the output
is the generator's expected output, byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from csnd.gtm import GenerateOptions, generate_cluster

CSND = [sys.executable, "-m", "csnd.cli"]


@pytest.mark.parametrize("binary", [True, False])
def test_every_change_has_its_version_in_force(tmp_path: Path, binary: bool) -> None:
    options = GenerateOptions(large_ratio=0.05, abort_ratio=0.1, large_txn_changes=100, ddl_every=25)
    summary = generate_cluster(tmp_path, 3, 300, seed=23, binary=binary, options=options)
    run = subprocess.run(
        [*CSND, "replay", *map(str, summary.files), "--schemas", "--decoders", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    transactions = [x for x in lines if not x.startswith('{"relation": ')]
    assert transactions == (tmp_path / "expected.jsonl").read_text().splitlines()

    in_force: dict[tuple[str, str, str], dict[str, Any]] = {}
    checked = versions = 0
    last_csn = 0
    for line in lines:
        obj = json.loads(line)
        if "relation" in obj:
            r = obj["relation"]
            assert r["csn"] > last_csn, "a version comes before the first transaction it is in force with"
            assert list(r) == [
                "csn",
                "node",
                "schema",
                "table",
                "relid",
                "replica_identity",
                "key",
                "columns",
            ]
            in_force[(r["node"], r["schema"], r["table"])] = r
            versions += 1
            continue
        last_csn = obj["csn"]
        for ch in obj["changes"]:
            r = in_force[(ch["node"], ch["schema"], ch["table"])]
            columns = [c["name"] for c in r["columns"]]
            assert ch["key"] == r["key"], (obj["csn"], ch, r)
            if ch["op"] in ("insert", "update"):
                have = set(ch["new"]) | set(ch.get("unchanged", []))
                assert have == set(columns), (obj["csn"], ch, columns)
                assert list(ch["new"]) == [c for c in columns if c in ch["new"]]
            checked += 1
    assert checked > 1000 and versions > 10
