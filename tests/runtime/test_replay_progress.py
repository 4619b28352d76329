"""Progress lines of `csnd replay`: with -v (or a terminal) only, true to what was written and read."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

from csnd.reader.recorded import RecordedSource
from csnd.runtime.replay_progress import ReplayProgress
from csnd.runtime.stats import NodeStats
from csnd.testing.widestream import write_wide_stream


class FakeInput:
    """A node input as progress lines see it: its statistics object."""

    def __init__(self, stats: NodeStats) -> None:
        self.node = stats.node
        self.now = stats

    def stats(self) -> NodeStats:
        return self.now


def test_a_line_once_per_interval_with_what_was_written_and_where_each_node_is() -> None:
    clock = [100.0]
    out = io.StringIO()
    local = FakeInput(NodeStats("dn1"))
    agent = FakeInput(NodeStats("dn2", released=1234, agent="10.0.0.2:7000"))
    p = ReplayProgress(out, [local, agent], clock=lambda: clock[0], interval=2.0)
    p.tick(101.0, 10, 1_000_000)
    assert out.getvalue() == ""  # not yet due
    local.now = NodeStats("dn1", read_fraction=0.25, decoded_changes=12_345, inboxes=((4, 4), (0, 4)))
    p.tick(102.0, 500, 12_345_678)
    assert out.getvalue() == (
        "csnd replay: 500 transactions (12.3 MB) written, 250 a second; "
        "dn1: read 25%, 12,345 changes decoded, decoder inboxes 4/4 0/4; "
        "dn2: agent 10.0.0.2:7000, 1,234 transactions received\n"
    )
    p.tick(103.0, 600, 13_000_000)  # the next one is due at 104
    assert out.getvalue().count("\n") == 1
    clock[0] = 110.0
    p.done(4_000, 80_000_000)
    assert out.getvalue().splitlines()[-1] == "csnd replay: done: 4,000 transactions (80.0 MB) in 10.0 s"


def test_a_source_that_cannot_say_how_much_was_read_says_only_what_was_decoded() -> None:
    stats = NodeStats("dn1", decoded_changes=7, inboxes=((0, 2),))
    assert stats.progress_text() == "7 changes decoded, decoder inboxes 0/2"


def test_a_recording_says_how_much_of_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "s.pgstream"
    write_wide_stream(str(path), 3000, rows_per_txn=10)
    src = RecordedSource(str(path))

    def fraction() -> float:
        f = src.read_fraction()
        assert f is not None  # (a file: its size is known)
        return f

    assert fraction() < 0.01  # the header only
    seen = []
    for i, _ in enumerate(src.events(raw_changes=True)):
        if i % 50 == 0:
            seen.append(fraction())
    assert seen == sorted(seen) and src.read_fraction() == 1.0


def test_replay_verbose_reports_progress_and_the_output_is_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "s.pgstream"
    write_wide_stream(str(path), 2000, rows_per_txn=10)
    cmd = [sys.executable, "-m", "csnd.cli"]
    quiet = subprocess.run([*cmd, "replay", str(path)], capture_output=True, text=True, timeout=120)
    loud = subprocess.run([*cmd, "-v", "replay", str(path)], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == loud.returncode == 0, loud.stderr
    assert quiet.stderr == ""  # scripts read stderr for the one error line
    assert loud.stdout == quiet.stdout
    done = loud.stderr.splitlines()[-1]
    size = len(quiet.stdout.encode())
    assert re.fullmatch(
        rf"csnd replay: done: 200 transactions \({size / 1e6:,.1f} MB\) in \d+\.\d s", done
    ), done


class BrokenStream:
    def __init__(self) -> None:
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        pass


def test_a_stderr_that_went_away_silences_progress_and_fails_nothing() -> None:
    stream = BrokenStream()
    p = ReplayProgress(stream, [FakeInput(NodeStats("dn2"))], clock=lambda: 0.0, interval=1.0)  # type: ignore[arg-type]
    p.tick(1.0, 1, 1)
    p.tick(2.0, 2, 2)
    p.done(3, 3)
    assert stream.writes == 1  # tried once, then quiet


def test_a_recording_read_from_a_pipe_replays_and_has_no_fraction(tmp_path: Path) -> None:
    """`zcat dn1.pgstream.gz | csnd replay /dev/stdin`: a pipe cannot say where it is nor how long it is."""
    import os
    import threading

    path = tmp_path / "s.pgstream"
    write_wide_stream(str(path), 300, rows_per_txn=10)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(path.read_bytes()))
    writer.start()
    src = RecordedSource(str(fifo))
    assert src.read_fraction() is None
    from_pipe = [(lsn, type(m).__name__) for lsn, m in src.events(raw_changes=True)]
    writer.join()
    from_file = [(lsn, type(m).__name__) for lsn, m in RecordedSource(str(path)).events(raw_changes=True)]
    assert from_pipe == from_file and src.read_fraction() is None


def test_replay_reads_a_recording_from_standard_input(tmp_path: Path) -> None:
    path = tmp_path / "s.pgstream"
    write_wide_stream(str(path), 500, rows_per_txn=10)
    cmd = [sys.executable, "-m", "csnd.cli", "replay"]
    from_file = subprocess.run([*cmd, str(path)], capture_output=True, timeout=120)
    # (input= makes standard input a pipe, as `zcat ... |` would)
    from_stdin = subprocess.run(
        [*cmd, "/dev/stdin"], input=path.read_bytes(), capture_output=True, timeout=120
    )
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == from_file.stdout and len(from_file.stdout.splitlines()) == 50


PROBE_STOP_AT_COMMIT = """
import os, signal, sys
from csnd.cli import main
from csnd.runtime.jsonsink import JsonLinesSink
real_commit = JsonLinesSink.commit

def commit_with_a_stop(self):
    os.kill(os.getpid(), signal.SIGTERM)  # a stop request lands in the closing fsync/rename
    real_commit(self)

JsonLinesSink.commit = commit_with_a_stop
sys.exit(main(["replay", sys.argv[1], "--output", sys.argv[2]]))
"""


def test_a_stop_after_every_line_is_written_keeps_the_finished_output(tmp_path: Path) -> None:
    path = tmp_path / "s.pgstream"
    write_wide_stream(str(path), 500, rows_per_txn=10)
    out = tmp_path / "out.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_STOP_AT_COMMIT, str(path), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and len(out.read_text().splitlines()) == 50
    assert not Path(f"{out}.partial").exists()
