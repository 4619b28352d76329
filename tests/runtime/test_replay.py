"""`csnd replay` end to end, as a user runs it: a subprocess per run, real files, real servers.

Generated clusters are checked byte for byte against the generator's
expected.jsonl (an oracle written independently of the pipeline: it is what
the generator's GTM committed, in CSN order).  A live node is checked against
a `test_decoding` slot created beside ours.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from csnd.core.ids import lsn_from_str, lsn_to_str
from csnd.core.markers import PREFIX, parse_marker
from csnd.reader.pgoutput import LogicalMessage, XLogData, parse_frame, parse_message
from csnd.reader.streamfile import StreamFileReader, StreamHeader, StreamWriter
from csnd.testing import pgworkload as workload
from tests.fixtures import witness
from tests.fixtures.generated import shared_cluster
from tests.fixtures.pg import PgDatabase
from tests.fixtures.procs import children, wait_until_gone

CSND = [sys.executable, "-m", "csnd.cli"]


def replay(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, "replay", *args], capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The run failed the way docs/design.md section 8 says: exit 1, one clear line, no traceback."""
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("csnd ") and ": error: " in lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for name, nodes, binary, seed in (("1b", 1, True, 11), ("2t", 2, False, 12), ("3b", 3, True, 13)):
        made[name] = shared_cluster(tmp_path_factory, nodes, 600, seed=seed, binary=binary)
    return made


def streams(d: Path) -> list[str]:
    return sorted(str(p) for p in d.glob("dn*.pgstream"))


