"""`csnd demo`'s process keeping: a process that dies on its own ends the demo with its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from csnd.demo import _Procs


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
