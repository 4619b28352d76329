"""`csnd subscribe` as a user runs it: a subprocess against a real service (docs/design.md section 8)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from csnd.changelog import Changelog
from csnd.service import RunningServer
from csnd.service.http import DashboardServer
from csnd.testing.pgserver import free_port
from tests.service.feedkit import fill, serve, wait_for

CSND = [sys.executable, "-m", "csnd.cli"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def subscribe(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CSND, "subscribe", *args], capture_output=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess[bytes]) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.decode().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr.decode(), proc.stderr
    assert lines[0].startswith("csnd subscribe: error: ")
    assert proc.stdout == b""
    return lines[0]


@pytest.fixture
def service(tmp_path: object) -> Iterator[tuple[RunningServer, Changelog, dict[int, bytes]]]:
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        written = fill(log, range(1, 51))
        srv = serve(log)
        try:
            yield srv, log, written
        finally:
            srv.stop()


def lines_of(written: dict[int, bytes], csns: range | list[int]) -> bytes:
    return b"".join(written[c] + b"\n" for c in csns)


def test_limit_and_from_csn(service: tuple[RunningServer, Changelog, dict[int, bytes]]) -> None:
    srv, _, written = service
    proc = subscribe(srv.address, "--limit", "10")
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout == lines_of(written, range(1, 11))
    proc = subscribe(f"grpc://{srv.address}", "--from-csn", "20", "--limit", "5")
    assert (proc.returncode, proc.stdout) == (0, lines_of(written, range(21, 26)))


def test_idle_timeout_tables_name_and_token(tmp_path: object) -> None:
    token = os.path.join(str(tmp_path), "token")
    with open(token, "w") as f:
        f.write("tok-123\n")
    with Changelog(os.path.join(str(tmp_path), "log")) as log:
        written = fill(log, range(1, 31))
        srv = serve(log, token="tok-123")
        try:
            args = [srv.address, "--token-file", token, "--idle-timeout", "1"]
            proc = subscribe(*args)
            assert (proc.returncode, proc.stderr) == (0, b"")
            assert proc.stdout == lines_of(written, range(1, 31))
            proc = subscribe(*args, "--table", "odd.a.b")
            assert "is not SCHEMA.TABLE" in one_error_line(proc)
            proc = subscribe(*args, "--table", 'odd."a.b"', "--table", "sales.*")
            assert proc.returncode == 0 and proc.stdout
            for raw in proc.stdout.splitlines():
                assert b'"table": "a.b"' in raw or b'"schema": "sales"' in raw
                assert b'"schema": "public"' not in raw
            # a named subscription continues after what it printed (and acknowledged)
            proc = subscribe(*args, "--name", "cli", "--limit", "12")
            assert proc.stdout == lines_of(written, range(1, 13))
            proc = subscribe(*args, "--name", "cli")
            assert proc.stdout == lines_of(written, range(13, 31))
            wrong = os.path.join(str(tmp_path), "wrong")
            with open(wrong, "w") as f:
                f.write("tok-124")
            assert "token was not accepted" in one_error_line(
                subscribe(srv.address, "--idle-timeout", "1", "--token-file", wrong)
            )
            assert "needs a token" in one_error_line(subscribe(srv.address, "--idle-timeout", "1"))
        finally:
            srv.stop()


def test_unreachable_target_is_one_line() -> None:
    port = free_port()  # a port nothing listens on
    line = one_error_line(subscribe(f"127.0.0.1:{port}", "--limit", "1"))
    assert f"127.0.0.1:{port} does not answer" in line
    assert "not HOST:PORT" in one_error_line(subscribe("nowhere", "--limit", "1"))


@pytest.mark.parametrize("scheme", ["http", "https", "postgresql"])
def test_a_url_scheme_csnd_does_not_take_says_so(scheme: str) -> None:
    """`csnd subscribe http://HOST:PORT` said "nothing accepts connections there"."""
    target = f"{scheme}://127.0.0.1:{free_port()}"
    line = one_error_line(subscribe(target, "--limit", "1"))
    assert line.startswith(
        f"csnd subscribe: error: target {target!r}: csnd does not take {scheme}:// here; "
        "give HOST:PORT or grpc://HOST:PORT"
    ), line
    assert ("--tls-ca" in line) is (scheme == "https") and "nothing accepts connections" not in line


def test_the_dashboard_port_is_named_as_such() -> None:
    """A subscriber pointed at serve's --http port: it answers HTTP, which is not the changefeed."""
    dashboard = DashboardServer("127.0.0.1:0", lambda: {})
    dashboard.start()
    try:
        line = one_error_line(subscribe(f"127.0.0.1:{dashboard.port}", "--idle-timeout", "1"))
    finally:
        dashboard.stop()
    assert line == (
        f"csnd subscribe: error: 127.0.0.1:{dashboard.port} answers HTTP, not csnd's changefeed "
        "(is this the dashboard port? the changefeed is on the --listen port)"
    )


