"""`csnd serve --snapshot initial` on a live PostgreSQL 15 node: the tables, then the stream, exactly.

A writer inserts, updates (also keys) and deletes while the slot is made and
while the snapshot is copied.  Replaying the changelog from 0 -- reads and
inserts put a row under its key, updates move it, deletes remove it -- must
give the table exactly: an insert of a key already there (a row twice at the
boundary), or an update or delete of a key not there (a row missed), fails
at once.  A service killed in the middle of the snapshot showed none of it
to a reader, and the next start takes it again from scratch (new slot,
empty changelog): the new snapshot equals the table again, and so does the
Spark current-state example's copy, keyed by the stream alone.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import urllib.request
from datetime import UTC
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from csnd.consumers.examples.current_state import pg_table, read_parquet_state
from csnd.core.ids import lsn_from_str
from csnd.snapshot.plan import ctid_chunk_max_rows
from tests.consumers.test_spark_example import TABLE as SPARK_TABLE
from tests.consumers.test_spark_example import job as spark_job
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import Served, start_serve, subscribe, wait_for

ROWS = 200_000  # (the size: a table that already holds data)


def _setup(pg: PgDatabase, rows: int = ROWS) -> None:
    pg.execute(
        "CREATE TABLE acct (id int, region text, amount numeric(12,2), flag bool, doc jsonb, at timestamptz, "
        "blob bytea, x float8, tags int[], PRIMARY KEY (region, id))"
    )
    pg.execute("CREATE TABLE loose (n int, note text)")  # no key: one chunk, insert-only
    pg.execute(
        "INSERT INTO acct SELECT i, 'r' || (i % 7), (i * 1.25)::numeric(12,2), i % 3 = 0, "
        "jsonb_build_object('k', i, 'deep', jsonb_build_array(i, 'é\t\\\\')), "
        "timestamptz '2024-01-01 00:00+00' + i * interval '1 minute', decode(lpad(to_hex(i), 8, '0'), 'hex'), "
        f"i / 3.0, ARRAY[i, -i] FROM generate_series(1, {rows}) AS i"
    )
    pg.execute("INSERT INTO loose SELECT i, 'n\t' || i FROM generate_series(1, 500) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("ANALYZE")


class _Writer:
    """Random inserts, updates (a tenth of them moving the key) and deletes until stopped."""

    def __init__(self, pg: PgDatabase, seed: int, limit: int = ROWS) -> None:
        self.pg, self.rng, self.limit = pg, random.Random(seed), limit
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> _Writer:
        self._thread.start()
        return self

    def _run(self) -> None:
        rng = self.rng
        next_id = self.limit * 10
        with psycopg.connect(self.pg.dsn, autocommit=True) as c:
            while not self._stop.is_set():
                i = rng.randint(1, self.limit * 2)
                region = f"r{i % 7}"
                r = rng.random()
                with c.transaction():
                    if r < 0.3:
                        next_id += 1
                        c.execute(
                            "INSERT INTO acct VALUES (%s, %s, 1.5, true, '{\"w\": 1}', now(), '\\x00', 0.1, '{1}')",
                            (next_id, f"r{next_id % 7}"),
                        )
                    elif r < 0.6:
                        c.execute(
                            "UPDATE acct SET amount = amount + 1, doc = doc || '{\"u\": true}' "
                            "WHERE id = %s AND region = %s",
                            (i, region),
                        )
                    elif r < 0.65:
                        c.execute(
                            "UPDATE acct SET id = id + 1000000 WHERE id = %s AND region = %s", (i, region)
                        )
                    elif r < 0.9:
                        c.execute("DELETE FROM acct WHERE id = %s AND region = %s", (i, region))
                    else:
                        c.execute("INSERT INTO loose VALUES (%s, 'w')", (i,))
                self.done += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _replay(
    lines: list[str],
) -> tuple[dict[tuple[str, int], dict[str, Any]], list[tuple[int, str]], list[dict[str, Any]]]:
    """The acct rows by key, loose's rows, and the transactions, from the changelog's lines."""
    acct: dict[tuple[str, int], dict[str, Any]] = {}
    loose: list[tuple[int, str]] = []
    txns = [json.loads(line) for line in lines]
    for txn in txns:
        for ch in txn["changes"]:
            op, old, new = ch["op"], ch["old"], ch["new"]
            if ch["table"] == "loose":
                assert op in ("read", "insert"), ch
                loose.append((new["n"], new["note"]))
                continue
            if op in ("read", "insert"):
                key = (new["region"], new["id"])
                assert key not in acct, f"{op} of a row already there (csn {txn['csn']}): {key}"
                acct[key] = new
            elif op == "update":
                before = (old["region"], old["id"]) if old else (new["region"], new["id"])
                assert before in acct, f"update of a row not there (csn {txn['csn']}): {before}"
                del acct[before]
                acct[(new["region"], new["id"])] = new
            elif op == "delete":
                key = (old["region"], old["id"])
                assert key in acct, f"delete of a row not there (csn {txn['csn']}): {key}"
                del acct[key]
            else:
                raise AssertionError(ch)
    return acct, loose, txns


def _table(pg: PgDatabase) -> tuple[dict[tuple[str, int], dict[str, Any]], list[tuple[int, str]]]:
    """acct and loose as the section 7 JSON values of their rows."""
    acct = {}
    for row in pg.execute(
        "SELECT id, region, amount, flag, doc, at, blob, x, tags FROM acct ORDER BY region, id"
    ):
        id_, region, amount, flag, doc, at, blob, x, tags = row
        assert isinstance(amount, Decimal) and hasattr(at, "astimezone") and isinstance(blob, bytes)
        acct[(str(region), int(str(id_)))] = {
            "id": id_,
            "region": region,
            "amount": str(amount),
            "flag": flag,
            "doc": doc,
            "at": at.astimezone(UTC).isoformat(),
            "blob": "\\x" + blob.hex(),
            "x": x,
            "tags": tags,
        }
    loose = [(int(str(n)), str(note)) for n, note in pg.execute("SELECT n, note FROM loose")]
    return acct, loose


def _confirmed(pg: PgDatabase) -> int:
    (row,) = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")
    return lsn_from_str(str(row[0]))


def read_everything(pg: PgDatabase, served: Served) -> list[str]:
    """Every line a consumer reads from 0, once the slot is confirmed to the end of the WAL."""
    end = lsn_from_str(pg.current_lsn())
    wait_for(lambda: _confirmed(pg) >= end, "the slot confirmed to the end of the WAL", seconds=300)
    got = subscribe(served.address, "--idle-timeout", "3")
    assert got.returncode == 0, got.stderr
    return got.stdout.splitlines()


def _check_equal(pg: PgDatabase, served: Served) -> list[dict[str, Any]]:
    """Replaying what a consumer reads from 0 gives the tables exactly; returns the transactions."""
    acct, loose, txns = _replay(read_everything(pg, served))
    want_acct, want_loose = _table(pg)
    assert acct.keys() == want_acct.keys()
    bad = [k for k in want_acct if acct[k] != want_acct[k]]
    assert not bad, (bad[:3], [acct[k] for k in bad[:1]], [want_acct[k] for k in bad[:1]])
    assert sorted(loose) == sorted(want_loose)
    return txns


def test_initial_snapshot_then_the_stream_equals_the_table(pg: PgDatabase, tmp_path: Any) -> None:
    _setup(pg)
    writer = _Writer(pg, seed=1).start()  # (running while the slot is made, and the snapshot copied)
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial"
    served = start_serve([source], str(tmp_path / "log"))
    try:
        wait_for(lambda: served.status().get("snapshot", {}).get("state") == "complete", "the snapshot")
        # (counted from the completion: on a loaded machine the writer may do hundreds during the copy)
        at_complete = writer.done
        wait_for(lambda: writer.done > at_complete + 150, "writes after the snapshot")
        writer.stop()
        txns = _check_equal(pg, served)
        status = served.status()
        snap = status["snapshot"]
        assert {(t["table"], t["state"]) for t in snap["tables"]} == {("acct", "done"), ("loose", "done")}
        assert int(snap["first_csn"]) == 1
        assert served.http is not None
        with urllib.request.urlopen(served.http + "metrics", timeout=30) as r:
            metrics = r.read().decode()
        assert 'csnd_snapshot_rows{node="dn1",table="public.acct"}' in metrics
    finally:
        writer.stop()
        code, err = served.terminate()
    assert code == 0, err
    # the snapshot's records first, csn 1, 2, ..., the completion record last, all below the stream
    marked = [t for t in txns if "snapshot" in t]
    assert [t["csn"] for t in marked] == list(range(1, len(marked) + 1))
    assert txns[: len(marked)] == marked and marked[-1]["snapshot"]["done"] is True
    # acct analysed: the default cut it into ranges of its heap pages, each chunk once, none holding
    # more rows than its pages can (4 times chunk_rows at most, whatever the statistics said)
    chunks = [t for t in marked[:-1] if t["snapshot"]["table"] == "acct"]
    assert sorted((t["snapshot"]["chunk"], t["snapshot"]["chunks"]) for t in chunks) == [
        (i, len(chunks)) for i in range(1, len(chunks) + 1)
    ]
    assert len(chunks) > 1 and all(len(t["changes"]) <= ctid_chunk_max_rows(10_000) for t in chunks)
    point = lsn_from_str(marked[0]["nodes"]["dn1"]["commit_lsn"])
    assert all(t["csn"] >= point for t in txns[len(marked) :])
    assert marked[-1]["snapshot"]["rows"] == sum(len(t["changes"]) for t in marked)
    assert len(txns) > len(marked) + 100  # (the writer's transactions after the consistent point)
    # Each table's relation version is kept from its first chunk on, keyed as its reads are; the
    # stream's own Relation messages, rendered the same, add no other version.
    kept = [
        json.loads(x)["relation"] for x in (tmp_path / "log" / "relations.jsonl").read_text().splitlines()
    ]
    assert sorted(r["table"] for r in kept) == ["acct", "loose"]
    for r in kept:
        first = next(t for t in marked[:-1] if t["snapshot"]["table"] == r["table"])
        assert r["csn"] == first["csn"] and r["key"] == first["changes"][0]["key"]
        assert [c["name"] for c in r["columns"]] == list(first["changes"][0]["new"])
    # a restart streams on from the slot, the snapshot is not taken again
    served = start_serve([source], str(tmp_path / "log"))
    try:
        assert "snapshot" not in served.status() or not served.status()["snapshot"].get("state")
        pg.execute("INSERT INTO loose VALUES (-1, 'after the restart')")
        _check_equal(pg, served)
    finally:
        code, err = served.terminate()
    assert code == 0, err


def _spark_copy(address: str, tmp_path: Any, pg: PgDatabase) -> dict[tuple[str, int], dict[str, Any]]:
    """acct as the exactly-once example copies it to PostgreSQL and Parquet (the two must agree)."""
    job = spark_job(address, tmp_path, pg, 2_000, "--available-now")
    try:
        assert job.wait(900) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    rows = pg.execute(f'SELECT row::text FROM "{pg_table(SPARK_TABLE)}"')
    copy = {(r["region"], r["id"]): r for r in (json.loads(str(row)) for (row,) in rows)}
    parquet = read_parquet_state(str(tmp_path / "copy"))
    assert sorted(parquet.values(), key=lambda r: (r["region"], r["id"])) == [copy[k] for k in sorted(copy)]
    return copy


@pytest.mark.timeout(2400)  # (a Spark start-up of a subprocess on a busy 2-core machine)
def test_killed_mid_snapshot_the_next_start_takes_it_again_and_equals_the_table(
    pg: PgDatabase, tmp_path: Any
) -> None:
    """kill -9 while the second table waits behind a lock: no reader saw any of it; the next start takes it again.

    Cut by key ranges (`split = "key"`): that path under a writer and a restart, chunks of at most
    chunk_rows rows; the default's page ranges are the first test's.
    """
    _setup(pg, rows=3_000)
    config = tmp_path / "csnd.toml"
    config.write_text('[snapshot]\nchunk_rows = 500\nreaders = 2\nsplit = "key"\n')
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial&text=true"
    log_dir = str(tmp_path / "log")
    blocker = psycopg.connect(pg.dsn)
    try:
        served = start_serve([source], log_dir, "--config", str(config))
        # The snapshot starts after the dashboard line; loose (no key: one chunk, planned without a
        # query) is copied after acct's 6 chunks. (Not before start: an ACCESS EXCLUSIVE lock takes
        # an xid, and the slot's consistent point would wait for it.)
        blocker.execute("LOCK TABLE loose IN ACCESS EXCLUSIVE MODE")
        wait_for(
            lambda: any(
                t["table"] == "acct" and t["state"] == "done"
                for t in served.status().get("snapshot", {}).get("tables", [])
            ),
            "acct copied while loose waits for its lock",
        )
        assert served.status()["snapshot"]["state"] == "running"
        held = served.status()["changelog"]  # (acct's chunks are durable, and shown to no one)
        assert int(held["bytes"]) > 0 and int(held.get("newest_csn", 0)) == 0, held
        early = subscribe(served.address, "--idle-timeout", "2")
        assert early.returncode == 0 and early.stdout == "", early.stderr
        served.kill()
    finally:
        blocker.rollback()
        blocker.close()
    writer = _Writer(pg, seed=2, limit=3_000).start()
    served = start_serve([source], log_dir, "--config", str(config))
    try:
        wait_for(
            lambda: served.status().get("snapshot", {}).get("state") == "complete",
            "the snapshot",
            diagnose=lambda: json.dumps(served.status()),
        )
        wait_for(lambda: writer.done > 200, "writes after the snapshot")
        writer.stop()
        txns = _check_equal(pg, served)
        # The Spark current-state example, keyed by the stream alone (no --key), equals the table too.
        copy = _spark_copy(served.address, tmp_path, pg)
    finally:
        writer.stop()
        code, err = served.terminate()
    assert code == 0, err
    want, _ = _table(pg)
    assert copy.keys() == want.keys()
    assert [k for k in want if copy[k] != want[k]] == []
    assert "taking it again from the start with new slots" in err, err
    # acct in chunks of at most 500 rows (how many depends on the writer's work before the consistent
    # point), loose in one, then the completion record: one snapshot, none of the first one's chunks
    snap = [t for t in txns if "snapshot" in t]
    acct = [t for t in snap if t["snapshot"].get("table") == "acct"]
    loose = [t for t in snap if t["snapshot"].get("table") == "loose"]
    assert acct and all(len(t["changes"]) <= 500 for t in acct)
    assert len(loose) == 1 and len(snap) == len(acct) + len(loose) + 1 and snap[-1]["snapshot"].get("done")
    assert [t["csn"] for t in snap] == list(range(1, len(snap) + 1))


def test_snapshot_never_streams_only(pg: PgDatabase, tmp_path: Any) -> None:
    """The default: no snapshot, the slot made by --create-slot, only what commits after the ready line."""
    _setup(pg, rows=100)
    served = start_serve(
        [f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"], str(tmp_path / "log")
    )
    try:
        pg.execute("INSERT INTO loose VALUES (7, 'after')")
        end = lsn_from_str(pg.current_lsn())
        wait_for(lambda: _confirmed(pg) >= end, "the slot confirmed to the end of the WAL")
        got = subscribe(served.address, "--idle-timeout", "2")
        lines = got.stdout.splitlines()
        assert [json.loads(line)["changes"][0]["new"] for line in lines] == [{"n": 7, "note": "after"}]
        assert not served.status().get("snapshot", {}).get("state")
    finally:
        code, err = served.terminate()
    assert code == 0, err
