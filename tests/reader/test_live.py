"""Live capture against a real PostgreSQL, checked against a test_decoding twin slot."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from csnd.core.errors import StreamFormatError
from csnd.core.ids import lsn_from_str, lsn_to_str
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.pgoutput.messages import Begin, Commit, StreamCommit
from csnd.reader.record_cmd import record
from csnd.reader.recorded import RecordedSource
from csnd.testing import pgworkload as workload
from tests.fixtures import witness
from tests.fixtures.pg import PgDatabase

CSND = [sys.executable, "-m", "csnd.cli"]


def _slots(pg: PgDatabase, ours: str = "csnd") -> None:
    pg.execute(f"SELECT pg_create_logical_replication_slot('{ours}', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding')")


def _witness(pg: PgDatabase, upto: str) -> tuple[list[witness.WTxn], list[tuple[str, str]]]:
    rows = pg.execute(
        "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_get_changes("
        f"'witness', '{upto}', NULL, 'include-xids', '1', 'skip-empty-xacts', '1')"
    )
    return witness.text_txns(rows)


def _committed_so_far(path: Path) -> set[int]:
    """The xids whose commit a recording being written holds so far (it may end inside a transaction)."""
    xids: set[int] = set()
    xid = None
    for _, m in RecordedSource(str(path)).events():
        if isinstance(m, Begin):
            xid = m.xid
        elif isinstance(m, Commit) and xid is not None:
            xids.add(xid)
        elif isinstance(m, StreamCommit):
            xids.add(m.xid)
    return xids


def _ours(path: Path) -> tuple[list[witness.WTxn], list[tuple[str, str]]]:
    return witness.assemble(list(RecordedSource(str(path)).events()))


def _compare(ours: list[witness.WTxn], theirs: list[witness.WTxn]) -> None:
    assert [t.xid for t in ours] == [t.xid for t in theirs]
    for a, b in zip(ours, theirs, strict=True):
        assert b.end_lsn is None or a.end_lsn == b.end_lsn, f"xid {a.xid}"
        assert len(a.changes) == len(b.changes), f"xid {a.xid}"
        for x, y in zip(a.changes, b.changes, strict=True):
            assert x == y, f"xid {a.xid}: {x} != {y}"


def _record_cli(pg: PgDatabase, out: Path, until: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *CSND,
            "record",
            f"dn1={pg.url}",
            "--slot",
            "csnd",
            "--publication",
            "csnd_pub",
            "--text",
            "--until-lsn",
            until,
            "--out",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_record_matches_test_decoding_witness(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=2)
    end = pg.current_lsn()
    out = tmp_path / "dn1.pgstream"
    proc = _record_cli(pg, out, end)
    assert proc.returncode == 0, proc.stderr
    assert "recorded" in proc.stderr
    ours, ours_nontx = _ours(out)
    theirs, theirs_nontx = _witness(pg, end)
    assert len(theirs) > 20
    _compare(ours, theirs)
    assert ours_nontx == theirs_nontx == [("app", "nontx 0"), ("app", "nontx 1")]
    # the witness saw the features we claim to cover
    ops = {c[1] for t in theirs for c in t.changes}
    assert ops == {"insert", "update", "delete", "truncate", "message"}
    assert any(
        v == witness.UNCHANGED
        for t in ours
        for c in t.changes
        if c[1] == "update"
        for v in (c[4] or {}).values()
    )
    # the big transaction really was streamed
    kinds = {type(m).__name__ for _, m in RecordedSource(str(out)).events()}
    assert {"StreamStart", "StreamStop", "StreamCommit", "StreamAbort"} <= kinds
    # the slot was confirmed to the end of the last transaction (or an idle
    # keepalive after it), never past WAL the server has written
    confirmed = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'"
    )[0][0]
    last_end = ours[-1].end_lsn
    assert last_end is not None and lsn_from_str(str(confirmed)) >= last_end
    assert lsn_from_str(str(confirmed)) <= lsn_from_str(pg.current_lsn())


def test_second_recording_continues_exactly(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=1)
    mid = pg.current_lsn()
    workload.run(pg.dsn, rounds=1, seed=2)
    end = pg.current_lsn()
    first, second = tmp_path / "a.pgstream", tmp_path / "b.pgstream"
    assert _record_cli(pg, first, mid).returncode == 0
    proc = _record_cli(pg, second, end)
    assert proc.returncode == 0, proc.stderr
    a, _ = _ours(first)
    b, _ = _ours(second)
    theirs, _ = _witness(pg, end)
    assert a and b
    assert not {t.xid for t in a} & {t.xid for t in b}, "a transaction was recorded twice"
    _compare(a + b, theirs)


def test_binary_mode_frames_match_text_mode_structure(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd_text', 'pgoutput')")
    workload.run(pg.dsn, rounds=1)
    end = pg.current_lsn()
    out_b, out_t = tmp_path / "b.pgstream", tmp_path / "t.pgstream"
    src = LiveSource("dn1", LiveOptions(pg.url, "csnd", "csnd_pub", until_lsn=lsn_from_str(end)))
    record(src, str(out_b), progress=None)
    src = LiveSource(
        "dn1", LiveOptions(pg.url, "csnd_text", "csnd_pub", until_lsn=lsn_from_str(end), binary=False)
    )
    record(src, str(out_t), progress=None)
    assert RecordedSource(str(out_b)).binary is True and RecordedSource(str(out_t)).binary is False
    bt, _ = _ours(out_b)
    tt, _ = _ours(out_t)
    assert [(t.xid, t.end_lsn, [(c[0], c[1], c[2]) for c in t.changes]) for t in bt] == [
        (t.xid, t.end_lsn, [(c[0], c[1], c[2]) for c in t.changes]) for t in tt
    ]


def test_restart_in_the_middle_of_a_capture(pg: PgDatabase, tmp_path: Path) -> None:
    """The server restarts mid-capture: the reader reconnects, nothing lost or doubled."""
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=3)
    out = tmp_path / "r.pgstream"
    src = LiveSource("dn1", LiveOptions(pg.url, "csnd", "csnd_pub", binary=False))
    result: dict[str, Any] = {}

    def capture() -> None:
        try:
            result["summary"] = record(src, str(out), progress=None)
        except BaseException as e:  # (reported by the assertion below)
            result["error"] = e

    t = threading.Thread(target=capture)
    t.start()
    try:
        time.sleep(1.0)
        pg.server.restart("immediate")
        workload.run(pg.dsn, rounds=1, seed=4)
        end = pg.current_lsn()
        src.options.until_lsn = lsn_from_str(end)
        t.join(120)
    finally:
        src.close()
    assert not t.is_alive(), "capture did not end after the restart"
    assert "error" not in result, result.get("error")
    assert src.reconnects >= 1
    ours, _ = _ours(out)
    theirs, _ = _witness(pg, end)
    _compare(ours, theirs)


def test_missing_slot_is_a_clear_error(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    proc = _record_cli(pg, tmp_path / "x.pgstream", "0/1")
    assert proc.returncode == 1
    assert "node dn1" in proc.stderr and "csnd" in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_create_slot_option(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    proc = _record_cli(pg, tmp_path / "x.pgstream", pg.current_lsn(), "--create-slot")
    assert proc.returncode == 0, proc.stderr
    assert pg.execute("SELECT plugin FROM pg_replication_slots WHERE slot_name = 'csnd'") == [("pgoutput",)]


def test_lsn_text_form() -> None:
    assert lsn_to_str(lsn_from_str("0/16B3748")) == "0/16B3748"
    assert lsn_to_str(0x1_0000_0000) == "1/0"
    with pytest.raises(ValueError, match="invalid LSN"):
        lsn_from_str("16B3748")
    with psycopg.connect("") if False else _nullctx():
        pass


class _nullctx:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


@pytest.mark.parametrize("how", ["no such directory", "disk full"])
def test_a_recording_that_cannot_be_written_is_a_clear_error_and_confirms_nothing(
    pg: PgDatabase, tmp_path: Path, how: str
) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    before = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")
    workload.run(pg.dsn, rounds=1)
    out = tmp_path / "missing" / "x.pgstream" if how == "no such directory" else Path("/dev/full")
    proc = _record_cli(pg, out, pg.current_lsn())
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(out) in proc.stderr and "node dn1" in proc.stderr
    after = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")
    assert after == before  # nothing reached the file, so nothing is confirmed


def test_sigterm_stops_a_recording_cleanly_with_what_it_holds_confirmed(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """A service manager stopping `csnd record`: exit 143, one line, every transaction in the file synced and confirmed."""
    import signal

    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1)
    out = tmp_path / "dn1.pgstream"
    cmd = [*CSND, "record", f"dn1={pg.url}", "--slot", "csnd", "--publication", "csnd_pub", "--text"]
    proc = subprocess.Popen([*cmd, "--out", str(out)], stderr=subprocess.PIPE, text=True)
    end = pg.current_lsn()
    theirs, _ = _witness(pg, end)
    # An idle moment (the server's keepalive after the last data) is synced at once; it used to wait
    # for the next change or the server's next keepalive, up to wal_sender_timeout / 2 (~21 s here).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the last committed transaction is in the file
        time.sleep(0.2)
        try:
            if out.exists() and theirs[-1].xid in _committed_so_far(out):
                break
        except StreamFormatError:  # (caught between a frame's bytes: read again)
            continue
    caught_up = time.monotonic() < deadline
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "csnd record: terminated"
    assert "Traceback" not in stderr
    ours, _ = _ours(out)
    assert caught_up, "the last transaction was not in the file 10 s after it was committed"
    _compare(ours, theirs)
    confirmed = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'"
    )[0][0]
    assert lsn_from_str(str(confirmed)) >= ours[-1].end_lsn  # type: ignore[operator]
