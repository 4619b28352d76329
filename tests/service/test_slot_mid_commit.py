"""A GTM node's stream must never begin inside a commit it cannot order (issue 40).

A new slot streams every transaction that commits after its consistent
point, but a non-transactional message only if it lies after that point.
PostgreSQL's snapshot builder reaches the consistent point once the
transactions running at its FULL point have ended; a transaction that got
its xid after the FULL point is decoded whole, even if it was still running
at the consistent point.  So a writer that logged its `committing` marker
between the two points and commits after them arrives with its commit and
without its marker: the sender cannot know it must hold larger CSNs back for
it.  It used to release a larger CSN first and stop the service ("a csn went
backwards"); a restart then dropped the transaction as already delivered.

Each test makes that window happen on purpose, without timing: a first open
transaction (B0) holds the slot's creation before its FULL point, a second
one (B1), begun once the creation waits for B0, holds it between FULL and
the consistent point; once B0 has ended and the creation waits for B1, a
global transaction (gT) writes its row, logs `committing`, takes its CSN and
is held there by the writer's pause hook; then B1 ends and the slot is
consistent.  Another global transaction (g2) commits with a larger CSN while
gT is held, then gT is let go.  Every transaction must arrive once, in CSN
order; an abort of gT must stop nothing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from csnd.core.ids import lsn_from_str
from csnd.gtm.sequencer import Gtm
from csnd.gtm.writer import GlobalTransaction
from csnd.reader.settle import settle_start
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import Served, start_serve, subscribe, wait_for

Conn = psycopg.Connection[Any]
SLOT = "mid"


class WriterFails(Exception):
    """What a held writer raises when the test makes it abort."""


@dataclass
class HeldWriter:
    """A global transaction on dn1, committed in a thread of its own and held at its `csn` step."""

    url: str
    gtm: Gtm
    gid: str
    row: int
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    fail: bool = False
    error: BaseException | None = None
    csn: int | None = None

    def start(self) -> HeldWriter:
        threading.Thread(target=self._run, daemon=True, name=f"writer-{self.gid}").start()
        assert self.reached.wait(60), f"writer {self.gid} never reached its csn step: {self.error}"
        return self

    def release(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.go.set()

    def _pause(self, step: str) -> None:
        if step != "csn":
            return
        self.reached.set()
        assert self.go.wait(300)
        if self.fail:
            raise WriterFails(self.gid)

    def _run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                gt = GlobalTransaction(self.gtm, {"dn1": conn}, self.gid, pause=self._pause)
                gt.execute("dn1", "INSERT INTO item VALUES (%s)", (self.row,))
                self.csn = gt.commit()
        except BaseException as e:  # (a failure the test asked for, or one it reports)
            self.error = e
            self.reached.set()

    def done(self) -> None:
        """Wait until the writer's thread has ended (committed or aborted, as asked)."""
        wait_for(lambda: self.csn is not None or self.error is not None, f"writer {self.gid} to end")
        if not self.fail:
            assert self.error is None, self.error


def _commit(url: str, gtm: Gtm, gid: str, row: int) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        gt = GlobalTransaction(gtm, {"dn1": conn}, gid)
        gt.execute("dn1", "INSERT INTO item VALUES (%s)", (row,))
        csn = gt.commit()
    assert csn is not None
    return csn


def _open_xid(conn: Conn) -> int:
    """Begin a transaction on `conn` (outside the publication) with an xid; its 32-bit xid."""
    conn.execute("BEGIN")
    conn.execute("INSERT INTO hold VALUES (1)")
    row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return int(str(row[0])) & 0xFFFFFFFF


def _waited_on(probe: Conn, xid: int) -> bool:
    """Whether some process (the slot's creation) waits for transaction `xid` to end."""
    row = probe.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted "
        "AND transactionid::text = %s",
        (str(xid),),
    ).fetchone()
    return row is not None and int(str(row[0])) > 0


@pytest.fixture
def db(pg: PgDatabase) -> Iterator[PgDatabase]:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE TABLE hold (id int)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE item")
    try:
        yield pg
    finally:
        pg.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            (SLOT,),
        )


def _source(pg: PgDatabase) -> str:
    return f"dn1={pg.url}?slot={SLOT}&publication=csnd_pub&mode=gtm"


