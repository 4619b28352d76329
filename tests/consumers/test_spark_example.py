"""The exactly-once example: a current-state copy survives kill -9 of the Spark driver.

The job runs as a subprocess (its own Spark driver) against a served
changelog; it is killed with SIGKILL (the whole process group: the Python
driver and its JVM) after some micro-batches, then restarted from its
checkpoint with Trigger.AvailableNow.  Both sinks must then equal the table
as the transaction lines leave it, with every change applied exactly once.
The first job keys each change by the `key` the stream gives it; the second
names it with `--key`, the override.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest

from csnd.changelog import Changelog, SubscriptionStore
from csnd.consumers.examples.current_state import (
    apply_changes,
    apply_versioned,
    changes_of,
    export_covers,
    follows,
    parquet_progress,
    pg_table,
    read_parquet_state,
)
from csnd.core.exportnames import file_name, parse_name
from csnd.service import start_changefeed
from csnd.testing.pgserver import free_port
from tests.consumers.test_spark_parquet import export_lines
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import start_serve, wait_for

TABLE, KEY = "public.acct", ["id"]


def oracle(
    lines: list[tuple[int, bytes]], seq_among_all: bool = False
) -> tuple[dict[str, dict[str, Any]], list[tuple[int, int]]]:
    """The table's final state, applying its changes one by one as the section 7 lines say.

    And each change applied, as (csn, seq): seq counts the table's changes of
    the transaction (the source's `tables` option), or, `seq_among_all`, all
    of them (the export, which keeps every table's).
    """
    state: dict[str, dict[str, Any]] = {}
    applied = []
    for csn, line in lines:
        seq = -1
        for ch in json.loads(line)["changes"]:
            if seq_among_all:
                seq += 1
            if (ch["schema"], ch["table"]) != ("public", "acct"):
                continue
            if not seq_among_all:
                seq += 1
            applied.append((csn, seq))
            op = ch["op"]
            if op == "truncate":
                state = {}
                continue
            old, new = ch["old"], ch["new"]
            if op in ("update", "delete"):
                gone = state.pop(json.dumps([(old or new)["id"]]), {})
            if op in ("insert", "update"):
                row = dict(new)
                for col in ch.get("unchanged", []):
                    if col in gone:
                        row[col] = gone[col]
                state[json.dumps([row["id"]])] = row
    return state, applied


def job(target: str, tmp: Any, pg: PgDatabase, max_transactions: int, *extra: str) -> subprocess.Popen[bytes]:
    return _job(tmp, pg, "--target", target, "--max-transactions", str(max_transactions), *extra)


def _job(tmp: Any, pg: PgDatabase, *args: str) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "csnd.consumers.examples.current_state", "--table", TABLE,
        "--checkpoint", str(tmp / "ck"), "--parquet", str(tmp / "copy"), "--postgres", pg.dsn, *args,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / "job.log", "ab"), start_new_session=True
    )


def batches_done(pg: PgDatabase) -> int:
    try:
        rows = pg.execute("SELECT batch_id FROM csnd_sink_progress")
    except psycopg.errors.UndefinedTable:
        return -1
    return int(rows[0][0]) if rows else -1  # type: ignore[call-overload]


def _await_batches(running: subprocess.Popen[bytes], pg: PgDatabase, tmp: Any, last_id: int) -> None:
    """Until the job has applied batch `last_id`; the job dying first, or 600 s, fails the test."""
    deadline = time.monotonic() + 600
    while batches_done(pg) < last_id:
        assert running.poll() is None, (tmp / "job.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the job applied no batches in 600 s"
        time.sleep(0.1)


@pytest.mark.timeout(2400)  # (two Spark start-ups of a subprocess on a busy 2-core machine)
def test_kill_9_of_the_driver_mid_stream_then_restart_is_exactly_once(
    tmp_path: Any, pg: PgDatabase, cluster_lines: list[tuple[int, bytes]]
) -> None:
    d = str(tmp_path / "changelog")
    log = Changelog(d)
    for csn, line in cluster_lines:
        log.append(csn, line)
    log.sync()
    server = start_changefeed(log, subscriptions=SubscriptionStore(d))
    try:
        first = job(server.address, tmp_path, pg, 4)  # small batches: the kill lands mid-stream
        _await_batches(first, pg, tmp_path, 2)  # (some batches applied, most still to come)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
        _, applied = oracle(cluster_lines)
        assert batches_done(pg) < len(applied) // 4, "killed mid-stream"
        # The restart first re-runs the batch the kill interrupted with the offsets its
        # checkpoint planned; the rest in larger batches (each costs Spark seconds).
        second = job(server.address, tmp_path, pg, 75, "--available-now")
        assert second.wait(900) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        server.stop()
        log.close()

    _check_copies(tmp_path, pg, cluster_lines)


def _exported(tmp_path: Path, lines: list[tuple[int, bytes]]) -> tuple[Path, list[str]]:
    """`lines` exported as `csnd serve --parquet-dir` does, in small files; the directory and their names."""
    export_dir = tmp_path / "export"
    with Changelog(str(tmp_path / "changelog")) as log:
        export_lines(log, export_dir, lines, file_rows=150)
    names = sorted(p.name for p in export_dir.glob("csn-*.parquet"))
    assert len(names) > 12
    return export_dir, names


@pytest.mark.timeout(2400)
def test_kill_9_of_the_driver_reading_the_export_then_restart_is_exactly_once(
    tmp_path: Any, pg: PgDatabase, cluster_lines: list[tuple[int, bytes]]
) -> None:
    """The same job on `csnd serve --parquet-dir`'s files, through Spark's file-stream source."""
    export_dir, names = _exported(tmp_path, cluster_lines)
    files = len(names)
    first = _job(tmp_path, pg, "--export", str(export_dir), "--max-files", "1")  # (a file a batch)
    try:
        _await_batches(first, pg, tmp_path, 2)  # (some files applied, most still to come)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(60)
    assert batches_done(pg) < files // 2, "killed mid-stream"
    second = _job(tmp_path, pg, "--export", str(export_dir), "--max-files", "10", "--available-now")
    assert second.wait(900) == 0, (tmp_path / "job.log").read_text()[-3000:]
    _check_copies(tmp_path, pg, cluster_lines, seq_among_all=True)


@pytest.mark.timeout(1200)
def test_files_retention_removed_before_they_were_read_stop_the_copy_naming_them(
    tmp_path: Any, pg: PgDatabase, cluster_lines: list[tuple[int, bytes]]
) -> None:
    export_dir, names = _exported(tmp_path, cluster_lines)
    gone = parse_name(names[3])
    assert gone is not None
    (export_dir / gone.name).unlink()  # (as retention would: the copy has read three files, one a batch)
    run = _job(tmp_path, pg, "--export", str(export_dir), "--max-files", "1", "--available-now")
    assert run.wait(900) != 0
    said = (tmp_path / "job.log").read_text()
    assert f"files of csn {gone.after_csn} < csn <= {gone.last_csn} are gone" in said
    assert batches_done(pg) == 2 and parquet_progress(str(tmp_path / "copy"))["batch_id"] == 2


def test_export_covers_and_follows() -> None:
    names = [file_name(0, 5), file_name(5, 9), file_name(9, 20)]
    assert export_covers(reversed(names)) == (0, 20)
    with pytest.raises(ValueError, match="csn 5 < csn <= 9 are gone"):
        export_covers([names[0], names[2]])
    with pytest.raises(ValueError, match="no export file"):
        export_covers(["part-0.parquet"])
    assert follows(None, (7, 9), "s") == 9  # (a new copy starts where the files do)
    assert follows(9, (9, 12), "s") == 12
    assert follows(12, (10, 12), "s") == 12  # (a batch that overlaps the last: Spark's re-run)
    with pytest.raises(ValueError, match=r"csn 12 < csn <= 15 are gone .*before the sink read"):
        follows(12, (15, 20), "the sink")
    assert follows(4, None, "s") == 4  # (not reading the export)


def _check_copies(
    tmp_path: Any, pg: PgDatabase, cluster_lines: list[tuple[int, bytes]], seq_among_all: bool = False
) -> None:
    """Both sinks equal the table as the lines leave it, every change applied exactly once."""
    want, applied = oracle(cluster_lines, seq_among_all)
    copy = pg_table(TABLE)
    rows = pg.execute(f'SELECT key::text, row::text FROM "{copy}"')
    got_pg = {json.dumps(json.loads(k)): json.loads(r) for k, r in rows}  # type: ignore[arg-type]
    assert got_pg == want
    done = sorted((int(c), int(s)) for c, s in pg.execute("SELECT csn, seq FROM csnd_sink_applied"))  # type: ignore[call-overload]
    assert done == applied, "every change applied once (a repeat would have violated the key)"
    got_parquet = {
        json.dumps(json.loads(k)): v for k, v in read_parquet_state(str(tmp_path / "copy")).items()
    }
    assert got_parquet == want
    progress = parquet_progress(str(tmp_path / "copy"))
    assert progress["csn"] == applied[-1][0]
    assert pq.read_table(tmp_path / "copy" / progress["snapshot"]).num_rows == len(want)


@pytest.mark.timeout(2400)
def test_kill_9_of_the_service_mid_stream_then_restart_is_exactly_once(
    tmp_path: Any, pg: PgDatabase, cluster_dir: Path, cluster_lines: list[tuple[int, bytes]]
) -> None:
    """`csnd serve` killed with -9 while the job reads from it, restarted over the same changelog."""
    sources = [str(cluster_dir / f"dn{i}.pgstream") for i in (1, 2, 3)]
    log = str(tmp_path / "changelog")
    port = free_port()  # (below the ephemeral range: no outgoing connection takes it before the restart)
    listen = ("--listen", f"127.0.0.1:{port}")  # (the same address after the restart)
    served = start_serve(sources, log, *listen)
    per_batch = 25  # transactions (each micro-batch costs Spark seconds)
    # all of it durable first: --available-now reads what the changelog holds when the job starts
    wait_for(lambda: served.newest_csn() == cluster_lines[-1][0], "the cluster in the changelog")
    try:
        first = job(f"127.0.0.1:{port}", tmp_path, pg, per_batch, "--available-now", "--key", ",".join(KEY))
        _await_batches(first, pg, tmp_path, 1)  # (some batches applied, most still to come)
        served.kill()
        assert batches_done(pg) < len(cluster_lines) // per_batch - 2, "killed mid-stream"
        served = start_serve(sources, log, *listen)
        # The job either rides the restart out (its client reconnects) or fails; then it is
        # restarted from its checkpoint, as an operator would.
        if first.wait(900) != 0:
            second = job(f"127.0.0.1:{port}", tmp_path, pg, 75, "--available-now", "--key", ",".join(KEY))
            assert second.wait(900) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        code, err = served.terminate()
    assert code == 0, err
    _check_copies(tmp_path, pg, cluster_lines)


def _row(csn: int, op: str, old: str | None, new: str | None, key: list[str] | None) -> dict[str, Any]:
    return {"csn": csn, "seq": 0, "op": op, "old": old, "new": new, "unchanged": [], "key": key}


def test_each_change_is_applied_by_its_own_key_unless_overridden() -> None:
    rows = [
        _row(0, "read", None, '{"a": 9, "b": "s"}', ["a"]),  # (an initial snapshot's row)
        _row(1, "insert", None, '{"a": 1, "b": "x"}', ["a"]),
        _row(2, "update", '{"a": 1}', '{"a": 2, "b": "y"}', ["a"]),  # the key itself changes
        _row(3, "insert", None, '{"a": 3, "b": "y"}', ["a"]),
        _row(4, "delete", '{"a": 3}', None, ["a"]),
    ]
    state: dict[str, dict[str, Any]] = {}
    apply_changes(state, [c for _, _, c in changes_of(rows)])
    assert state == {"[9]": {"a": 9, "b": "s"}, "[2]": {"a": 2, "b": "y"}}
    # --key b wins over the stream's: the third row has the second's b and replaces it; the old
    # keys of the update and the delete hold no b, so they find nothing (the override is the caller's)
    state = {}
    apply_changes(state, [c for _, _, c in changes_of(rows, ["b"])])
    assert state == {'["s"]': {"a": 9, "b": "s"}, '["x"]': {"a": 1, "b": "x"}, '["y"]': {"a": 3, "b": "y"}}
    # a change whose stream names no key (REPLICA IDENTITY NOTHING, an old changelog) needs --key
    with pytest.raises(ValueError, match=r"the insert at csn 5 .* names no key columns.*--key"):
        changes_of([_row(5, "insert", None, '{"a": 1}', [])])
    with pytest.raises(ValueError, match="names no key columns"):
        changes_of([_row(5, "insert", None, '{"a": 1}', None)])
    assert changes_of([_row(6, "truncate", None, None, [])])[0][2][4] == []


def _chunk_row(
    csn: int, seq: int, node: str, new: str | None, *, last: bool, redo: str | None = None, since: int = 10
) -> dict[str, Any]:
    marker = {"node": node, "schema": "public", "table": "acct", "incremental": "j", "chunk": 1,
              "last": last, "since": since, "redo": redo}  # fmt: skip
    op = "read" if new is not None else "snapshot"
    return {**_row(csn, op, None, new, ["a"] if new else None), "seq": seq, "node": node, "snapshot": marker}


def test_a_tables_last_chunk_drops_its_nodes_rows_put_at_or_before_since() -> None:
    """docs/design.md section 7, "Deleted rows", per node, once the last chunk is applied whole."""
    state: dict[str, dict[str, Any]] = {}
    versions: dict[str, tuple[str | None, int]] = {"[1]": ("dn1", 0), "[2]": ("dn1", 0), "[3]": ("dn2", 0),
                                                   "[4]": (None, 0)}  # fmt: skip
    state.update({k: {"a": int(k[1])} for k in versions})
    rows = [
        {**_row(11, "insert", None, '{"a": 5}', ["a"]), "node": "dn1"},  # (after since: stays)
        _chunk_row(12, 0, "dn1", '{"a": 1}', last=False),
        _chunk_row(13, 0, "dn1", None, last=True, redo="relation changed"),  # (read again: no drop)
        _chunk_row(14, 0, "dn1", '{"a": 6}', last=True),
        _chunk_row(14, 1, "dn1", '{"a": 7}', last=True),
    ]
    changes = changes_of(rows)
    assert [c[6] for _, _, c in changes] == [None, None, None, None, 10]  # (the chunk's last row only)
    apply_versioned(state, versions, changes)
    # [2] (dn1, not read again) is gone; [3] is dn2's, [4] of unknown node: kept
    assert sorted(state) == ["[1]", "[3]", "[4]", "[5]", "[6]", "[7]"]
    assert versions["[1]"] == ("dn1", 12) and versions["[3]"] == ("dn2", 0)
    # an emptied table: its only chunk kept no row, and its `snapshot` row drops every row of the node
    apply_versioned(state, versions, changes_of([_chunk_row(20, 0, "dn1", None, last=True, since=19)]))
    assert sorted(state) == ["[3]", "[4]"]
