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


def _text(dom: str, id_: str) -> str:
    m = re.search(rf'<div [^>]*id="{id_}"[^>]*>(.*?)</div>', dom)
    assert m, f"no element {id_} in the dashboard"
    return m.group(1)


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
        second = dump_dom(served.http, size="1440,1040")  # (the three-column layout of the plots)
        _, cells = _node_row(second, "dn1")
        assert int(cells[8].replace(",", "")) > before, (
            "the page's figures did not change while transactions flowed"
        )
        charts = plots(second)
        assert len(charts) == 6, second[-3000:]
        for name, chart in charts.items():
            assert chart.axes >= 2 and chart.legend is not None, (name, chart)  # time and value axes
        # transactions/s and changes/s on an axis each: a bulk insert does not flatten the steady line
        assert charts["chart-rate"].axes == 3, charts["chart-rate"]
        # the time labels keep apart in the narrow plots (they ran together: room below 0)
        rooms = dict(re.findall(r'<div class="chart" id="([\w-]+)"[^>]* data-time-room="(-?\d+)"', second))
        assert len(rooms) == 6 and all(int(r) >= 8 for r in rooms.values()), rooms
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
            down = dump_dom(served.http)
            level, cells = _node_row(down, "dn1")
            assert level == "bad" and cells[2] == "reconnecting", cells
            assert "action needed" in down
            # the cards do not show the last figures read as today's (lag 0.0 s, 0 B held)
            assert _text(down, "worst-lag") == "unknown" and _text(down, "wal-held") == "unknown", down[:3000]
            assert _text(down, "worst-lag-node") == "node dn1 reconnecting", down[:3000]
        finally:
            pg.server.start()
        wait_for(
            lambda: served.status()["nodes"][0]["state"] == "streaming", "the node flowing again", seconds=180
        )
    finally:
        stop.set()
        code, err = served.terminate()
    assert code == 0, err


def test_the_badge_says_initial_snapshot_while_one_is_taken(pg: PgDatabase, tmp_path: Path) -> None:
    """During an initial snapshot the node table is empty: the badge said "all flowing"."""
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
    pg.execute("CREATE TABLE loose (n int)")
    pg.execute("INSERT INTO acct SELECT i, 'v' FROM generate_series(1, 20000) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    config = tmp_path / "csnd.toml"
    config.write_text("[snapshot]\nchunk_rows = 100\nreaders = 1\n")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial"
    blocker = psycopg.connect(pg.dsn)
    try:
        served = start_serve([source], str(tmp_path / "log"), "--config", str(config))
        # loose is copied after acct's 200 chunks; it waits for this lock. (Not before start: the lock
        # takes an xid, and the slot's consistent point would wait for it.)
        blocker.execute("LOCK TABLE loose IN ACCESS EXCLUSIVE MODE")
        try:
            assert served.http is not None
            wait_for(
                lambda: any(
                    t["table"] == "acct" and t["state"] == "done"
                    for t in served.status().get("snapshot", {}).get("tables", [])
                ),
                "acct copied while loose waits for its lock",
            )
            assert served.status()["snapshot"]["state"] == "running"
            # the snapshot's connections say whose they are (a planner and one reader, waiting)
            names = pg.execute(
                "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            assert sorted(str(n[0]) for n in names).count("csnd serve dn1") == 2, names
            dom = dump_dom(served.http)
            badge = re.search(r'<span id="overall" class="badge (\w+)">(.*?)</span>', dom)
            assert badge and badge.groups() == ("busy", "initial snapshot"), dom[:2000]
        finally:
            blocker.rollback()
        wait_for(lambda: served.status()["snapshot"]["state"] == "complete", "the snapshot complete")
        wait_for(lambda: served.status()["nodes"], "the node streaming")
        badge = re.search(r'<span id="overall" class="badge (\w+)">(.*?)</span>', dump_dom(served.http))
        assert badge and badge.groups() == ("ok", "all flowing")
    finally:
        blocker.close()
        code, err = served.terminate()
    assert code == 0, err
