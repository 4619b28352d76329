"""Relation lines from a real `csnd serve`: a consumer starting anywhere learns the versions in force.

`csnd subscribe --schemas` from the middle of a generated cluster (DDL,
several nodes, out-of-order GTM commits) first gets the version of each
table it reads that is in force there, then each new one before the first
transaction it is in force with; every change it prints then has exactly
the columns of its table's version.  `csnd changelog --schemas` prints the
same for the same range, and a restart re-derives nothing twice.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from csnd.gtm import GenerateOptions, generate_cluster
from tests.service.servekit import CSND, start_serve, subscribe, wait_for

RELATION = '{"relation": '


def check_in_force(lines: list[str], known: dict[tuple[str, str, str], dict[str, Any]]) -> int:
    """Every change of `lines` against the version in force (relation lines update `known`); changes checked."""
    checked = 0
    for line in lines:
        obj = json.loads(line)
        if "relation" in obj:
            r = obj["relation"]
            known[(r["node"], r["schema"], r["table"])] = r
            continue
        for ch in obj["changes"]:
            r = known[(ch["node"], ch["schema"], ch["table"])]
            columns = [c["name"] for c in r["columns"]]
            assert ch["key"] == r["key"]
            if ch["op"] in ("insert", "update"):
                assert set(ch["new"]) | set(ch.get("unchanged", [])) == set(columns), (
                    obj["csn"],
                    ch,
                    columns,
                )
            checked += 1
    return checked


def test_subscribers_from_the_middle_get_the_versions_in_force(tmp_path: Path) -> None:
    options = GenerateOptions(large_ratio=0.05, abort_ratio=0.1, large_txn_changes=100, ddl_every=25)
    summary = generate_cluster(tmp_path / "cluster", 2, 300, seed=29, binary=True, options=options)
    expected = (tmp_path / "cluster" / "expected.jsonl").read_text().splitlines()
    sources = [str(f) for f in summary.files]
    log = str(tmp_path / "log")
    served = start_serve(sources, log)
    middle = json.loads(expected[len(expected) // 2])["csn"]
    try:
        last = json.loads(expected[-1])["csn"]
        wait_for(lambda: served.newest_csn() == last, "the whole cluster in the changelog")
        got = subscribe(served.address, "--from-csn", str(middle), "--schemas", "--idle-timeout", "2")
        assert got.returncode == 0, got.stderr
        lines = got.stdout.splitlines()
        assert [x for x in lines if not x.startswith(RELATION)] == expected[len(expected) // 2 + 1 :]
        first_txn = next(i for i, x in enumerate(lines) if not x.startswith(RELATION))
        head = [json.loads(x)["relation"] for x in lines[:first_txn]]
        assert head and all(r["csn"] <= middle for r in head), "the versions in force at the start come first"
        assert check_in_force(lines, {}) > 300

        # with a filter: only that table's versions, the ones in force first
        acct = subscribe(
            served.address, "--from-csn", str(middle), "--schemas", "--table", "public.wide", "--limit", "5"
        )
        assert acct.returncode == 0, acct.stderr
        rels = [json.loads(x)["relation"] for x in acct.stdout.splitlines() if x.startswith(RELATION)]
        assert rels and {r["table"] for r in rels} == {"wide"}
        assert sum(1 for x in acct.stdout.splitlines() if x.startswith('{"csn"')) == 5
    finally:
        code, err = served.terminate()
    assert code == 0, err
    stored = (tmp_path / "log" / "relations.jsonl").read_text()

    offline = subprocess.run(
        [*CSND, "changelog", log, "--from-csn", str(middle), "--schemas"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.splitlines() == lines

    # A restart re-reads the sources from the start: every transaction is already held, and
    # so is every version -- the store does not grow.
    served = start_serve(sources, log)
    try:
        wait_for(
            lambda: served.status()["nodes"] and all(n["state"] == "ended" for n in served.status()["nodes"]),
            "ended",
        )
    finally:
        code, err = served.terminate()
    assert code == 0, err
    assert (tmp_path / "log" / "relations.jsonl").read_text() == stored
