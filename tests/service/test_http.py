"""The service's HTTP side: /metrics names and values, /api/status, tokens, and the dashboard in Chromium."""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from csnd.core.errors import ConfigError
from csnd.service.http import SESSION_TTL_S, DashboardServer, Thresholds
from csnd.service.metrics import METRICS
from csnd.service.server import TlsFiles
from tests.fixtures.browser import dump_dom, plots
from tests.fixtures.tls import self_signed, trusting


def _status(transactions: int = 10, dn2_state: str = "streaming") -> dict[str, Any]:
    return {
        "time_us": "1764000000000000",
        "totals": {"transactions": str(transactions), "changes": str(4 * transactions)},
        "nodes": [
            {
                "name": "dn1",
                "mode": "gtm",
                "state": "streaming",
                "received_lsn": "23456789",
                "confirmed_lsn": "23400000",
                "watermark_csn": "99",
                "lag_seconds": 0.5,
                "lag_bytes": "56789",
                "retained_wal_bytes": "123456",
            },
            {"name": "dn2", "mode": "gtm", "state": dn2_state, "received_lsn": "100", "confirmed_lsn": "50"},
        ],
        "changelog": {
            "oldest_csn": "1",
            "newest_csn": "99",
            "bytes": "40960",
            "segments": 2,
            "fsyncs": "120",
            "fsync_seconds_total": 0.75,
            "last_fsync_seconds": 0.125,
        },
        "snapshot": {
            "state": "running",
            "first_csn": "1",
            "last_csn": "3",
            "tables": [
                {
                    "node": "dn1",
                    "schema": "public",
                    "table": "acct",
                    "state": "copying",
                    "rows": "20000",
                    "rows_estimated": "50000",
                    "chunks_done": 2,
                    "chunks": 5,
                    "eta_seconds": 3.5,
                }
            ],
        },
        "incremental": {
            "state": "running",
            "job": "3f9c2a71d0be",
            "tables": [
                {"node": "dn2", "schema": "public", "table": "item", "state": "copying", "rows": "700"},
            ],
        },
        "consumers": [
            {
                "peer": "127.0.0.1:5555",
                "name": "lake",
                "acknowledged_csn": "90",
                "lag_transactions": "9",
                "connected": True,
            },
            {
                "peer": "",
                "name": "cache",
                "acknowledged_csn": "3",
                "lag_transactions": "96",
                "connected": False,
            },
        ],
    }


@pytest.fixture
def served() -> Any:
    holder = {"status": _status()}
    server = DashboardServer("127.0.0.1:0", lambda: holder["status"])
    server.start()
    yield server, holder
    server.stop()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_expose_every_documented_name_with_the_status_values(served: Any) -> None:
    server, _ = served
    code, text = _get(server.url + "metrics")
    assert code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    # (a histogram's samples are NAME_bucket, NAME_sum and NAME_count: METRICS lists NAME)
    histograms = {fam.name for fam in text_string_to_metric_families(text) if fam.type == "histogram"}
    names = {next((h for h in histograms if name.startswith(h + "_")), name) for name, _ in samples}
    assert names == set(METRICS)
    assert samples[("csnd_transactions_total", ())] == 10
    assert samples[("csnd_changes_total", ())] == 40
    assert samples[("csnd_node_received_lsn", (("node", "dn1"),))] == 23456789
    assert samples[("csnd_node_confirmed_lsn", (("node", "dn2"),))] == 50
    assert samples[("csnd_node_watermark_csn", (("node", "dn1"),))] == 99
    assert samples[("csnd_node_lag_seconds", (("node", "dn1"),))] == 0.5
    assert samples[("csnd_slot_retained_wal_bytes", (("node", "dn1"),))] == 123456
    assert samples[("csnd_changelog_bytes", ())] == 40960
    assert samples[("csnd_changelog_newest_csn", ())] == 99
    assert samples[("csnd_changelog_fsyncs_total", ())] == 120
    assert samples[("csnd_changelog_fsync_seconds_total", ())] == 0.75
    assert samples[("csnd_changelog_last_fsync_seconds", ())] == 0.125
    assert samples[("csnd_subscribers", ())] == 1  # the named subscription "cache" is not connected
    assert samples[("csnd_subscriber_lag_transactions", (("subscriber", "cache"),))] == 96
    acct = (("node", "dn1"), ("table", "public.acct"))
    assert samples[("csnd_snapshot_rows", acct)] == 20000
    assert samples[("csnd_snapshot_rows_estimated", acct)] == 50000
    assert samples[("csnd_snapshot_chunks_remaining", acct)] == 3
    assert samples[("csnd_snapshot_eta_seconds", acct)] == 3.5
    item = (("node", "dn2"), ("table", "public.item"))
    assert samples[("csnd_incremental_snapshot_rows", item)] == 700
    assert samples[("csnd_incremental_snapshot_eta_seconds", item)] == 0.0
    assert ("csnd_snapshot_rows", item) not in samples and (
        "csnd_incremental_snapshot_rows",
        acct,
    ) not in samples


