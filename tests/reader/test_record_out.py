"""csnd record --out: an existing recording is continued or replaced only when asked; devices are written as they are."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from csnd.core.ids import lsn_from_str
from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase
from tests.reader.test_live import _compare, _ours, _record_cli, _slots, _witness

CSND = [sys.executable, "-m", "csnd.cli"]


def _confirmed(pg: PgDatabase) -> str:
    return str(
        pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")[0][
            0
        ]
    )


def test_an_existing_recording_is_refused_without_append_or_replace(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=1)
    out = tmp_path / "a.pgstream"
    assert _record_cli(pg, out, pg.current_lsn()).returncode == 0
    before, confirmed = out.read_bytes(), _confirmed(pg)
    proc = _record_cli(pg, out, pg.current_lsn())
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"{out} exists: pass --append" in proc.stderr and "--replace" in proc.stderr
    assert out.read_bytes() == before and _confirmed(pg) == confirmed  # untouched, nothing sent again


def test_append_continues_exactly_and_cuts_a_torn_last_frame(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=1)
    out = tmp_path / "a.pgstream"
    assert _record_cli(pg, out, pg.current_lsn()).returncode == 0
    whole = out.stat().st_size
    with open(out, "ab") as f:  # a crash between a frame's length and its payload
        f.write(b"\x00\x00\x01\x00w\x00\x00")
    workload.run(pg.dsn, rounds=1, seed=2)
    end = pg.current_lsn()
    proc = _record_cli(pg, out, end, "--append")
    assert proc.returncode == 0, proc.stderr
    assert f"cut a torn last frame (7 bytes at byte offset {whole})" in proc.stderr
    ours, _ = _ours(out)
    theirs, _ = _witness(pg, end)
    _compare(ours, theirs)  # every transaction once, in order, across both runs


def test_append_refuses_a_file_behind_the_slot(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=1)
    out = tmp_path / "a.pgstream"
    assert _record_cli(pg, out, pg.current_lsn()).returncode == 0
    workload.run(pg.dsn, rounds=1, seed=2)
    ahead = pg.current_lsn()
    pg.execute(f"SELECT pg_replication_slot_advance('csnd', '{ahead}')")  # (another recording took these)
    before = out.read_bytes()
    proc = _record_cli(pg, out, pg.current_lsn(), "--append")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"cannot append to {out}: it holds the stream up to" in proc.stderr
    assert f"the slot resumes at {ahead}" in proc.stderr
    assert out.read_bytes() == before


def test_append_refuses_another_kind_of_recording(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    out = tmp_path / "a.pgstream"
    assert _record_cli(pg, out, pg.current_lsn()).returncode == 0  # (--text)
    proc = subprocess.run(
        [
            *CSND,
            "record",
            f"dn1={pg.url}",
            "--slot",
            "csnd",
            "--publication",
            "csnd_pub",
            "--until-lsn",
            pg.current_lsn(),
            "--out",
            str(out),
            "--append",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 1 and "its header says binary False" in proc.stderr


def test_replace_overwrites(pg: PgDatabase, tmp_path: Path) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    out = tmp_path / "a.pgstream"
    out.write_bytes(b"something else")
    workload.run(pg.dsn, rounds=1, seed=1)
    end = pg.current_lsn()
    proc = _record_cli(pg, out, end, "--replace")
    assert proc.returncode == 0, proc.stderr
    _compare(_ours(out)[0], _witness(pg, end)[0])


def test_record_to_a_device_or_fifo_writes_it_directly(pg: PgDatabase, tmp_path: Path) -> None:
    """/dev/null used to be fsynced (EINVAL); no name beside it is ever created, nothing replaces it."""
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=1)
    end = pg.current_lsn()
    proc = _record_cli(pg, Path("/dev/null"), end)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not [n for n in os.listdir("/dev") if n.startswith("null.")]
    assert lsn_from_str(_confirmed(pg)) > 0
    # a FIFO read by another process: the recording comes out whole at the other end
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    copy = tmp_path / "copy.pgstream"
    pg.execute("SELECT pg_drop_replication_slot('csnd')")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput', false)")
    workload.run(pg.dsn, rounds=1, seed=2)
    end = pg.current_lsn()
    with subprocess.Popen(["cat", str(fifo)], stdout=open(copy, "wb")) as cat:
        proc = _record_cli(pg, fifo, end)
        cat.wait(60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(os.listdir(tmp_path)) == ["copy.pgstream", "pipe"]
    assert _ours(copy)[0]
