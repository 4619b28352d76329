"""The service's HTTP side: /metrics names and values, /api/status, tokens, and the dashboard in Chromium."""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from csnd.core.errors import ConfigError
from csnd.service.http import DashboardServer, Thresholds
from csnd.service.metrics import METRICS
from tests.fixtures.browser import dump_dom


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
    names = {name for name, _ in samples}
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


def test_api_status_is_the_status_snapshot(served: Any) -> None:
    server, holder = served
    import json

    code, text = _get(server.url + "api/status")
    assert code == 200 and json.loads(text) == holder["status"]


def test_a_token_is_required_when_configured() -> None:
    server = DashboardServer("127.0.0.1:0", _status, token="s3cret")
    server.start()
    try:
        assert _get(server.url + "metrics")[0] == 401
        assert _get(server.url + "api/status", {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(server.url + "api/status", {"Authorization": "Bearer s3cret"})[0] == 200
        assert _get(server.url + "?token=s3cret")[0] == 200
        assert _get(server.url + "api/config", {"Cookie": "csnd_token=s3cret"})[0] == 200
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
    for i in range(server.history._samples.maxlen + 5):  # type: ignore[operator]
        server.history.add(float(i), _status(transactions=i))
    samples = server.history.samples()
    assert len(samples) == server.history._samples.maxlen
    assert samples[-1]["transactions"] == server.history._samples.maxlen + 4


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
