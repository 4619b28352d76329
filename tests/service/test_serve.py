"""`csnd serve` end to end over generated GaussDB-style clusters: the subscriber sees exactly the truth.

The generator writes each node's stream and, independently, the expected
global output (expected.jsonl); every test compares what a `csnd subscribe`
prints with it, after restarts, kill -9 and a torn changelog.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.fixtures.procs import children
from tests.service.servekit import CSND, start_serve, subscribe, wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cluster")
    subprocess.run(
        [*CSND, "generate", "--nodes", "3", "--transactions", "400", "--seed", "7", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    return out


def _sources(cluster: Path) -> list[str]:
    return [str(cluster / f"dn{i}.pgstream") for i in (1, 2, 3)]


def _expected(cluster: Path) -> list[str]:
    return (cluster / "expected.jsonl").read_text().splitlines()


def test_served_cluster_subscribed_from_zero_and_from_the_middle(cluster: Path, tmp_path: Path) -> None:
    expected = _expected(cluster)
    served = start_serve(_sources(cluster), str(tmp_path / "log"))
    try:
        last = json.loads(expected[-1])["csn"]
        wait_for(lambda: served.newest_csn() == last, "the whole cluster in the changelog")
        everything = subscribe(served.address, "--idle-timeout", "2")
        assert everything.returncode == 0, everything.stderr
        assert everything.stdout.splitlines() == expected

        middle = json.loads(expected[len(expected) // 2])["csn"]
        tail = subscribe(served.address, "--from-csn", str(middle), "--limit", "5")
        assert tail.returncode == 0, tail.stderr
        assert tail.stdout.splitlines() == expected[len(expected) // 2 + 1 : len(expected) // 2 + 6]

        doc = served.status()
        assert [n["name"] for n in doc["nodes"]] == ["dn1", "dn2", "dn3"]
        assert all(n["state"] == "ended" for n in doc["nodes"])
        assert int(doc["totals"]["transactions"]) == len(expected)
        # Ended sources leave a service that serves and otherwise sleeps (it used to spin a core).
        before = _cpu_seconds(served.proc.pid)
        time.sleep(2.0)
        assert _cpu_seconds(served.proc.pid) - before < 0.5
    finally:
        code, err = served.terminate()
    assert code == 0 and err == "", err


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_restart_resumes_without_appending_anything_twice(cluster: Path, tmp_path: Path) -> None:
    expected = _expected(cluster)
    log = str(tmp_path / "log")
    first = start_serve(_sources(cluster), log)
    last = json.loads(expected[-1])["csn"]
    try:
        wait_for(lambda: first.newest_csn() == last, "the whole cluster in the changelog")
    finally:
        assert first.terminate()[0] == 0
    second = start_serve(_sources(cluster), log)
    try:
        wait_for(lambda: all(n["state"] == "ended" for n in second.status()["nodes"]), "the sources re-read")
        assert int(second.status()["totals"]["transactions"]) == 0  # every re-read transaction was held
        out = subscribe(second.address, "--idle-timeout", "2")
        assert out.stdout.splitlines() == expected
    finally:
        assert second.terminate()[0] == 0


def test_kill_9_mid_stream_then_restart_loses_and_doubles_nothing(cluster: Path, tmp_path: Path) -> None:
    expected = _expected(cluster)
    log = str(tmp_path / "log")
    served = start_serve(_sources(cluster), log)
    # Provably mid-stream: some transactions are durable, not all.
    last = json.loads(expected[-1])["csn"]
    newest = wait_for(lambda: served.newest_csn() or None, "a first durable transaction", every=0.01)
    served.kill()
    assert newest is not None
    again = start_serve(_sources(cluster), log)
    try:
        wait_for(lambda: again.newest_csn() == last, "the whole cluster after the restart")
        out = subscribe(again.address, "--idle-timeout", "2")
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == expected
    finally:
        assert again.terminate()[0] == 0


def test_a_torn_changelog_tail_is_cut_and_re_derived(cluster: Path, tmp_path: Path) -> None:
    expected = _expected(cluster)
    log = tmp_path / "log"
    last = json.loads(expected[-1])["csn"]
    served = start_serve(_sources(cluster), str(log))
    try:
        wait_for(lambda: served.newest_csn() == last, "the whole cluster in the changelog")
    finally:
        assert served.terminate()[0] == 0
    (segment,) = sorted(log.glob("*.log"))
    size = segment.stat().st_size
    os.truncate(segment, size - 1000)  # a write torn in the middle of the last records
    again = start_serve(_sources(cluster), str(log))
    try:
        wait_for(lambda: again.newest_csn() == last, "the cut tail re-derived from the sources")
        assert int(again.status()["totals"]["transactions"]) >= 1
        out = subscribe(again.address, "--idle-timeout", "2")
        assert out.stdout.splitlines() == expected
    finally:
        assert again.terminate()[0] == 0


def test_damage_before_the_tail_is_one_error_naming_file_and_offset(cluster: Path, tmp_path: Path) -> None:
    log = tmp_path / "log"
    expected = _expected(cluster)
    served = start_serve(_sources(cluster), str(log))
    try:
        wait_for(lambda: served.newest_csn() == json.loads(expected[-1])["csn"], "the whole cluster")
    finally:
        assert served.terminate()[0] == 0
    (segment,) = sorted(log.glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    proc = subprocess.run(
        [*CSND, "serve", *_sources(cluster), "--changelog", str(log), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    (line,) = proc.stderr.splitlines()
    assert line.startswith("csnd serve: error: ") and segment.name in line and "offset" in line, line
    check = subprocess.run(
        [*CSND, "changelog", str(log), "--check"], capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 1 and segment.name in check.stderr


def test_changelog_command_prints_a_range_and_checks(cluster: Path, tmp_path: Path) -> None:
    expected = _expected(cluster)
    log = tmp_path / "log"
    served = start_serve(_sources(cluster), str(log), http=True)
    try:
        wait_for(lambda: served.newest_csn() == json.loads(expected[-1])["csn"], "the whole cluster")
        busy = subprocess.run([*CSND, "changelog", str(log)], capture_output=True, text=True, timeout=60)
        assert busy.returncode == 1 and "csnd changelog: error:" in busy.stderr  # held by the service
    finally:
        assert served.terminate()[0] == 0
    lo, hi = json.loads(expected[10])["csn"], json.loads(expected[20])["csn"]
    out = subprocess.run(
        [*CSND, "changelog", str(log), "--from-csn", str(lo), "--until-csn", str(hi)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected[11:21]
    check = subprocess.run(
        [*CSND, "changelog", str(log), "--check"], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0 and f"{len(expected)} transactions" in check.stderr


def test_bad_configuration_is_one_line(cluster: Path, tmp_path: Path) -> None:
    dn1 = str(cluster / "dn1.pgstream")
    cases = [
        (
            ["serve", dn1, dn1, "--changelog", str(tmp_path / "l")],
            "node name 'dn1' is used by several sources",
        ),
        (["serve", "--changelog", str(tmp_path / "l")], "no sources"),
        (["serve", str(tmp_path / "missing.pgstream"), "--changelog", str(tmp_path / "l")], "no such file"),
        (["serve", "x.pgstream"], "--changelog DIR is required"),
    ]
    for args, message in cases:
        proc = subprocess.run([*CSND, *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_a_killed_decoder_restarts_the_pipeline_and_nothing_is_lost(tmp_path: Path) -> None:
    """A decoder process dies mid-stream: the service restarts the pipeline from the changelog."""
    out = tmp_path / "cluster"
    subprocess.run(
        [*CSND, "generate", "--nodes", "2", "--transactions", "3000", "--seed", "11", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    expected = (out / "expected.jsonl").read_text().splitlines()
    served = start_serve([str(out / "dn1.pgstream"), str(out / "dn2.pgstream")], str(tmp_path / "log"))
    try:
        wait_for(lambda: served.newest_csn() or None, "a first durable transaction", every=0.01)

        def a_decoder() -> int | None:
            servers = [p for p, cmd in children(served.proc.pid) if "multiprocessing.forkserver" in cmd]
            workers = [p for s in servers for p, _ in children(s)]
            return workers[0] if workers else None

        os.kill(wait_for(a_decoder, "a decoder process"), signal.SIGKILL)
        wait_for(lambda: int(served.status()["totals"]["restarts"]) >= 1, "the pipeline restarted")
        last = json.loads(expected[-1])["csn"]
        wait_for(lambda: served.newest_csn() == last, "the whole cluster after the restart")
        got = subscribe(served.address, "--idle-timeout", "2")
        assert got.stdout.splitlines() == expected
        assert any(int(n["restarts"]) >= 1 for n in served.status()["nodes"])
    finally:
        code, err = served.terminate()
    assert code == 0, err
