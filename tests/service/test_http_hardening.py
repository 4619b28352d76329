"""The HTTP side against hostile clients, over real sockets to the real server.

A slowloris (connections that send part of a request and stall, or trickle
it a byte at a time) costs neither a thread each nor the answer to a probe;
a request whose Host is a name the service was not told of (DNS rebinding)
is refused; every answer forbids framing and inline scripts; /login stops
answering a guesser; and the session cookie expires, in the browser and on
the server.
"""

from __future__ import annotations

import select
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import ConfigError
from csnd.service.config import build_config
from csnd.service.http import SESSION_TTL_S, DashboardServer
from csnd.service.http_server import HttpLimits
from csnd.service.login_limit import LoginLimiter
from tests.service.servekit import wait_for


def _status() -> dict[str, Any]:
    return {"totals": {"transactions": "1"}, "nodes": [], "consumers": []}


class _Clock:
    """Wall time the test moves by hand (sessions and the login limiter read it)."""

    def __init__(self) -> None:
        self.now = 1_764_000_000.0

    def __call__(self) -> float:
        return self.now


Answer = tuple[int, dict[str, str], bytes]


def _parse(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/"), data[:200]
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _raw(port: int, request: bytes, source: str = "127.0.0.1") -> Answer:
    """`request` as bytes on a new connection (from `source`); the answer read to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return _parse(data)


def _get(port: int, path: str, host: str | None = None, headers: dict[str, str] | None = None) -> Answer:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host or f'127.0.0.1:{port}'}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return _raw(port, ("\r\n".join(lines) + "\r\n\r\n").encode())


def _login(port: int, token: str, source: str = "127.0.0.1", host: str | None = None) -> Answer:
    body = urllib.parse.urlencode({"token": token}).encode()
    head = (
        f"POST /login HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\nConnection: close\r\n"
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return _raw(port, head.encode() + body, source)


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[DashboardServer] = []

    def start(*args: Any, **kw: Any) -> DashboardServer:
        server = DashboardServer("127.0.0.1:0", *args, **kw)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


# --- 1. bounded threads, header and idle timeouts -----------------------------------------


def test_slow_clients_take_no_thread_each_and_a_probe_still_answers(serve: Any) -> None:
    before = threading.active_count()
    # (timeouts far beyond the test's run: the slow ones must all still be held when counted)
    server = serve(_status, limits=HttpLimits(workers=2, idle_timeout_s=600, header_timeout_s=600))
    slow = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(40)]
    try:
        for s in slow:
            s.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        # (connections are taken in order: every slow one is in before the probe is answered)
        assert _get(server.port, "/healthz")[::2] == (200, b"ok\n")
        assert _get(server.port, "/api/status")[0] == 200
        # the workers, the connection loop and the sampler; not a thread per connection
        assert threading.active_count() <= before + 2 + 2, threading.enumerate()
        assert server.statistics().waiting >= 40
    finally:
        for s in slow:
            s.close()


def test_a_request_trickled_byte_by_byte_is_cut_at_the_header_timeout(serve: Any) -> None:
    server = serve(_status, limits=HttpLimits(header_timeout_s=0.5, idle_timeout_s=60))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n")
        header = b"X-Slow: " + b"a" * 1000 + b"\r\n"
        answer = b""
        # one byte every 20 ms for up to 20 s: each would restart a per-read timeout
        for byte in header:
            if select.select([s], [], [], 0.02)[0]:
                answer = s.recv(65536)
                break
            s.send(bytes([byte]))
        assert answer, "a request trickled for 20 s was never cut"
        assert _parse(answer)[0] == 408
    assert server.statistics().timed_out >= 1


def test_a_connection_that_says_nothing_is_closed_at_the_idle_timeout(serve: Any) -> None:
    server = serve(_status, limits=HttpLimits(idle_timeout_s=0.3))
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        assert s.recv(100) == b""  # (closed, without an answer: there was no request)
    wait_for(lambda: server.statistics().timed_out == 1, "the idle connection counted")
    assert server.statistics().waiting == 0


def test_a_full_queue_answers_503_at_once_and_the_rest_are_served(serve: Any) -> None:
    release = threading.Event()

    def slow_status() -> dict[str, Any]:
        release.wait(60)
        return _status()

    server = serve(slow_status, limits=HttpLimits(workers=1, queued=1))
    with ThreadPoolExecutor(2) as pool:
        try:
            busy = pool.submit(_get, server.port, "/api/status")
            wait_for(lambda: server.statistics().busy == 1, "the worker held by a slow answer")
            queued = pool.submit(_get, server.port, "/api/status")
            wait_for(lambda: server.statistics().queued == 1, "the second request queued")
            code, headers, body = _get(server.port, "/healthz")
            assert code == 503 and headers["retry-after"] == "1", body
            assert b"busy" in body
            assert server.statistics().rejected == 1
        finally:
            release.set()
        assert busy.result()[0] == 200 and queued.result()[0] == 200


def test_past_max_connections_a_new_one_is_answered_503(serve: Any) -> None:
    server = serve(_status, limits=HttpLimits(max_connections=3, idle_timeout_s=600))
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(3)]
    try:
        wait_for(lambda: server.statistics().waiting == 3, "three connections held")
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            assert s.recv(100).startswith(b"HTTP/1.0 503")
        for s in held[:1]:
            s.close()
        wait_for(lambda: server.statistics().waiting == 2, "one let go")
        assert _get(server.port, "/healthz")[0] == 200
    finally:
        for s in held:
            s.close()


def test_a_client_that_does_not_read_its_answer_frees_the_worker_at_the_send_timeout(serve: Any) -> None:
    big = {"blob": "x" * (32 << 20)}  # (far more than the socket buffers between the two hold)
    server = serve(lambda: big, limits=HttpLimits(workers=1, send_timeout_s=0.5))
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"GET /api/status HTTP/1.0\r\n\r\n")  # and never read
        wait_for(lambda: server.statistics().busy == 1, "the worker writing")
        wait_for(lambda: server.statistics().busy == 0, "the worker let go", seconds=60)
        assert _get(server.port, "/healthz")[0] == 200


def test_limits_that_cannot_work_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="workers"):
        HttpLimits(workers=0)
    with pytest.raises(ConfigError, match="header_timeout_s"):
        HttpLimits(header_timeout_s=0)


# --- 2. the Host check (DNS rebinding) ----------------------------------------------------


def test_a_name_the_service_was_not_told_of_is_refused_but_probes_answer(serve: Any) -> None:
    server = serve(_status)
    port = server.port
    for path in ("/api/status", "/metrics", "/", "/dashboard.js"):
        code, _, body = _get(port, path, host=f"rebind.example:{port}")
        assert code == 403, (path, body)
        assert b"rebind.example" in body and b"--http-allowed-hosts" in body
    assert _login(port, "x", host=f"rebind.example:{port}")[0] == 403
    # a probe sends whatever Host it has (Kubernetes: the pod's address) and learns only up or ready
    assert _get(port, "/healthz", host="rebind.example")[0] == 200
    assert _get(port, "/readyz", host="rebind.example")[0] == 200
    # loopback names and any address literal (no DNS answer makes a browser send one)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "10.1.2.3:8080", "LOCALHOST"):
        assert _get(port, "/api/status", host=host)[0] == 200, host


def test_allowed_hosts_are_taken_and_a_star_takes_any(serve: Any) -> None:
    server = serve(_status, allowed_hosts=("dash.example.com",))
    port = server.port
    assert _get(port, "/api/status", host=f"dash.example.com:{port}")[0] == 200
    assert _get(port, "/api/status", host="DASH.example.com.")[0] == 200
    assert _get(port, "/api/status", host="other.example.com")[0] == 403
    server = serve(_status, allowed_hosts=("*",))
    assert _get(server.port, "/api/status", host="anything.example")[0] == 200


def test_the_allowed_hosts_setting_from_flags_variables_and_toml(tmp_path: Path) -> None:
    src = str(tmp_path / "dn1.pgstream")
    flags: dict[str, Any] = {"changelog": str(tmp_path / "log")}
    cfg = build_config({}, {**flags, "http_allowed_hosts": ("a.example",)}, [src], environ={})
    assert cfg.http_allowed_hosts == ("a.example",)
    cfg = build_config({}, flags, [src], environ={"CSND_HTTP_ALLOWED_HOSTS": "a.example, B.example"})
    assert cfg.http_allowed_hosts == ("a.example", "b.example")
    cfg = build_config({"http_allowed_hosts": ["c.example"]}, flags, [src], environ={})
    assert cfg.http_allowed_hosts == ("c.example",)
    assert build_config({}, flags, [src], environ={}).http_allowed_hosts == ()
    with pytest.raises(ConfigError, match="http_allowed_hosts: expected host names"):
        build_config({"http_allowed_hosts": [1]}, flags, [src], environ={})
    with pytest.raises(ConfigError, match="http_allowed_hosts: expected host names"):
        build_config({"http_allowed_hosts": ["a b"]}, flags, [src], environ={})


# --- 3. Content-Security-Policy and framing -----------------------------------------------


def _assert_guarded(answer: Answer, what: str) -> None:
    code, headers, _ = answer
    csp = headers.get("content-security-policy", "")
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, (what, code, headers)
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp, (what, csp)
    assert headers.get("x-frame-options") == "DENY", (what, code, headers)
    assert headers.get("x-content-type-options") == "nosniff", (what, code, headers)


def test_every_answer_forbids_framing_inline_scripts_and_sniffing(serve: Any) -> None:
    server = serve(_status, token="s3cret", limits=HttpLimits(header_timeout_s=0.3))
    port = server.port
    for path in ("/", "/dashboard.js", "/uplot/uPlot.min.css", "/healthz", "/readyz", "/api/status", "/x"):
        _assert_guarded(_get(port, path), path)
    _assert_guarded(_get(port, "/api/status", headers={"Authorization": "Bearer s3cret"}), "authorized")
    _assert_guarded(_get(port, "/", host="rebind.example"), "wrong host")
    _assert_guarded(_login(port, "wrong"), "refused login")
    _assert_guarded(_raw(port, b"BREW /pot HTCPCP/1.0\r\n\r\n"), "malformed request")
    _assert_guarded(_raw(port, b"GET /x HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n"), "headers too long")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET / HTTP/1.1\r\n")
        _assert_guarded(_parse(s.recv(65536)), "timed out")


def test_the_page_has_no_inline_script_or_style_the_policy_would_block() -> None:
    """The dashboard works under `script-src 'self'; style-src 'self'` (the browser tests run it)."""
    import re
    from importlib import resources

    page = resources.files("csnd.service").joinpath("dashboard", "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page), "an inline <script>"
    assert "<style" not in page and not re.search(r"\sstyle=", page), "an inline style"
    assert not re.search(r"\son[a-z]+=", page), "an inline event handler"
    assert "javascript:" not in page


# --- 4. /login is rate-limited per client address -----------------------------------------


def test_login_answers_429_after_five_refusals_a_minute_per_address(serve: Any) -> None:
    clock = _Clock()
    server = serve(_status, token="s3cret", clock=clock)
    port = server.port
    for _ in range(5):
        code, headers, _ = _login(port, "guess")
        assert code == 303 and headers["location"] == "./#refused"
    code, headers, body = _login(port, "guess")
    assert code == 429 and headers["retry-after"] == "60", body
    assert b"127.0.0.1" in body and b"60 s" in body
    # the right token too: a guesser learns nothing more while it waits
    assert _login(port, "s3cret")[0] == 429
    # another address is not held up by this one's guesses
    assert _login(port, "s3cret", source="127.0.0.2")[0] == 303
    clock.now += 30
    assert _login(port, "s3cret")[1]["retry-after"] == "30"
    clock.now += 30
    code, headers, _ = _login(port, "s3cret")
    assert code == 303 and "set-cookie" in headers


_WINDOW = 60.0
_MAX = 3


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["fail", "succeed", "ask"]),
            st.sampled_from(["a", "b", "c"]),
            st.floats(min_value=0, max_value=40, allow_nan=False),
        ),
        max_size=60,
    )
)
def test_the_login_limiter_against_every_failure_remembered(steps: list[tuple[str, str, float]]) -> None:
    """The bounded limiter answers as one that keeps every failure would (capacity not reached)."""
    limiter = LoginLimiter(max_failures=_MAX, window_s=_WINDOW, max_clients=10)
    failures: dict[str, list[float]] = {}
    now = 0.0

    def oracle(client: str) -> float | None:
        recent = [t for t in failures.get(client, []) if t > now - _WINDOW]
        if len(recent) < _MAX:
            return None
        return recent[len(recent) - _MAX] + _WINDOW - now

    for op, client, advance in steps:
        now += advance
        expected = oracle(client)
        assert limiter.retry_after(client, now) == expected, (op, client, now)
        if op == "fail" and expected is None:  # (a refused client's tries are not counted: not taken)
            limiter.failed(client, now)
            failures.setdefault(client, []).append(now)
        elif op == "succeed" and expected is None:
            limiter.succeeded(client)
            failures.pop(client, None)
        limiter.check()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=200), st.integers(1, 8))
def test_the_login_limiter_remembers_at_most_its_capacity(clients: list[int], capacity: int) -> None:
    limiter = LoginLimiter(max_failures=2, window_s=_WINDOW, max_clients=capacity)
    for i, client in enumerate(clients):
        limiter.failed(str(client), float(i))
        assert len(limiter) <= capacity
        limiter.check()
        # the newest failure is always remembered
        assert limiter.failures(str(client), float(i)) >= 1


# --- 5. the session cookie expires ---------------------------------------------------------


def test_the_session_cookie_expires_in_the_browser_and_on_the_server(serve: Any) -> None:
    clock = _Clock()
    server = serve(_status, token="s3cret", clock=clock)
    port = server.port
    code, headers, _ = _login(port, "s3cret")
    assert code == 303
    cookie = headers["set-cookie"]
    attributes = {a.strip() for a in cookie.split(";")[1:]}
    assert attributes == {"HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={SESSION_TTL_S}"}, cookie
    session = cookie.split(";")[0]
    assert _get(port, "/api/status", headers={"Cookie": session})[0] == 200
    clock.now += SESSION_TTL_S - 1
    assert _get(port, "/api/status", headers={"Cookie": session})[0] == 200
    clock.now += 2
    code, _, body = _get(port, "/api/status", headers={"Cookie": session})
    assert code == 401, body
    # an issue time moved on by hand does not pass: the time is under the HMAC
    name, value = session.split("=", 1)
    issued, mac = value.split(".", 1)
    forged = f"{name}={int(issued) + 10}.{mac}"
    assert _get(port, "/api/status", headers={"Cookie": forged})[0] == 401
    # nor does one issued in the future (a clock set back, or a forgery)
    clock.now -= 3 * SESSION_TTL_S
    assert _get(port, "/api/status", headers={"Cookie": session})[0] == 401