def _serve_with_writer_mid_commit(
    pg: PgDatabase, changelog: str, gtm: Gtm, gid: str, row: int, *extra: str
) -> tuple[Served, HeldWriter]:
    """`csnd serve --create-slot`, whose slot becomes consistent while writer `gid` is between its markers."""
    started: list[Served] = []
    failed: list[BaseException] = []

    def serve() -> None:
        try:
            started.append(start_serve([_source(pg)], changelog, "--create-slot", *extra))
        except BaseException as e:
            failed.append(e)

    with pg.connect() as probe, pg.connect() as b0, pg.connect() as b1:
        xid0 = _open_xid(b0)
        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        wait_for(lambda: _waited_on(probe, xid0) or failed, "the slot's creation waiting for B0")
        xid1 = _open_xid(b1)  # (begun after the creation's first running-xacts record)
        b0.execute("COMMIT")
        wait_for(lambda: _waited_on(probe, xid1) or failed, "the slot's creation at its FULL point")
        writer = HeldWriter(pg.url, gtm, gid, row).start()  # xid, `committing`, csn: all before consistency
        assert writer.error is None, writer.error
        b1.execute("COMMIT")
        thread.join(120)
    assert not failed, failed[0]
    assert started, "csnd serve never said it was ready"
    return started[0], writer


def _lines(served: Served) -> list[dict[str, Any]]:
    got = subscribe(served.address, "--idle-timeout", "3")
    assert got.returncode == 0, got.stderr
    return [json.loads(line) for line in got.stdout.splitlines()]


def _delivered(served: Served) -> list[tuple[str, int]]:
    """The streamed transactions, as (gid, csn) in the order they came (an initial snapshot's records left out)."""
    return [(t["gid"], t["csn"]) for t in _lines(served) if t.get("gid")]


def _wait_durable(served: Served, csn: int) -> None:
    def durable() -> bool:
        served.raise_if_exited()  # (a service that stopped fails the test with its error at once)
        return served.newest_csn() >= csn

    wait_for(
        durable,
        f"csn {csn} in the changelog",
        diagnose=lambda: served.status()["nodes"],
    )


def test_a_commit_whose_committing_marker_precedes_the_slot_arrives_in_csn_order(
    db: PgDatabase, tmp_path: Path
) -> None:
    gtm = Gtm(100)
    served, held = _serve_with_writer_mid_commit(db, str(tmp_path / "log"), gtm, "gT", 1)
    try:
        csn2 = _commit(db.url, gtm, "g2", 2)  # a larger csn, committed first
        held.release()
        held.done()
        assert held.csn is not None and held.csn < csn2
        _wait_durable(served, csn2)
        assert _delivered(served) == [("gT", held.csn), ("g2", csn2)]
    finally:
        held.release()
        code, err = served.terminate()
    assert code == 0, err


def test_an_abort_whose_committing_marker_precedes_the_slot_stops_nothing(
    db: PgDatabase, tmp_path: Path
) -> None:
    gtm = Gtm(100)
    served, held = _serve_with_writer_mid_commit(db, str(tmp_path / "log"), gtm, "gT", 1)
    try:
        csn2 = _commit(db.url, gtm, "g2", 2)
        held.release(fail=True)
        held.done()
        assert isinstance(held.error, WriterFails), held.error
        csn3 = _commit(db.url, gtm, "g3", 3)  # (the stream goes on after the abort marker)
        _wait_durable(served, csn3)
        assert _delivered(served) == [("g2", csn2), ("g3", csn3)]
    finally:
        held.release()
        code, err = served.terminate()
    assert code == 0, err


def test_a_restart_while_the_writer_is_held_loses_nothing(db: PgDatabase, tmp_path: Path) -> None:
    """Killed before the held writer commits, started again with the same command: nothing dropped."""
    gtm = Gtm(100)
    log = str(tmp_path / "log")
    served, held = _serve_with_writer_mid_commit(db, log, gtm, "gT", 1)
    try:
        csn2 = _commit(db.url, gtm, "g2", 2)
        served.kill()
        served = start_serve([_source(db)], log, "--create-slot")
        held.release()
        held.done()
        assert held.csn is not None
        csn3 = _commit(db.url, gtm, "g3", 3)
        _wait_durable(served, csn3)
        assert _delivered(served) == [("gT", held.csn), ("g2", csn2), ("g3", csn3)]
        served.terminate()
        # and once more, over a changelog that holds them all: nothing again, nothing lost
        served = start_serve([_source(db)], log, "--create-slot")
        csn4 = _commit(db.url, gtm, "g4", 4)
        _wait_durable(served, csn4)
        assert _delivered(served) == [("gT", held.csn), ("g2", csn2), ("g3", csn3), ("g4", csn4)]
    finally:
        held.release()
        code, err = served.terminate()
    assert code == 0, err


def test_an_initial_snapshot_and_the_stream_meet_without_a_gap_around_the_held_writer(
    db: PgDatabase, tmp_path: Path
) -> None:
    """`--snapshot initial`: the row committed before the slot is in the snapshot, gT and g2 streamed, in order."""
    db.execute("INSERT INTO item VALUES (0)")
    gtm = Gtm(1000)  # (the snapshot's records take the first csns)
    served, held = _serve_with_writer_mid_commit(
        db, str(tmp_path / "log"), gtm, "gT", 1, "--snapshot", "initial"
    )
    try:
        csn2 = _commit(db.url, gtm, "g2", 2)
        held.release()
        held.done()
        assert held.csn is not None
        _wait_durable(served, csn2)
        lines = _lines(served)
        read = [ch["new"]["id"] for t in lines if not t.get("gid") for ch in t["changes"]]
        assert read == [0]
        assert _delivered(served) == [("gT", held.csn), ("g2", csn2)]
    finally:
        held.release()
        code, err = served.terminate()
    assert code == 0, err


