"""`csnd snapshot TABLE` against a running `csnd serve` on a live PostgreSQL 15 node, under writes.

The table holds rows from before the slot existed, so the stream alone can
never give them.  A writer inserts, updates (also keys) and deletes all over
the table while the chunks are read.  Replaying what a consumer reads from 0
-- reads and inserts put a row under its key, updates move it, deletes
remove it (an update or delete of a row not read yet is applied as far as it
goes: the stream began after those rows were written) -- must give the table
exactly once the snapshot is complete: a chunk row older than a change the
stream delivered before it, or a row the snapshot missed, shows as a
difference.  The same after kill -9 of the service in the middle of the
snapshot: the restarted service resumes it from the chunk it reached, and no
chunk is in the changelog twice.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from typing import Any

import psycopg

from tests.fixtures.pg import PgDatabase
from tests.service.servekit import CSND, Served, start_serve, subscribe, wait_for
from tests.service.test_serve_snapshot import _setup, _table, _Writer, read_everything

ROWS = 4_000


def _apply(lines: list[str]) -> tuple[dict[tuple[str, int], dict[str, Any]], list[dict[str, Any]]]:
    """acct by key after every change of `lines`, and the transactions."""
    acct: dict[tuple[str, int], dict[str, Any]] = {}
    txns = [json.loads(line) for line in lines]
    for txn in txns:
        for ch in txn["changes"]:
            if ch["table"] != "acct":
                continue
            op, old, new = ch["op"], ch["old"], ch["new"]
            if op in ("read", "insert"):
                acct[(new["region"], new["id"])] = new
            elif op == "update":
                acct.pop((old["region"], old["id"]) if old else (new["region"], new["id"]), None)
                acct[(new["region"], new["id"])] = new
            elif op == "delete":
                acct.pop((old["region"], old["id"]), None)
    return acct, txns


def _check_equal(pg: PgDatabase, served: Served) -> list[dict[str, Any]]:
    acct, txns = _apply(read_everything(pg, served))
    want, _ = _table(pg)
    assert acct.keys() == want.keys(), (len(acct), len(want), sorted(acct.keys() ^ want.keys())[:5])
    bad = [k for k in want if acct[k] != want[k]]
    assert not bad, (bad[:3], [acct[k] for k in bad[:1]], [want[k] for k in bad[:1]])
    return txns


def _snapshot(served: Served, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CSND, "snapshot", served.address, *args], capture_output=True, text=True, timeout=600, check=False
    )


def _chunks(txns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t["snapshot"] for t in txns if "snapshot" in t]


def test_an_incremental_snapshot_under_writes_equals_the_table(pg: PgDatabase, tmp_path: Any) -> None:
    _setup(pg, rows=ROWS)
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    writer = _Writer(pg, seed=3, limit=ROWS).start()
    try:
        wait_for(lambda: writer.done > 50, "writes before the snapshot")
        got = _snapshot(served, "public.acct", "--chunk-rows", "300")
        assert got.returncode == 0, got.stderr
        assert "complete" in got.stderr.splitlines()[-1], got.stderr
        writer.stop()
        txns = _check_equal(pg, served)
        status = served.status()["incremental"]
        assert status["state"] == "complete" and status["tables"][0]["state"] == "done", status
        assert served.http is not None
        with urllib.request.urlopen(served.http + "metrics", timeout=30) as r:
            metrics = r.read().decode()
        rows = status["tables"][0]["rows"]
        assert f'csnd_incremental_snapshot_rows{{node="dn1",table="public.acct"}} {float(rows)}' in metrics
        # refused with a clear line: a table without a primary key, and one not published
        bad = _snapshot(served, "public.loose")
        assert bad.returncode == 1 and "no primary key" in bad.stderr, bad.stderr
        bad = _snapshot(served, "public.nope")
        assert bad.returncode == 1 and "not in the publication" in bad.stderr, bad.stderr
    finally:
        writer.stop()
        code, err = served.terminate()
    assert code == 0, err
    chunks = _chunks(txns)
    assert [c["chunk"] for c in chunks if not c.get("redo")] == list(range(1, len(chunks) + 1))
    assert chunks[-1]["last"] is True and len(chunks) >= ROWS // 300
    # every chunk but the last is exactly 300 keys after the one before it, read in one snapshot
    assert all(c["rows"] + c["left_out"] == 300 for c in chunks[:-1]), chunks
    # (the writer touched keys inside some windows: those rows came from the stream instead)
    assert sum(c["rows"] for c in chunks) + sum(c["left_out"] for c in chunks) >= ROWS // 2
    reads = [t for t in txns if "snapshot" in t]
    assert all(ch["op"] == "read" and ch["table"] == "acct" for t in reads for ch in t["changes"])
    assert all(t["nodes"]["dn1"]["xid"] > 0 for t in reads)  # (the watermark's own transaction)


def test_killed_mid_snapshot_the_restarted_service_resumes_it(pg: PgDatabase, tmp_path: Any) -> None:
    _setup(pg, rows=ROWS)
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    writer = _Writer(pg, seed=4, limit=ROWS).start()
    try:
        got = _snapshot(served, "public.acct", "--chunk-rows", "100", "--no-wait")
        assert got.returncode == 0, got.stderr

        def chunks_done() -> int:
            tables = served.status()["incremental"].get("tables") or [{}]
            return int(tables[0].get("chunks_done", 0))

        wait_for(lambda: chunks_done() >= 5, "five chunks")
        served.kill()
        served = start_serve([source], str(tmp_path / "log"))
        wait_for(lambda: served.status()["incremental"].get("state") == "complete", "the resumed snapshot")
        writer.stop()
        txns = _check_equal(pg, served)
    finally:
        writer.stop()
        code, err = served.terminate()
    assert code == 0, err
    chunks = [c for c in _chunks(txns) if not c.get("redo")]
    numbers = [c["chunk"] for c in chunks]
    assert numbers == list(range(1, len(numbers) + 1)), numbers  # (none lost, none twice)
    assert chunks[-1]["last"] is True and len(chunks) >= ROWS // 100 // 2


def test_a_table_added_to_a_when_needed_publication_is_snapshotted_by_itself(
    pg: PgDatabase, tmp_path: Any
) -> None:
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE nokey (n int)")
    pg.execute("INSERT INTO acct SELECT i, 'a' || i FROM generate_series(1, 300) AS i")
    pg.execute("INSERT INTO item SELECT i, 'i' || i FROM generate_series(1, 700) AS i")
    pg.execute("INSERT INTO nokey SELECT i FROM generate_series(1, 10) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE acct")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true&snapshot=when_needed"
    env = {"CSND_NEW_TABLES_EVERY_S": "0.5"}
    served = start_serve([source], str(tmp_path / "log"), env=env)
    try:
        wait_for(
            lambda: served.status().get("snapshot", {}).get("state") == "complete", "the initial snapshot"
        )
        pg.execute("UPDATE item SET v = 'before' WHERE id = 5")  # (not published yet: never streamed)
        pg.execute("ALTER PUBLICATION csnd_pub ADD TABLE item, nokey")
        pg.execute("UPDATE item SET v = 'after' WHERE id = 6")
        wait_for(lambda: served.status()["incremental"].get("state") == "complete", "item's snapshot")
        assert served.status()["incremental"]["tables"][0]["table"] == "item"
    finally:
        code, err = served.terminate()
    assert code == 0, err
    assert "not snapshotting public.nokey" in err and "no primary key" in err, err
    # a restart finds nothing new: no second job
    served = start_serve([source], str(tmp_path / "log"), env=env)
    try:
        got = subscribe(served.address, "--idle-timeout", "3", "--schemas")
        assert got.returncode == 0, got.stderr
        time_to_look = served.status()["incremental"]
    finally:
        code, err = served.terminate()
    assert code == 0, err
    item: dict[int, str] = {}
    lines = [json.loads(x) for x in got.stdout.splitlines()]
    # item's relation version comes before its first read: no change of it was ever streamed before
    first_read = next(
        i for i, t in enumerate(lines) if "changes" in t and t.get("snapshot", {}).get("table") == "item"
    )
    described = [i for i, t in enumerate(lines) if t.get("relation", {}).get("table") == "item"]
    assert described and described[0] < first_read, (described, first_read)
    assert [c["name"] for c in lines[described[0]]["relation"]["columns"]] == ["id", "v"]
    for t in lines:
        for ch in t.get("changes", ()):
            if ch["table"] == "item":
                item[ch["new"]["id"]] = ch["new"]["v"]
    assert item == {i: "before" if i == 5 else "after" if i == 6 else f"i{i}" for i in range(1, 701)}
    assert time_to_look["job"] and time_to_look["state"] == "complete"
    stored = json.loads((tmp_path / "log" / "incremental_snapshots.json").read_text())
    assert len(stored["jobs"]) == 1 and sorted(map(tuple, stored["known"]["dn1"])) == [
        ("public", "acct"),
        ("public", "item"),
        ("public", "nokey"),
    ]


def test_a_commit_still_waiting_for_a_synchronous_standby_is_not_overwritten(
    pg: PgDatabase, tmp_path: Any
) -> None:
    """A commit handed to the stream while still invisible (waiting for a standby that never answers).

    Its update is streamed at once, but a chunk read then would not see it, and its stale row at the
    watermark would overwrite the update: the job waits until it is visible before its first chunk.
    """
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO item SELECT i, 'i' || i FROM generate_series(1, 50) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE item")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    pg.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
    pg.execute("ALTER SYSTEM SET synchronous_commit = 'local'")  # (every session but the one below)
    pg.execute("SELECT pg_reload_conf()")
    waiting = psycopg.connect(pg.dsn, autocommit=True)
    pid = waiting.info.backend_pid
    blocked = threading.Thread(
        target=lambda: waiting.execute(
            "SET synchronous_commit = on; UPDATE item SET v = 'late' WHERE id = 5"
        ),
        daemon=True,
    )
    try:
        blocked.start()
        wait_for(
            lambda: (
                pg.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))[0][0]
                == "SyncRep"
            ),
            "the update waiting for the standby",
        )
        got = _snapshot(served, "public.item", "--chunk-rows", "20", "--no-wait")
        assert got.returncode == 0, got.stderr
        time.sleep(3)  # (the job waits for the update to be visible: no chunk yet)
        assert int(served.status()["incremental"]["tables"][0].get("chunks_done", 0)) == 0
        pg.execute("SELECT pg_cancel_backend(%s)", (pid,))  # (committed locally: now visible)
        blocked.join(30)
        wait_for(lambda: served.status()["incremental"].get("state") == "complete", "the snapshot")
        got = subscribe(served.address, "--idle-timeout", "3")
        assert got.returncode == 0, got.stderr
    finally:
        pg.execute("ALTER SYSTEM RESET synchronous_standby_names")
        pg.execute("ALTER SYSTEM RESET synchronous_commit")
        pg.execute("SELECT pg_reload_conf()")
        waiting.close()
        code, err = served.terminate()
    assert code == 0, err
    item: dict[int, str] = {}
    for t in map(json.loads, got.stdout.splitlines()):
        for ch in t["changes"]:
            item[ch["new"]["id"]] = ch["new"]["v"]
    assert item == {i: "late" if i == 5 else f"i{i}" for i in range(1, 51)}


def test_a_table_asked_for_while_a_job_runs_is_queued_and_then_taken(pg: PgDatabase, tmp_path: Any) -> None:
    """A second `csnd snapshot` while the first job runs: queued behind it, shown so, then taken whole."""
    _setup(pg, rows=ROWS)
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO item SELECT i, 'i' || i FROM generate_series(1, 500) AS i")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    writer = _Writer(pg, seed=5, limit=ROWS).start()
    try:
        first = _snapshot(served, "public.acct", "--chunk-rows", "50", "--no-wait")  # (80 chunks: seconds)
        assert first.returncode == 0, first.stderr
        second = subprocess.Popen(
            [*CSND, "snapshot", served.address, "public.item", "--chunk-rows", "100"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: len(served.status()["incremental"].get("queued", [])) == 1, "the second job queued")
        shown = served.status()["incremental"]
        assert shown["state"] == "running" and shown["tables"][0]["table"] == "acct", shown
        _, err = second.communicate(timeout=600)
        assert second.returncode == 0, err
        assert "complete" in err.splitlines()[-1], err
        writer.stop()
        status = served.status()["incremental"]
        assert status["queued"] == [] and list(status["ended"].values()) == ["complete", "complete"], status
        txns = _check_equal(pg, served)
    finally:
        writer.stop()
        code, err = served.terminate()
    assert code == 0, err
    items = {ch["new"]["id"] for t in txns if "snapshot" in t for ch in t["changes"] if ch["table"] == "item"}
    assert items == set(range(1, 501))
    jobs = [t["snapshot"]["incremental"] for t in txns if "snapshot" in t]
    assert len(set(jobs)) == 2 and jobs == sorted(jobs, key=jobs.index)  # (acct's job whole, then item's)


def _copy_after(
    stale: dict[tuple[str, int], dict[str, Any]], lines: list[str], *, drop: bool
) -> dict[tuple[str, int], dict[str, Any]]:
    """A consumer's copy of acct: `stale` (as of CSN 0), then every change and read, each at its CSN.

    With `drop`, the rule of docs/design.md section 7: once a job's last chunk
    of the table is applied, the rows neither read by the job nor changed
    after its marker's `since` no longer exist.
    """
    copy = {k: (0, row) for k, row in stale.items()}
    for txn in map(json.loads, lines):
        for ch in txn["changes"]:
            if ch["table"] != "acct":
                continue
            old, new = ch["old"], ch["new"]
            if ch["op"] in ("update", "delete"):
                copy.pop((old["region"], old["id"]) if old else (new["region"], new["id"]), None)
            if ch["op"] != "delete":
                copy[(new["region"], new["id"])] = (txn["csn"], new)
        m = txn.get("snapshot") or {}
        if drop and "incremental" in m and m["table"] == "acct" and m["last"]:
            copy = {k: v for k, v in copy.items() if v[0] > m["since"]}
    return {k: row for k, (_, row) in copy.items()}


def test_a_consumer_drops_the_rows_deleted_before_the_snapshot(pg: PgDatabase, tmp_path: Any) -> None:
    """A copy made before rows were deleted (no stream saw it) loses them by the chunks' `since`."""
    _setup(pg, rows=ROWS)
    stale, _ = _table(pg)  # (a consumer's copy from an earlier load)
    pg.execute("DELETE FROM acct WHERE id % 10 = 0")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"
    served = start_serve([source], str(tmp_path / "log"))
    writer = _Writer(pg, seed=6, limit=ROWS).start()
    try:
        wait_for(lambda: writer.done > 50, "writes before the snapshot")
        got = _snapshot(served, "public.acct", "--chunk-rows", "300")
        assert got.returncode == 0, got.stderr
        writer.stop()
        lines = read_everything(pg, served)
    finally:
        writer.stop()
        code, err = served.terminate()
    assert code == 0, err
    want, _ = _table(pg)
    naive = _copy_after(stale, lines, drop=False)
    assert len(naive.keys() - want.keys()) >= ROWS // 20  # (without the rule the deleted rows stay)
    copy = _copy_after(stale, lines, drop=True)
    assert copy.keys() == want.keys(), sorted(copy.keys() ^ want.keys())[:5]
    assert copy == want