@pytest.mark.parametrize(
    ("cluster", "decoders"), [("1b", "1"), ("1b", "2"), ("2t", "2"), ("3b", "1"), ("3b", "2")]
)
def test_generated_cluster_replays_to_the_expected_output(
    clusters: dict[str, Path], tmp_path: Path, cluster: str, decoders: str
) -> None:
    d = clusters[cluster]
    out = tmp_path / "out.jsonl"
    proc = replay(*streams(d), "--decoders", decoders, "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == (d / "expected.jsonl").read_bytes()
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_a_transaction_line_longer_than_an_output_chunk_is_written_whole(tmp_path: Path) -> None:
    """A big transaction's line goes out part by part (the merger gathers short lines whole): nothing lost."""
    from csnd.reader import pgoutput as pg

    path = tmp_path / "big.pgstream"
    note = "x" * 600
    sizes = (3, 4000, 2)  # the middle line is ~2.5 MB, past the 1 MiB output chunk
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=False, mode="single")) as w:
        cols = [pg.Column(1, "id", 23, -1), pg.Column(0, "note", 25, -1)]
        w.write_frame(pg.encode_xlogdata(0, 0, 1, pg.encode_relation(16384, "public", "t", "d", cols)))
        lsn, row = 0x1000, 0
        for xid, n in enumerate(sizes, 700):
            commit = lsn + 0x10 * (n + 1)
            w.write_frame(pg.encode_xlogdata(lsn, lsn, 1, pg.encode_begin(commit, 5, xid)))
            for i in range(n):
                change = pg.encode_insert(16384, [str(row), f"{note}{row}"])  # text-mode values
                w.write_frame(pg.encode_xlogdata(lsn + 0x10 * (i + 1), lsn, 1, change))
                row += 1
            w.write_frame(pg.encode_xlogdata(commit, commit, 1, pg.encode_commit(commit, commit + 8, 5)))
            lsn = commit + 0x100
    out = tmp_path / "out.jsonl"
    proc = replay(str(path), "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = out.read_text(encoding="utf-8").splitlines()
    assert max(map(len, lines)) > 2 << 20
    txns = [json.loads(ln) for ln in lines]
    assert [len(t["changes"]) for t in txns] == list(sizes)
    news = [c["new"] for t in txns for c in t["changes"]]
    assert news == [{"id": r, "note": f"{note}{r}"} for r in range(sum(sizes))]


def test_stdout_is_the_default_output(clusters: dict[str, Path]) -> None:
    d = clusters["2t"]
    proc = replay(*streams(d))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (d / "expected.jsonl").read_text(encoding="utf-8")


def test_output_that_cannot_be_written_is_a_clear_error(clusters: dict[str, Path]) -> None:
    """A full disk (a reader that goes away is no error: tests/runtime/test_replay_output.py)."""
    d = clusters["2t"]
    cmd = [*CSND, "replay", *streams(d)]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(cmd, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    line = one_error_line(proc)
    assert line == "csnd replay: error: cannot write the output to standard output: No space left on device"


def test_an_output_path_that_cannot_be_created_is_a_clear_error_before_any_decoder_starts(
    clusters: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    proc = replay(*streams(clusters["2t"]), "--output", str(out))
    line = one_error_line(proc)
    assert line == f"csnd replay: error: cannot create the output {out}.partial: No such file or directory"


def test_an_output_that_is_a_directory_is_refused_before_anything_is_written(
    clusters: dict[str, Path], tmp_path: Path
) -> None:
    for out in (str(tmp_path), f"{tmp_path}/"):
        line = one_error_line(replay(*streams(clusters["2t"]), "--output", out))
        assert line == f"csnd replay: error: --output {out} is a directory; name the file to write"
    assert list(tmp_path.iterdir()) == [] and not Path(f"{tmp_path}.partial").exists()


def test_a_source_that_fails_as_its_pipeline_starts_leaves_no_partial_output(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pgstream"
    with StreamWriter(str(bad), StreamHeader(node="dn1", binary=True, mode="single", extra={"enums": "x"})):
        pass
    out = tmp_path / "out.jsonl"
    line = one_error_line(replay(str(bad), "--output", str(out)))
    assert 'header "enums"' in line
    assert list(tmp_path.iterdir()) == [bad]


def test_a_file_a_command_cannot_use_is_one_error_line(tmp_path: Path) -> None:
    """The net under the specific errors: `csnd generate` into a path under a regular file."""
    proc = subprocess.run(
        [*CSND, "generate", "--nodes", "1", "--transactions", "5", "--out", "/dev/null/x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert one_error_line(proc) == "csnd generate: error: cannot use /dev/null/x: Not a directory"


def test_the_order_of_sources_on_the_command_line_does_not_matter(clusters: dict[str, Path]) -> None:
    d = clusters["3b"]
    proc = replay(*reversed(streams(d)), "--decoders", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (d / "expected.jsonl").read_text(encoding="utf-8")


# --- bad input --------------------------------------------------------------------------------


def copy_frames(src: Path, dst: Path, keep: Any) -> None:
    """Rewrite a stream file keeping the frames for which keep(index, payload) is true."""
    with StreamFileReader(str(src)) as r:
        header = r.header
        with StreamWriter(str(dst), header) as w:
            for i, (_, payload) in enumerate(r):
                if keep(i, payload):
                    w.write_frame(payload)


def frame_messages(path: Path) -> Iterator[tuple[int, Any]]:
    with StreamFileReader(str(path)) as r:
        in_stream = False
        for i, (_, payload) in enumerate(r):
            frame = parse_frame(payload)
            if isinstance(frame, XLogData):
                msg = parse_message(frame.payload, in_stream)
                tag = type(msg).__name__
                in_stream = tag == "StreamStart" or (in_stream and tag != "StreamStop")
                yield i, msg


def test_truncated_file_names_the_file_and_offset(clusters: dict[str, Path], tmp_path: Path) -> None:
    src = streams(clusters["1b"])[0]
    bad = tmp_path / "dn1.pgstream"
    shutil.copy(src, bad)
    with open(bad, "r+b") as f:
        f.truncate(os.path.getsize(bad) - 7)
    out = tmp_path / "out.jsonl"
    line = one_error_line(replay(str(bad), "--output", str(out)))
    assert str(bad) in line and "offset" in line
    assert not out.exists(), "nothing half-written may be presented as complete"
    assert (tmp_path / "out.jsonl.partial").exists()
    assert "out.jsonl.partial" in line


def test_stream_that_ends_inside_a_transaction_says_so(clusters: dict[str, Path], tmp_path: Path) -> None:
    src = Path(streams(clusters["1b"])[0])
    msgs = list(frame_messages(src))
    begins = [i for i, m in msgs if type(m).__name__ == "Begin"]
    cut = begins[len(begins) // 2] + 2  # the Begin and one more message of that transaction
    bad = tmp_path / "cut.pgstream"
    copy_frames(src, bad, lambda i, _: i < cut)
    line = one_error_line(replay(str(bad)))
    assert re.search(r"node dn1: stream ended inside transaction \d+ \(begun at [0-9A-F]+/[0-9A-F]+", line)


def test_committed_transaction_without_its_commit_marker_is_a_protocol_error(
    clusters: dict[str, Path], tmp_path: Path
) -> None:
    """A GTM-mode node must log a commit marker in every committed transaction with changes."""
    src = Path(streams(clusters["1b"])[0])
    victim = None
    drop = set()
    for i, m in frame_messages(src):
        if isinstance(m, LogicalMessage) and m.prefix == PREFIX:
            marker = parse_marker(m.content)
            if marker.kind == "commit" and victim is None and marker.value and marker.value > 50:
                victim = marker.gid
            if victim is not None and marker.gid == victim and marker.kind == "commit":
                drop.add(i)
    assert victim is not None and drop
    bad = tmp_path / "nomarker.pgstream"
    copy_frames(src, bad, lambda i, _: i not in drop)
    line = one_error_line(replay(str(bad)))
    assert "node dn1" in line and "no commit marker" in line
    assert re.search(r"(xid|transaction) \d+", line) and re.search(r"[0-9A-F]+/[0-9A-F]+", line)


def test_unknown_message_type_names_file_and_lsn(clusters: dict[str, Path], tmp_path: Path) -> None:
    src = Path(streams(clusters["1b"])[0])
    target = next(i for i, m in frame_messages(src) if type(m).__name__ == "Change")
    bad = tmp_path / "unknown.pgstream"

    with StreamFileReader(str(src)) as r, StreamWriter(str(bad), r.header) as w:
        for i, (_, payload) in enumerate(r):
            if i == target:
                payload = payload[:25] + b"Z" + payload[26:]  # an unknown pgoutput tag
            w.write_frame(payload)
    line = one_error_line(replay(str(bad)))
    assert "Z" in line and str(bad) in line and re.search(r"[0-9A-F]+/[0-9A-F]+", line)


def test_several_single_mode_nodes_are_refused(tmp_path: Path) -> None:
    """Plain PostgreSQL nodes (CSN = own commit LSN) have no common order."""
    files = []
    for name in ("pg1", "pg2"):
        path = tmp_path / f"{name}.pgstream"
        with StreamWriter(str(path), StreamHeader(node=name, binary=False, mode="single")):
            pass
        files.append(str(path))
    line = one_error_line(replay(*files))
    assert "pg1" in line and "pg2" in line and "single" in line


def test_missing_source_file(tmp_path: Path) -> None:
    line = one_error_line(replay(str(tmp_path / "nope.pgstream")))
    assert "nope.pgstream" in line


# --- processes --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Large enough that a replay runs for several seconds on this machine."""
    return shared_cluster(tmp_path_factory, 1, 6000, seed=21, binary=True)


def big_replay(cluster: Path, out: Path, **popen: Any) -> subprocess.Popen[str]:
    """`csnd replay` of the big cluster with two decoders, started, not waited for."""
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    cmd = [*CSND, "replay", *streams(cluster), "--decoders", "2", "--output", str(out)]
    return subprocess.Popen(cmd, text=True, **popen)


def wait_for_output_to_start(out: Path, timeout: float = 60) -> Path:
    """Until a replay's FILE.partial has its first bytes (mid-run: output started, decoders busy); returns it."""
    partial = Path(f"{out}.partial")
    deadline = time.monotonic() + timeout
    while not partial.exists() or partial.stat().st_size == 0:
        assert time.monotonic() < deadline, f"no output in {partial} after {timeout} s"
        time.sleep(0.05)
    return partial


def decoder_workers(pid: int, want: int, timeout: float = 30) -> list[int]:
    """The decoder processes of csnd process `pid`: the children of its fork server."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        servers = [p for p, cmd in children(pid) if "multiprocessing.forkserver" in cmd]
        found = [w for server in servers for w, _ in children(server)]
        if len(found) >= want:
            return found
        time.sleep(0.02)
    raise AssertionError(f"decoder workers of {pid} did not appear")


def test_a_decoder_worker_killed_mid_run_fails_the_run_clearly(big_cluster: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    proc = big_replay(big_cluster, out)
    workers = decoder_workers(proc.pid, 2)
    wait_for_output_to_start(out)  # into the stream: results on their way back
    os.kill(workers[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    line = one_error_line(result)
    assert "worker" in line and f"pid {workers[1]}" in line and "SIGKILL" in line
    assert not out.exists()
    assert not [p for p, _ in children(proc.pid)]


def test_a_dead_decoder_fork_server_mid_run_is_a_clear_error_and_leaves_no_workers(
    big_cluster: Path, tmp_path: Path
) -> None:
    """With the server gone a worker's exit can no longer be seen: the run stops at its next liveness check.

    The workers are paused while the server dies, so the run provably has
    results outstanding (a run whose results all came back before any check
    would end normally, and rightly so); they go once resumed.
    """
    out = tmp_path / "out.jsonl"
    proc = big_replay(big_cluster, out)
    workers = decoder_workers(proc.pid, 2)
    (server,) = [p for p, cmd in children(proc.pid) if "multiprocessing.forkserver" in cmd]
    wait_for_output_to_start(out)
    for w in workers:
        os.kill(w, signal.SIGSTOP)
    try:
        os.kill(server, signal.SIGKILL)
        proc.wait(timeout=120)  # (not communicate: the paused workers hold stderr open)
    finally:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGCONT)
    _, stderr = proc.communicate(timeout=120)
    line = one_error_line(subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr))
    assert "fork server died" in line, line
    assert not out.exists()
    wait_until_gone(workers, 30, "decoder workers outlived their fork server")


def test_ctrl_c_stops_everything_cleanly(big_cluster: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    proc = big_replay(big_cluster, out, start_new_session=True)
    workers = decoder_workers(proc.pid, 2)
    wait_for_output_to_start(out)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole process group
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert not out.exists()
    wait_until_gone(workers, 10, "decoder workers outlived the run")


def test_sigterm_stops_like_ctrl_c_and_says_where_the_incomplete_output_is(
    big_cluster: Path, tmp_path: Path
) -> None:
    """What a service manager or `kill` sends, to the main process only: clean stop, exit 143, one line."""
    out = tmp_path / "out.jsonl"
    proc = big_replay(big_cluster, out)
    workers = decoder_workers(proc.pid, 2)
    partial = wait_for_output_to_start(out)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines() == [f"csnd replay: terminated; the incomplete output is in {partial}"]
    assert not out.exists() and partial.exists()
    wait_until_gone(workers, 10, "decoder workers outlived the run")


# --- a live node ------------------------------------------------------------------------------


def wait_for_slot(pg: PgDatabase, slot: str, active: bool, timeout: float = 120) -> None:
    """Until `slot` is (or is no longer) streamed to a walsender."""
    deadline = time.monotonic() + timeout
    while True:
        rows = pg.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        if rows and rows[0][0] is active:
            return
        assert time.monotonic() < deadline, (
            f"slot {slot} not {'active' if active else 'idle'} after {timeout} s"
        )
        time.sleep(0.05)


def _witness_rows(pg: PgDatabase, upto: str) -> list[witness.WTxn]:
    rows = pg.execute(
        "SELECT lsn::text, xid::text::bigint, data FROM pg_logical_slot_get_changes("
        f"'witness', '{upto}', NULL, 'include-xids', '1', 'skip-empty-xacts', '1')"
    )
    txns, _ = witness.text_txns(rows)
    return [t for t in txns if any(c[1] != "message" for c in t.changes)]


def _row_changes(line: str) -> tuple[int, list[tuple[str, str, str]]]:
    doc = json.loads(line)
    (node,) = doc["nodes"].values()
    return node["xid"], [(c["lsn"], c["op"], f"{c['schema']}.{c['table']}") for c in doc["changes"]]


def _live_replay(pg: PgDatabase, until: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return replay(
        f"dn1={pg.url}",
        "--slot",
        "csnd",
        "--publication",
        "csnd_pub",
        "--until-lsn",
        until,
        "--output",
        str(out),
        *extra,
    )


def test_live_replay_matches_the_witness_and_a_second_run_continues_exactly(
    pg: PgDatabase, tmp_path: Path
) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('witness', 'test_decoding')")
    outputs = []
    for run in range(2):
        workload.run(pg.dsn, rounds=1, seed=run)
        end = pg.current_lsn()
        out = tmp_path / f"run{run}.jsonl"
        proc = _live_replay(pg, end, out, "--text", "--decoders", "2")
        assert proc.returncode == 0, proc.stderr
        ours = [_row_changes(ln) for ln in out.read_text(encoding="utf-8").splitlines()]
        ours = [(xid, ch) for xid, ch in ours if ch]
        theirs = _witness_rows(pg, end)
        assert [x for x, _ in ours] == [t.xid for t in theirs], f"run {run}"
        for (xid, changes), t in zip(ours, theirs, strict=True):
            expected = []
            for c in t.changes:
                if c[1] == "message":
                    continue
                expected.append((lsn_to_str(c[0]), c[1], c[2]))
            assert [(lsn_from_str(a), b, c) for a, b, c in changes] == [
                (lsn_from_str(a), b, c) for a, b, c in expected
            ], f"xid {xid}"
        outputs.append(ours)
        # the slot moved to the end of what was written, and no further
        (row,) = pg.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name='csnd'"
        )
        confirmed = lsn_from_str(str(row[0]))
        assert theirs[-1].end_lsn is not None
        assert theirs[-1].end_lsn <= confirmed <= lsn_from_str(end)
    first, second = ({x for x, _ in o} for o in outputs)
    assert first and second and not first & second


def test_a_second_sigterm_during_the_cleanup_does_not_hang_the_exit(
    big_cluster: Path, tmp_path: Path
) -> None:
    """Two stops 10 ms apart (an impatient operator, a service manager and a script) used to hang it for good."""
    for attempt in range(3):
        out = tmp_path / f"out{attempt}.jsonl"
        proc = big_replay(big_cluster, out)
        workers = decoder_workers(proc.pid, 2)
        partial = wait_for_output_to_start(out)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"attempt {attempt}: still running 60 s after two SIGTERMs") from None
        assert proc.returncode == 143, stderr
        assert stderr.strip().splitlines() == [
            f"csnd replay: terminated; the incomplete output is in {partial}"
        ]
        wait_until_gone(workers, 10, "decoder workers outlived the run")


def test_a_live_replay_writes_a_transaction_soon_after_its_commit_and_then_idles(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """No --until-lsn: the line of the last transaction before a quiet spell must not wait for more WAL."""
    import select

    pg.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    cmd = [*CSND, "replay", f"dn1={pg.url}", "--slot", "csnd", "--publication", "csnd_pub", "--text"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        try:
            wait_for_slot(pg, "csnd", active=True)  # streaming, idle
            pg.execute("INSERT INTO t VALUES (1, 'one')")
            # Nothing else is committed: the line must come without more WAL behind it.
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, "no line 120 s after the commit"
            line = proc.stdout.readline()
            assert json.loads(line)["changes"][0]["new"] == {"id": 1, "v": "one"}
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 143, stderr
        assert stderr.strip().splitlines()[-1] == "csnd replay: terminated"


def test_decoder_workers_do_not_outlive_a_killed_replay(big_cluster: Path, tmp_path: Path) -> None:
    """SIGKILL runs no cleanup in the parent: the workers must notice and go by themselves, quietly."""
    proc = big_replay(big_cluster, tmp_path / "o.jsonl", stdout=subprocess.DEVNULL)
    workers = decoder_workers(proc.pid, 2)
    wait_for_output_to_start(tmp_path / "o.jsonl")  # into the stream: results on their way back
    proc.kill()
    # end of file on stderr once every process that shared it (workers, fork server) is gone
    _, stderr = proc.communicate(timeout=30)
    wait_until_gone(workers, 15, "decoder workers outlived their killed parent")
    assert "Traceback" not in stderr, stderr


def test_enums_decode_in_binary_mode_live_and_recorded(pg: PgDatabase, tmp_path: Path) -> None:
    """A Type message does not say "enum": the source's enums are looked up and passed on."""
    pg.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    pg.execute("CREATE TABLE feel (id int PRIMARY KEY, m mood, ms mood[])")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('rec', 'pgoutput')")
    pg.execute("INSERT INTO feel VALUES (1, 'happy', '{sad,ok}'), (2, NULL, '{}')")
    pg.execute("UPDATE feel SET m = 'ok' WHERE id = 2")
    end = pg.current_lsn()
    live_out = tmp_path / "live.jsonl"
    proc = _live_replay(pg, end, live_out)
    assert proc.returncode == 0, proc.stderr
    rows = [c["new"] for ln in live_out.read_text().splitlines() for c in json.loads(ln)["changes"]]
    assert rows == [
        {"id": 1, "m": "happy", "ms": ["sad", "ok"]},
        {"id": 2, "m": None, "ms": []},
        {"id": 2, "m": "ok", "ms": []},
    ]
    rec = tmp_path / "dn1.pgstream"
    proc = subprocess.run(
        [
            *CSND,
            "record",
            f"dn1={pg.url}",
            "--slot",
            "rec",
            "--publication",
            "csnd_pub",
            "--until-lsn",
            end,
            "--out",
            str(rec),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    file_out = replay(str(rec))
    assert file_out.returncode == 0, file_out.stderr
    assert file_out.stdout == live_out.read_text()


def test_a_streamed_transaction_outside_the_publication_is_not_a_protocol_error(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """A big transaction on a table outside the publication: the walsender streams it in blocks
    whose changes pgoutput then filters out, so every block is empty (Stream Start, Stream Stop)
    and the Stream Commit follows.  csnd used to drop the empty blocks and then fail on the commit
    of a transaction it had never seen start (the demo's Spark sink, writing into a source node)."""
    pg.execute("CREATE TABLE published (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE unpublished (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE published")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("INSERT INTO published VALUES (1, 'before')")
    # (logical_decoding_work_mem is 64kB on the test servers: this streams)
    pg.execute("INSERT INTO unpublished SELECT g, repeat('x', 200) FROM generate_series(1, 5000) g")
    pg.execute("INSERT INTO published VALUES (2, 'after')")
    (streamed,) = pg.execute(
        "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('csnd', NULL, NULL, 'proto_version', '2', "
        "'publication_names', 'csnd_pub', 'streaming', 'on') WHERE substr(data, 1, 1) = 'S'"
    )
    assert int(streamed[0]) > 0, "the big transaction was not streamed"  # type: ignore[call-overload]
    out = tmp_path / "out.jsonl"
    proc = _live_replay(pg, pg.current_lsn(), out, "--text")
    assert proc.returncode == 0, proc.stderr
    ids = [[c["new"]["id"] for c in json.loads(ln)["changes"]] for ln in out.read_text().splitlines()]
    assert [i for i in ids if i] == [[1], [2]]