def test_api_status_is_the_status_snapshot(served: Any) -> None:
    server, holder = served
    code, text = _get(server.url + "api/status")
    assert code == 200 and json.loads(text) == holder["status"]


def test_a_token_is_required_when_configured() -> None:
    server = DashboardServer("127.0.0.1:0", _status, token="s3cret")
    server.start()
    try:
        assert _get(server.url + "metrics")[0] == 401
        assert _get(server.url + "api/status", {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(server.url + "api/status", {"Authorization": "Bearer s3cret"})[0] == 200
        assert _get(server.url + "api/config", {"Authorization": "Bearer s3cret"})[0] == 200
        # the page and its scripts hold no figures: open, so the page can ask for the token
        for path in ("", "dashboard.js", "dashboard.css", "uplot/uPlot.iife.min.js", "uplot/uPlot.min.css"):
            assert _get(server.url + path)[0] == 200, path
    finally:
        server.stop()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kw: Any) -> None:
        return None


def _login(url: str, token: str, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str]]:
    """POSTs the dashboard's login form; the status and headers of the answer (not followed)."""
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url + "login", data=urllib.parse.urlencode({"token": token}).encode())
    try:
        with opener.open(request, timeout=30) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)


def test_the_token_never_rides_in_a_url_and_the_cookie_is_not_the_token() -> None:
    """A browser logs in with a form POST; the session cookie is an HMAC of the token, HttpOnly, Strict."""
    server = DashboardServer("127.0.0.1:0", _status, token="s3cret")
    server.start()
    try:
        # the old ways: the token in the query string, or itself in a cookie
        code, body = _get(server.url + "api/status?token=s3cret")
        assert code == 401 and "not taken" in body
        assert _get(server.url + "api/status", {"Cookie": "csnd_token=s3cret"})[0] == 401
        # the page holds no figures: open, and it sets no cookie
        with urllib.request.urlopen(server.url + "?token=s3cret", timeout=30) as r:
            assert r.status == 200 and r.headers.get("Set-Cookie") is None

        code, headers = _login(server.url, "wrong")
        assert code == 303 and headers["Location"] == "./#refused" and "Set-Cookie" not in headers
        code, headers = _login(server.url, "s3cret")
        assert code == 303 and headers["Location"] == "./"
        cookie = headers["Set-Cookie"]
        attributes = {a.strip() for a in cookie.split(";")[1:]}
        # (not Secure: plain HTTP; Max-Age: it expires, on the server too)
        assert attributes == {"HttpOnly", "SameSite=Strict", "Path=/", f"Max-Age={SESSION_TTL_S}"}, cookie
        session = cookie.split(";")[0]
        assert "s3cret" not in session
        assert _get(server.url + "api/status", {"Cookie": session})[0] == 200
        forged = session[:-1] + ("1" if session.endswith("0") else "0")  # (one hex digit of the MAC changed)
        assert _get(server.url + "api/status", {"Cookie": forged})[0] == 401
        # the session opens the dashboard, not the changefeed: it is not the token
        assert (
            _get(server.url + "api/status", {"Authorization": "Bearer " + session.split("=", 1)[1]})[0] == 401
        )
    finally:
        server.stop()


