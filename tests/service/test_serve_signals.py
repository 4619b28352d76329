"""How `csnd serve` takes signals: SIGHUP as SIGTERM, and a stop sent to its whole process group.

A stop is a stop whoever receives it: the service alone (`kill`), or every
process it started as well (a terminal's Ctrl-C or hang-up, a service
manager's stop of the control group) -- the decoder pool's fork server and
workers among them, which must not turn the stop into a crash.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.fixtures.pg import PgDatabase
from tests.service.servekit import Served, start_serve, wait_for

SNAPSHOT_DONE = "initial snapshot complete"


def _setup(pg: PgDatabase, rows: int = 2000) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute(f"INSERT INTO item SELECT i, 'v' || i FROM generate_series(1, {rows}) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")


def _clean_stop(code: int, err: str) -> None:
    assert code == 0, f"exit {code}: {err}"
    assert "leaked" not in err and "Traceback" not in err and "error" not in err, err


def test_sighup_stops_serve_as_sigterm_does(pg: PgDatabase, tmp_path: Path) -> None:
    _setup(pg)
    # Started with SIGHUP's default, as from a shell: a suite run under nohup would hand its
    # SIG_IGN on, which csnd keeps, as nohup asks.  (The conftest puts this process's back.)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    served = start_serve(
        [f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true"], str(tmp_path / "log")
    )
    wait_for(lambda: served.status()["nodes"], "the node in status")
    served.proc.send_signal(signal.SIGHUP)
    _out, err = served.proc.communicate(timeout=120)
    _clean_stop(served.proc.returncode, err)


class _Stderr:
    """Reads a served process's stderr in a thread; `seen` is set once a line holds `needle`."""

    def __init__(self, served: Served, needle: str) -> None:
        self.lines: list[str] = []
        self.seen = threading.Event()
        self._needle = needle
        self._thread = threading.Thread(target=self._read, args=(served,), daemon=True)
        self._thread.start()

    def _read(self, served: Served) -> None:
        assert served.proc.stderr is not None
        for line in served.proc.stderr:
            self.lines.append(line)
            if self._needle in line:
                self.seen.set()

    def text(self) -> str:
        self._thread.join(timeout=60)
        return "".join(self.lines)


def test_sigterm_to_the_process_group_as_the_snapshot_completes_is_a_clean_stop(
    pg: PgDatabase, tmp_path: Path
) -> None:
    """The fork server and the decoders get the signal too; it used to end in `internal error: EOFError`."""
    _setup(pg)
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial"
    served = start_serve([source], str(tmp_path / "log"), "-v")
    stderr = _Stderr(served, SNAPSHOT_DONE)
    try:
        wait_for(stderr.seen.is_set, "the snapshot's completion line", diagnose=lambda: "".join(stderr.lines))
        os.killpg(served.proc.pid, signal.SIGTERM)  # (as a terminal or a service manager stops a group)
        code = served.proc.wait(timeout=120)
    finally:
        if served.proc.poll() is None:
            os.killpg(served.proc.pid, signal.SIGKILL)
            served.proc.wait(timeout=60)
    err = stderr.text()
    assert code == 0, f"exit {code}: {err}"
    assert "internal error" not in err and "Traceback" not in err and "leaked" not in err, err


# Starts the decoders' fork server as `csnd serve` does (main thread), SIGTERMs it at once, while
# it still imports its preload, then starts a worker from it and prints the worker's exit code.
_TERM_THE_STARTING_SERVER = """
import multiprocessing.forkserver as mp_forkserver
import os
import signal

from csnd.decoder.pool import start_worker_server

ctx = start_worker_server()
os.kill(mp_forkserver._forkserver._forkserver_pid, signal.SIGTERM)
worker = ctx.Process(target=os.getpid)
worker.start()
worker.join(60)
print("worker exit", worker.exitcode)
"""


def test_a_sigterm_while_the_fork_server_imports_its_preload_leaves_it_serving() -> None:
    """A group's SIGTERM can reach the server before `forkserver_init` ignores it: it must be held, not fatal.

    The server is started with SIGTERM blocked; multiprocessing starts its
    resource tracker first and unblocked SIGTERM on the way (its own mask
    dance), so a SIGTERM in the server's first second killed it and the
    next pool's start failed with `EOFError` in `read_signed`.
    """
    done = subprocess.run(
        [sys.executable, "-c", _TERM_THE_STARTING_SERVER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "worker exit 0", done.stdout + done.stderr