SETTLE_APP = "csnd-settle-under-test"


def _settle_polls(probe: Conn) -> set[str]:
    """When the settle's connection began each of its looks at the open xids seen so far (one per poll)."""
    rows = probe.execute(
        "SELECT query_start::text FROM pg_stat_activity WHERE application_name = %s AND query LIKE %s",
        (SETTLE_APP, "%pg_snapshot_xmin%"),
    ).fetchall()
    return {str(r[0]) for r in rows}


def test_the_start_waits_for_a_transaction_holding_the_newest_xid(db: PgDatabase) -> None:
    """A writer whose xid is the newest handed out, none later completed, is open: the start must wait for it.

    A snapshot's xmax is one past the newest *completed* xid, not the next
    one to be handed out, so such a writer lies at or above it and is in no
    snapshot's list of running xids.  The start bounded the wait by xmax and
    wrote its `csnd.start` at once: a writer that logged `committing` before
    the slot and committed after that message then came after a larger CSN
    already released ("a csn went backwards"), under load, when the service's
    start won the race with the next commit on the server.
    """
    seen: set[str] = set()
    with db.connect() as writer, db.connect() as probe:
        xid = _open_xid(writer)  # (the newest xid, and no transaction completes after it meanwhile)
        stop = threading.Event()
        result: list[object] = []

        def settle() -> None:
            try:
                result.append(
                    settle_start(f"{db.url}?application_name={SETTLE_APP}", "dn1", SLOT, "t0", stop)
                )
            except BaseException as e:
                result.append(e)

        thread = threading.Thread(target=settle, daemon=True)
        thread.start()
        try:
            # Until it returned, or has looked at the open xids twice (so it waits, and goes on waiting).
            def returned_or_polled_twice() -> bool:
                seen.update(_settle_polls(probe))
                return bool(result) or len(seen) >= 2

            wait_for(returned_or_polled_twice, "the settle to return or to wait")
            assert not result, f"the start settled while transaction {xid} was open: {result}"
            row = writer.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
            assert row is not None
            before_commit = lsn_from_str(str(row[0]))
            writer.execute("COMMIT")
            thread.join(60)
        finally:
            stop.set()
    assert len(result) == 1 and isinstance(result[0], int), result
    assert result[0] > before_commit  # (the start's message comes after the writer's commit)


def _start_written(probe: Conn) -> bool:
    """Whether a `csnd.start` message is in the WAL (read through the test's own slot, `watch`)."""
    row = probe.execute(
        "SELECT count(*) FROM pg_logical_slot_peek_changes('watch', NULL, NULL) WHERE data LIKE %s",
        ("%prefix: csnd.start%",),
    ).fetchone()
    return row is not None and int(str(row[0])) > 0


def _settle_waits(probe: Conn, seen: set[str]) -> bool:
    """Whether the service's start has looked at the open xids twice (so it waits, and goes on waiting)."""
    rows = probe.execute(
        "SELECT query_start::text FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
        ("%pg_snapshot_xmin(pg_current_snapshot()) >=%",),
    ).fetchall()
    seen.update(str(r[0]) for r in rows)
    return len(seen) >= 2


def test_the_held_writer_is_waited_for_when_nothing_commits_after_it(db: PgDatabase, tmp_path: Path) -> None:
    """gT holds the newest xid and nothing commits until the start settled or waits: gT still comes first.

    The first test commits g2 at once, and g2's commit lifted the snapshot's
    xmax past gT's xid when it came before the service's start; here g2
    waits until the start wrote its `csnd.start` message or waits.  A start
    bounded by xmax wrote it at once, and the service then stopped with "a
    csn went backwards".
    """
    db.execute("SELECT pg_create_logical_replication_slot('watch', 'test_decoding')")
    gtm = Gtm(100)
    try:
        served, held = _serve_with_writer_mid_commit(db, str(tmp_path / "log"), gtm, "gT", 1)
        try:
            seen: set[str] = set()
            with db.connect() as probe:
                wait_for(
                    lambda: _start_written(probe) or _settle_waits(probe, seen),
                    "the service's start to settle or to wait",
                )
            csn2 = _commit(db.url, gtm, "g2", 2)
            held.release()
            held.done()
            assert held.csn is not None and held.csn < csn2
            _wait_durable(served, csn2)
            assert _delivered(served) == [("gT", held.csn), ("g2", csn2)]
        finally:
            held.release()
            code, err = served.terminate()
        assert code == 0, err
    finally:
        db.execute("SELECT pg_drop_replication_slot('watch')")