def test_idle_timeout_does_not_hide_a_target_never_reached() -> None:
    """Nothing listening: not an idle subscriber that exits 0 in silence, but one error line, exit 1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed again: nothing accepts connections there)
    line = one_error_line(subscribe(f"127.0.0.1:{port}", "--idle-timeout", "1"))
    assert f"127.0.0.1:{port}" in line and "nothing accepts connections there" in line


def test_closed_stdout_and_ctrl_c(service: tuple[RunningServer, Changelog, dict[int, bytes]]) -> None:
    srv, log, written = service
    with _subscriber(srv.address) as p:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.readline() == written[1] + b"\n"
        p.stdout.close()  # (`| head -1`)
        # The pipe may have taken every line already: the next write finds it closed.
        written.update(fill(log, [51]))
        assert _exit_status(p) == 0
        assert p.stderr.read() == b""
    with _subscriber(srv.address) as p:
        assert p.stdout is not None and p.stderr is not None
        got = b"".join(p.stdout.readline() for _ in range(51))
        assert got == lines_of(written, range(1, 52))
        p.send_signal(signal.SIGINT)
        assert _exit_status(p) == 130
        assert p.stderr.read().decode() == "csnd subscribe: interrupted\n"


@contextlib.contextmanager
def _subscriber(address: str) -> Iterator[subprocess.Popen[bytes]]:
    """`csnd subscribe ADDRESS` with its pipes; killed if the test leaves it running (never a hang)."""
    p = subprocess.Popen([*CSND, "subscribe", address], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
        for pipe in (p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()


def _exit_status(p: subprocess.Popen[bytes], timeout: float = 60) -> int:
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        err = p.stderr.read().decode(errors="replace") if p.stderr is not None else ""
        raise AssertionError(f"csnd subscribe still running after {timeout:.0f}s; stderr: {err!r}") from None


def test_service_killed_and_restarted_mid_stream(tmp_path: object) -> None:
    """kill -9 of the service, twice, while csnd subscribe reads: its output has no gap, no duplicate."""
    d = os.path.join(str(tmp_path), "log")
    total = 3000
    out_path = os.path.join(str(tmp_path), "out.jsonl")
    env = {**os.environ, "PYTHONPATH": ROOT}

    def start(port: int) -> tuple[subprocess.Popen[str], int]:
        p = subprocess.Popen(
            [sys.executable, "-m", "tests.service.feedserver", d, str(port), str(total)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
        )  # fmt: skip
        assert p.stdout is not None
        first = p.stdout.readline()
        assert first.startswith("listening on "), first
        return p, int(first.split()[-1])

    server, port = start(0)
    err_path = os.path.join(str(tmp_path), "err.txt")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        sub = subprocess.Popen(
            [*CSND, "subscribe", f"127.0.0.1:{port}", "--limit", str(total)], stdout=out, stderr=err
        )
    try:
        for k in (1, 2):
            # kill only once the subscriber is provably under way past this point
            def grown(k: int = k) -> bool:
                return os.path.getsize(out_path) > k * 300_000

            wait_for(grown, "the subscriber's output to grow")
            server.kill()
            server.wait()
            server, _ = start(port)
        assert sub.wait(timeout=300) == 0
    finally:
        server.kill()
        server.wait()
        if sub.poll() is None:
            sub.kill()
    with Changelog(d) as log:
        expect = b"".join(raw + b"\n" for _, raw in log.read(0, total))
        assert log.durable_csn >= total
    with open(out_path, "rb") as f:
        got = f.read()
    assert got.count(b"\n") == total
    assert got == expect
    # each outage is told when it begins and when it ends, with a timestamp and the csn it goes on after
    with open(err_path, encoding="utf-8") as errors:
        lines = errors.read().splitlines()
    ts = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z csnd: changefeed 127\.0\.0\.1:\d+: "
    lost = [ln for ln in lines if re.fullmatch(ts + r".*; reconnecting after csn \d+", ln)]
    back = [
        ln for ln in lines if re.fullmatch(ts + r"reconnected after [\d.]+ s, continuing after csn \d+", ln)
    ]
    assert len(lost) >= 2 and len(back) >= 2, lines
