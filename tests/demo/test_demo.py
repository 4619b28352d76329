"""`csnd demo`'s process keeping: a process that dies on its own ends the demo with its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from csnd.demo import _Delivered, _Procs, progress_counts


def test_a_process_that_failed_is_reported_with_its_last_log_line(tmp_path: Path) -> None:
    procs = _Procs(str(tmp_path))
    try:
        failed = procs.start(
            "serve", ["sh", "-c", "echo starting >&2; echo 'csnd serve: error: boom' >&2; exit 3"]
        )
        stopped = procs.start("ticker", ["sleep", "60"])
        failed.wait(30)
        procs.stop(stopped)  # stopped by the demo: not a failure
        with pytest.raises(RuntimeError) as e:
            procs.check()
        assert str(e.value) == f"serve exited 3: csnd serve: error: boom (log: {tmp_path / 'serve.log'})"
    finally:
        procs.stop_all()


def test_processes_that_run_or_ended_well_are_no_failure(tmp_path: Path) -> None:
    procs = _Procs(str(tmp_path))
    try:
        procs.start("workload", ["true"]).wait(30)
        procs.start("subscribe", ["sleep", "60"])
        procs.check()
    finally:
        procs.stop_all()


def test_the_progress_line_never_shows_more_delivered_than_committed(tmp_path: Path) -> None:
    """The workload's set-up transactions (no gid) were counted as delivered, against a second-old count."""
    sub = tmp_path / "subscribed.jsonl"
    committed = tmp_path / "committed.jsonl"
    log = tmp_path / "workload.log"
    setup = '{"csn": %d, "gid": null, "commit_time": "2026-01-01T00:00:00Z", "nodes": {}, "changes": []}\n'
    writer = '{"csn": %d, "gid": "g%d", "commit_time": "2026-01-01T00:00:00Z", "nodes": {}, "changes": []}\n'
    sub.write_text(setup % 1 + setup % 2 + setup % 3 + writer % (4, 4) + writer % (5, 5) + '{"csn": 6, "gi')
    log.write_text("workload:   1.0s committed 1 (1/s)\n")  # (a second old: the writers are at 2 by now)
    delivered = _Delivered(str(sub))
    assert progress_counts(delivered, str(committed), str(log)) == (2, 2)
    (tmp_path / "committed.jsonl.w0").write_text('{"gid": "g4"}\n{"gid": "g5"}\n{"gid": "g6"}\n')
    with sub.open("a") as f:
        f.write('d": "g6", "commit_time": "2026-01-01T00:00:00Z", "nodes": {}, "changes": []}\n')
    assert progress_counts(delivered, str(committed), str(log)) == (3, 3)


def test_the_progress_line_reads_the_workloads_summary_once_its_parts_are_merged(tmp_path: Path) -> None:
    """Between the merge of the writers' files and the workload's exit, only its summary line counts.

    The demo read the word after "committed" as the count: in the summary
    ("N distributed transactions committed in S s") that word is "in", and
    the demo ended with an internal error just as the load did.
    """
    sub, committed, log = (
        tmp_path / "subscribed.jsonl",
        tmp_path / "committed.jsonl",
        tmp_path / "workload.log",
    )
    sub.write_text("")
    log.write_text(
        "workload:  59.0s committed 2540 (90/s) rolled back 3 aborted 1 csn 2660 ticks 590\n"
        "csnd workload: 2549 distributed transactions committed in 60.0 s (42/s), 3 rolled back\n"
    )
    assert progress_counts(_Delivered(str(sub)), str(committed), str(log)) == (2549, 0)