def _request(
    url: str, method: str, context: ssl.SSLContext | None = None
) -> tuple[int, dict[str, str], bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = (
        http.client.HTTPSConnection(parts.hostname or "", parts.port, context=context, timeout=30)
        if parts.scheme == "https"
        else http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    )
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""))
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_head_is_answered_as_get_without_a_body(served: Any) -> None:
    server, _ = served
    paths = ("", "dashboard.js", "uplot/uPlot.iife.min.js", "uplot/uPlot.min.css", "metrics", "api/status")
    for path in (*paths, "api/history", "healthz", "readyz", "nosuch"):
        got = _request(server.url + path, "GET")
        head = _request(server.url + path, "HEAD")
        assert head[0] == got[0], path
        assert head[1]["content-type"] == got[1]["content-type"], path
        assert head[1]["content-length"] == str(len(got[2])), path
        assert head[2] == b"", path


def test_healthz_and_readyz_are_open_and_readyz_says_why() -> None:
    state = {"ready": (False, "starting: preparing the slots")}
    server = DashboardServer("127.0.0.1:0", _status, token="s3cret", ready=lambda: state["ready"])
    server.start()
    try:
        assert _get(server.url + "healthz") == (200, "ok\n")
        assert _get(server.url + "readyz") == (503, "not ready: starting: preparing the slots\n")
        state["ready"] = (True, "ready")
        assert _get(server.url + "readyz") == (200, "ready\n")
        state["ready"] = (False, "node dn2 has been reconnecting for 45s (over 30s)")
        assert _get(server.url + "readyz")[0] == 503
        assert _request(server.url + "readyz", "HEAD")[:1] == (503,)
        assert _get(server.url + "api/status")[0] == 401  # (the figures still need the token)
    finally:
        server.stop()


def test_the_dashboard_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(str(tmp_path))
    server = DashboardServer("127.0.0.1:0", _status, token="s3cret", tls=TlsFiles(cert, key))
    server.start()
    ctx = trusting(cert)
    try:
        assert server.url.startswith("https://127.0.0.1:")
        # a client that connects and says nothing does not hold the others up (the handshake
        # runs in the connection's thread), nor does a plain HTTP one
        with socket.create_connection(("127.0.0.1", server.port)) as idle:
            assert _request(server.url + "healthz", "GET", ctx)[::2] == (200, b"ok\n")
            with pytest.raises((http.client.HTTPException, OSError)):
                _request(server.url.replace("https:", "http:") + "healthz", "GET")
            assert _request(server.url + "readyz", "HEAD", ctx)[0] == 200
            assert idle.fileno() >= 0
        code, headers = _login(server.url, "s3cret", ctx)
        assert code == 303
        cookie = headers["Set-Cookie"]
        assert "Secure" in {a.strip() for a in cookie.split(";")}, cookie
        request = urllib.request.Request(server.url + "api/status", headers={"Cookie": cookie.split(";")[0]})
        with urllib.request.urlopen(request, context=ctx, timeout=30) as r:
            assert json.load(r) == _status()
        with pytest.raises(urllib.error.URLError):  # (not trusted without the certificate)
            urllib.request.urlopen(server.url + "healthz", timeout=30)
    finally:
        server.stop()


def test_unreadable_tls_files_are_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the TLS certificate or key"):
        DashboardServer(
            "127.0.0.1:0", _status, tls=TlsFiles(str(tmp_path / "no.pem"), str(tmp_path / "no.key"))
        )


def test_the_page_asks_for_the_token_in_a_form(tmp_path: Path) -> None:
    server = DashboardServer("127.0.0.1:0", _status, token="s3cret")
    server.start()
    try:
        dom = dump_dom(server.url)
        form = re.search(r"<form id=\"login\"[^>]*>", dom)
        assert form is not None and "hidden" not in form.group(0), dom[:2000]
        assert 'name="token"' in dom and "token needed" in dom
        assert 'data-node="dn1"' not in dom  # (no figures without the token)
        dom = dump_dom(server.url + "#refused")
        assert re.search(r'<p id="login-refused" class="error">', dom), "a refused token is not said"
    finally:
        server.stop()


