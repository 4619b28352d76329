"""Where `csnd replay` writes, and what it refuses to write over (no lost data, no destroyed files).

The output must never destroy data: not an input, not a device, and -- for a
live source, whose slot is confirmed as far as the output holds -- not an
earlier run's output.  A reader that goes away (`| head -3`) stops the run
quietly and confirms nothing more.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from csnd.core.ids import Csn, Lsn, Xid, lsn_from_str
from csnd.runtime.items import EndItem, TxnItem
from csnd.runtime.jsonsink import JsonLinesSink
from csnd.runtime.merger import Merger, write_alone
from csnd.runtime.sinks import OutputClosed
from csnd.sender.txn import FinishedTxn
from csnd.testing import pgworkload as workload
from tests.fixtures import witness
from tests.fixtures.generated import shared_cluster
from tests.fixtures.pg import PgDatabase
from tests.fixtures.procs import children, wait_until_gone
from tests.runtime.queued import QueuedInput

CSND = [sys.executable, "-m", "csnd.cli"]


def replay(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, "replay", *args], capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_cluster(tmp_path_factory, 1, 3000, seed=41, binary=True)


# --- an output that is one of the inputs ------------------------------------------------------


@pytest.mark.parametrize("how", ["same path", "hard link"])
def test_an_output_that_is_one_of_the_inputs_is_refused_before_anything_starts(
    cluster: Path, tmp_path: Path, how: str
) -> None:
    src = tmp_path / "A.pgstream"
    shutil.copy(cluster / "dn1.pgstream", src)
    before = src.read_bytes()
    out = src if how == "same path" else tmp_path / "B.jsonl"
    if how == "hard link":
        os.link(src, out)
    line = one_error_line(replay(str(src), "--output", str(out)))
    assert line == (
        f"csnd replay: error: --output {out}: {out} is the source {src}; writing there would destroy it, "
        "so name another output file"
    )
    assert src.read_bytes() == before
    assert not Path(f"{out}.partial").exists()


# --- outputs that are not regular files -------------------------------------------------------


def test_dev_null_is_written_directly_never_beside_or_over(cluster: Path) -> None:
    proc = replay(str(cluster / "dn1.pgstream"), "--output", "/dev/null")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not os.path.lexists("/dev/null.partial")


def test_a_fifo_is_written_directly_and_stays_a_fifo(cluster: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    proc = replay(str(cluster / "dn1.pgstream"), "--output", str(fifo))
    reader.join(timeout=300)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert got == [(cluster / "expected.jsonl").read_bytes()]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


# --- a reader that goes away ------------------------------------------------------------------


def test_a_reader_that_takes_three_lines_and_leaves_ends_the_run_quietly(cluster: Path) -> None:
    """`csnd replay ... | head -3`: exit 0, nothing on stderr, the decoders gone."""
    cmd = [*CSND, "replay", str(cluster / "dn1.pgstream"), "--decoders", "2"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as p:
        assert p.stdout is not None and p.stderr is not None
        servers: list[int] = []
        while not servers:  # (the decoders' fork server, to see its workers go)
            servers = [s for s, c in children(p.pid) if "multiprocessing.forkserver" in c]
            time.sleep(0.01)
        lines = [p.stdout.readline() for _ in range(3)]
        workers = [w for s in servers for w, _ in children(s)]
        p.stdout.close()  # what head does after its third line
        stderr = p.stderr.read()
        status = p.wait(timeout=300)
    assert (status, stderr) == (0, b"")
    assert b"".join(lines) == b"".join((cluster / "expected.jsonl").read_bytes().splitlines(True)[:3])
    wait_until_gone(workers, 30, "decoder workers outlived the run")


def test_head_in_a_shell_pipeline_sees_exit_status_0(cluster: Path) -> None:
    script = f"set -o pipefail; {' '.join(CSND)} replay {cluster / 'dn1.pgstream'} | head -3"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert len(proc.stdout.splitlines()) == 3


def test_a_closed_output_confirms_nothing_past_what_was_written(tmp_path: Path) -> None:
    txns = [
        FinishedTxn(
            "dn1",
            Csn(0x1000 * k),
            None,
            Xid(700 + k),
            Lsn(0x1000 * k),
            Lsn(0x1000 * k + 8),
            5,
            [(0, 1, '"x": 1')],
            1,
        )
        for k in range(1, 20_001)
    ]
    # The lines' lengths, from the same rendering into a file.
    reference = JsonLinesSink(str(tmp_path / "ref.jsonl"))
    from csnd.coordinator import AloneOrder

    order = AloneOrder("dn1")
    for t in txns:
        write_alone(reference, t, order)
    reference.commit()
    ends = []
    total = 0
    for line in (tmp_path / "ref.jsonl").read_bytes().splitlines(True):
        total += len(line)
        ends.append(total)
    r, w = os.pipe()
    taken = []

    def head() -> None:  # reads a little, then goes away
        taken.append(os.read(r, 100_000))
        time.sleep(0.2)
        os.close(r)

    reader = threading.Thread(target=head)
    reader.start()
    slot = QueuedInput("dn1", "single", [*(TxnItem(t, t.end_lsn) for t in txns), EndItem()])
    sink = JsonLinesSink(None, fd=w)
    try:
        with pytest.raises(OutputClosed):
            Merger([slot], sink, confirm_interval_s=0.0).run()
    finally:
        reader.join()
        os.close(w)
    whole = sum(1 for end in ends if end <= sink.bytes_out)  # lines the pipe took in full
    assert whole < len(txns), "the reader should have left before the end"
    assert slot.final is None
    assert slot.confirmed and all(lsn <= txns[whole - 1].end_lsn for lsn in slot.confirmed)


# --- a live replay's earlier output -----------------------------------------------------------


def _witness(pg: PgDatabase, upto: str) -> list[witness.WTxn]:
    rows = pg.execute(
        "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_peek_changes("
        f"'witness', '{upto}', NULL, 'include-xids', '1', 'skip-empty-xacts', '1')"
    )
    txns, _ = witness.text_txns(rows)
    return [t for t in txns if any(c[1] != "message" for c in t.changes)]


def _xids(path: Path) -> list[int]:
    """The xids of the whole lines of an output (an interrupted one may end inside a line)."""
    out = []
    for line in path.read_bytes().splitlines(True):
        if line.endswith(b"\n"):
            out.append(json.loads(line)["nodes"]["dn1"]["xid"])
    return out


def _confirmed(pg: PgDatabase) -> int:
    (row,) = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='csnd'")
    return lsn_from_str(str(row[0]))


def test_an_interrupted_live_replay_keeps_its_partial_and_the_next_run_loses_nothing(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """Ctrl-C mid-run leaves FILE.partial; the next run refuses to truncate it; moved away, nothing is lost."""
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding')")
    workload.run(pg.dsn, rounds=3, seed=1)
    out = tmp_path / "out.jsonl"
    partial = Path(f"{out}.partial")
    live = [f"dn1={pg.url}", "--slot", "csnd", "--publication", "csnd_pub", "--text", "--output", str(out)]
    created = _confirmed(pg)
    proc = subprocess.Popen(
        [*CSND, "replay", *live, "--decoders", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while _confirmed(pg) == created or not partial.exists() or partial.stat().st_size == 0:
        assert proc.poll() is None and time.monotonic() < deadline, "no output confirmed"
        time.sleep(0.05)  # output flows, and the slot has been confirmed at least once
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines() == [f"csnd replay: interrupted; the incomplete output is in {partial}"]
    kept = partial.read_bytes()
    confirmed = _confirmed(pg)
    end = pg.current_lsn()
    theirs = _witness(pg, end)
    first = _xids(partial)
    # Everything the slot will not send again is in the partial output.
    assert {t.xid for t in theirs if t.end_lsn is not None and t.end_lsn <= confirmed} <= set(first)

    again = replay(*live, "--until-lsn", end)
    line = one_error_line(again)
    assert line.startswith(f"csnd replay: error: {partial} exists: ") and "move it away" in line
    assert partial.read_bytes() == kept and not out.exists()

    moved = tmp_path / "first.jsonl.partial"
    partial.rename(moved)
    again = replay(*live, "--until-lsn", end)
    assert again.returncode == 0, again.stderr
    second = _xids(out)
    assert set(first) | set(second) == {t.xid for t in theirs}  # nothing lost (the seam may repeat)
    assert len(second) == len(set(second))

    line = one_error_line(replay(*live, "--until-lsn", end))  # a complete earlier output is kept too
    assert line == (
        f"csnd replay: error: --output {out} exists: a live replay would replace it, and the transactions "
        "it holds are not sent again; move it away or name another file"
    )
