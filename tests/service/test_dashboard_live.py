"""The dashboard in a real headless Chromium against a running `csnd serve` on a live node.

The page must load, its figures must change while transactions flow, its
plots must have a time axis, a value axis and a legend naming each series,
and a node whose server stops must turn red.  The screenshot it saves (tall
enough for the plots) is the one the README shows (docs/dashboard.png) when
CSND_SCREENSHOT names that path.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import psycopg

from tests.fixtures.browser import dump_dom, plots, screenshot
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import start_serve, wait_for


def _node_row(dom: str, node: str) -> tuple[str, list[str]]:
    m = re.search(rf'<tr class="(\w+)" data-node="{node}" data-state="(\w*)"[^>]*>(.*?)</tr>', dom, re.S)
    assert m, f"no row for node {node} in the dashboard"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", m.group(3))
    return m.group(1), cells


def _writes(pg: PgDatabase, stop: threading.Event) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        i = 0
        while not stop.is_set():
            c.execute("INSERT INTO item VALUES (%s, 'x')", (i,))
            i += 1
            stop.wait(0.01)


def test_dashboard_shows_flow_and_turns_a_stopped_node_red(pg: PgDatabase, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    served = start_serve([f"dn1={pg.url}?slot=csnd&publication=csnd_pub"], str(tmp_path / "log"))
    stop = threading.Event()
    writer = threading.Thread(target=_writes, args=(pg, stop), daemon=True)
    writer.start()
    try:
        assert served.http is not None
        wait_for(lambda: int(served.status()["totals"]["transactions"]) > 0, "transactions flowing")
        first = dump_dom(served.http)
        level, cells = _node_row(first, "dn1")
        assert level == "ok" and cells[2] == "streaming", cells
        before = int(cells[8].replace(",", ""))  # the node's transactions
        wait_for(lambda: int(served.status()["totals"]["transactions"]) > before + 20, "more transactions")
        second = dump_dom(served.http)
        _, cells = _node_row(second, "dn1")
        assert int(cells[8].replace(",", "")) > before, (
            "the page's figures did not change while transactions flowed"
        )
        charts = plots(second)
        assert len(charts) == 6, second[-3000:]
        for name, chart in charts.items():
            assert chart.axes >= 2 and chart.legend is not None, (name, chart)  # time and value axes
        # per-node plots name the node; the newest values are in the legend, in the axis' unit
        for name in ("chart-lag", "chart-lag-bytes", "chart-slot-wal"):
            assert "dn1" in (charts[name].legend or {}), (name, charts[name])
        assert re.fullmatch(r"[\d.]+ s", (charts["chart-lag"].legend or {})["dn1"]), charts["chart-lag"]
        assert re.fullmatch(r"[\d,.]+/s", (charts["chart-rate"].legend or {})["transactions"]), charts
        shot = os.environ.get("CSND_SCREENSHOT") or str(tmp_path / "dashboard.png")
        screenshot(served.http, shot, size="1440,1040")
        assert Path(shot).stat().st_size > 10_000

        stop.set()
        writer.join()
        pg.server.stop("immediate")
        try:
            wait_for(
                lambda: served.status()["nodes"][0]["state"] == "reconnecting",
                "the service noticing the node is down",
            )
            level, cells = _node_row(dump_dom(served.http), "dn1")
            assert level == "bad" and cells[2] == "reconnecting", cells
            assert "action needed" in dump_dom(served.http)
        finally:
            pg.server.start()
        wait_for(
            lambda: served.status()["nodes"][0]["state"] == "streaming", "the node flowing again", seconds=180
        )
    finally:
        stop.set()
        code, err = served.terminate()
    assert code == 0, err
