"""`csnd serve` as a subprocess for the service tests: start, wait until ready, read status, stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CSND = [sys.executable, "-m", "csnd.cli"]


def wait_for(
    cond: Callable[[], Any],
    what: str,
    seconds: float = 120.0,
    every: float = 0.1,
    diagnose: Callable[[], Any] | None = None,
) -> Any:
    """Wait until `cond()` is truthy (a state, not a duration: the ceiling is only a safety net).

    `diagnose()`, if given, is added to the failure message (e.g. the service's status)."""
    deadline = time.monotonic() + seconds
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"; {diagnose()}" if diagnose is not None else ""
            raise AssertionError(f"timed out after {seconds:.0f}s waiting for {what}{extra}")
        time.sleep(every)


@dataclass
class Served:
    proc: subprocess.Popen[str]
    address: str
    http: str | None
    lines: list[str] = field(default_factory=list)
    _exited_lock: threading.Lock = field(default_factory=threading.Lock)
    _exited_err: str | None = None

    def status(self) -> dict[str, Any]:
        assert self.http is not None
        try:
            with urllib.request.urlopen(self.http + "api/status", timeout=30) as r:
                doc: dict[str, Any] = json.load(r)
        except OSError:
            self.raise_if_exited(wait=10)
            raise
        return doc

    def raise_if_exited(self, wait: float = 0) -> None:
        """A service that is gone (or going: `wait`) fails the test with its exit status and stderr."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait)
        if self.proc.poll() is not None:
            with self._exited_lock:  # (status() is also called from watcher threads)
                if self._exited_err is None:
                    self._exited_err = self.proc.communicate(timeout=30)[1]
            raise AssertionError(f"csnd serve exited {self.proc.returncode}: {self._exited_err}")

    def newest_csn(self) -> int:
        return int(self.status()["changelog"].get("newest_csn", 0))

    def terminate(self, timeout: float = 60) -> tuple[int, str]:
        """SIGTERM; the exit status and what it wrote on stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, err

    def kill(self) -> None:
        """kill -9 the service and every process it started (its decoders too)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.communicate(timeout=60)


def start_serve(
    sources: Sequence[str],
    changelog: str,
    *extra: str,
    http: bool = True,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Served:
    """Start `csnd serve` on free ports and wait for its 'listening on' (and dashboard) lines.

    `env`: variables added to this process's environment (CSND_* settings)."""
    cmd = [*CSND, "serve", *sources, "--changelog", changelog, "--listen", "127.0.0.1:0", "--decoders", "1"]
    if http:
        cmd += ["--http", "127.0.0.1:0"]
    proc = subprocess.Popen(
        [*cmd, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        start_new_session=True,  # (its own process group: kill() reaches the decoders too)
    )
    assert proc.stdout is not None
    address = dashboard = None
    lines: list[str] = []
    while address is None or (http and dashboard is None):
        line = proc.stdout.readline()
        if not line:
            _out, err = proc.communicate(timeout=30)
            raise AssertionError(f"csnd serve exited {proc.returncode} before it was ready: {err}")
        lines.append(line)
        if line.startswith("csnd serve: listening on "):
            address = line.split()[-1]
        elif line.startswith("csnd serve: dashboard on "):
            dashboard = line.split()[-1]
    return Served(proc, address, dashboard, lines)


def subscribe(address: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CSND, "subscribe", address, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