def test_a_port_in_use_is_one_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        server = DashboardServer(f"127.0.0.1:{port}", _status)
        with pytest.raises(ConfigError, match=f"--http 127.0.0.1:{port}: cannot listen"):
            server.start()


def test_bad_listen_addresses_and_thresholds_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        DashboardServer("localhost", _status)
    with pytest.raises(ConfigError, match="unknown dashboard threshold 'lag'"):
        Thresholds.from_mapping({"lag": 3})
    with pytest.raises(ConfigError, match="lag_seconds_amber <= lag_seconds_red"):
        Thresholds.from_mapping({"lag_seconds_amber": 100, "lag_seconds_red": 5})
    assert (
        Thresholds.from_mapping({"consumer_lag_amber": "50", "consumer_lag_red": 500}).consumer_lag_red == 500
    )


def test_history_keeps_a_bounded_ring_of_samples(served: Any) -> None:
    server, _ = served
    for i in range(server.history._samples.maxlen + 5):
        server.history.add(float(i), _status(transactions=i))
    samples = server.history.samples()
    assert len(samples) == server.history._samples.maxlen
    assert samples[-1]["transactions"] == server.history._samples.maxlen + 4
    # every figure the dashboard plots, per node and per consumer where it is
    assert samples[-1]["changelog_bytes"] == 40960
    assert samples[-1]["lag_seconds"] == {"dn1": 0.5, "dn2": 0.0}
    assert samples[-1]["lag_bytes"] == {"dn1": 56789, "dn2": 0}
    assert samples[-1]["retained_wal_bytes"] == {"dn1": 123456, "dn2": 0}
    assert samples[-1]["consumer_lag"] == {"lake": 9, "cache": 96}


def test_every_plot_has_a_time_axis_a_value_axis_and_a_legend(served: Any) -> None:
    server, _ = served
    dom = dump_dom(server.url)
    charts = plots(dom)
    assert set(charts) == {
        "chart-rate",
        "chart-lag",
        "chart-lag-bytes",
        "chart-slot-wal",
        "chart-consumers",
        "chart-changelog",
    }, dom[-3000:]
    for name, chart in charts.items():
        # time, and the figure in its unit (the rate plot: transactions/s and changes/s, an axis each)
        assert chart.axes == (3 if name == "chart-rate" else 2), (name, chart)
    # each legend names its series and shows the newest value, in its axis' unit
    legends = {name: dict(chart.legend or {}) for name, chart in charts.items()}
    for name, legend in legends.items():
        assert re.fullmatch(r"\d\d:\d\d:\d\d", legend.pop("time", "")), (name, legend)
    assert set(legends["chart-rate"]) == {"transactions", "changes"}
    assert legends["chart-lag"] == {"dn1": "0.5 s", "dn2": "0.0 s"}
    assert legends["chart-lag-bytes"] == {"dn1": "55.5 KiB", "dn2": "0 B"}
    assert legends["chart-slot-wal"] == {"dn1": "120.6 KiB", "dn2": "0 B"}
    assert legends["chart-consumers"] == {"lake": "9", "cache": "96"}
    assert legends["chart-changelog"] == {"changelog": "40 KiB"}


def _rows(dom: str, attr: str) -> dict[str, str]:
    return {name: cls for cls, name in re.findall(rf'<tr class="(\w+)" data-{attr}="([\w.:-]+)"', dom)}


def test_dashboard_colours_nodes_and_consumers_by_the_thresholds(served: Any) -> None:
    server, holder = served
    dom = dump_dom(server.url)
    assert _rows(dom, "node") == {"dn1": "ok", "dn2": "ok"}
    assert _rows(dom, "consumer") == {"lake": "ok", "cache": "ok"}
    assert "0/165EC15" in dom  # LSNs as PostgreSQL writes them
    assert 'data-table="public.acct"' in dom and "2 / 5" in dom  # the initial snapshot's progress

    holder["status"] = _status(dn2_state="failed")
    holder["status"]["consumers"][1]["lag_transactions"] = "200000"
    dom = dump_dom(server.url)
    assert _rows(dom, "node") == {"dn1": "ok", "dn2": "bad"}
    assert _rows(dom, "consumer")["cache"] == "bad"
    assert "action needed" in dom
