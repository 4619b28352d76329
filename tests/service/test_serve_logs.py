"""What `csnd serve` tells an operator: timestamped (or JSON) log lines, its connections' names,
where each node resumes, and that it stopped."""

from __future__ import annotations

import json
import os
import re
import subprocess
from functools import partial
from pathlib import Path

import psycopg

from csnd.core.ids import lsn_from_str
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import CSND, Served, start_serve, wait_for

TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _walsender_name(pg: PgDatabase, slot: str) -> str | None:
    """application_name of the walsender that streams `slot` of this database (None: not streaming)."""
    rows = pg.execute(
        "SELECT r.application_name FROM pg_replication_slots AS s JOIN pg_stat_replication AS r "
        "ON r.pid = s.active_pid WHERE s.slot_name = %s AND s.database = current_database()",
        (slot,),
    )
    return str(rows[0][0]) if rows else None


def test_names_its_connections_says_where_it_resumes_and_that_it_stopped(
    pg: PgDatabase, tmp_path: Path
) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub"
    log_dir = str(tmp_path / "log")

    served = start_serve([source], log_dir, "-v")
    name = wait_for(lambda: _walsender_name(pg, "csnd"), "the service's walsender")
    assert name == "csnd serve dn1", name  # (pg_recvlogical and Debezium name themselves too)
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        for i in range(5):
            c.execute("INSERT INTO item VALUES (%s, 'x')", (i,))
    wait_for(lambda: served.newest_csn() > 0, "the inserts in the changelog")
    newest = served.newest_csn()
    status, err = served.terminate()
    assert status == 0, err
    lines = err.splitlines()
    assert all(re.match(TIME + " csnd: ", ln) for ln in lines if not ln.startswith(" ")), lines
    stopped = [
        ln
        for ln in lines
        if re.fullmatch(TIME + r" csnd: stopped: the changelog is durable through csn \d+", ln)
    ]
    assert len(stopped) == 1 and int(stopped[0].split()[-1]) >= newest, lines
    durable = int(stopped[0].split()[-1])
    confirmed = pg.execute(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'"
    )
    at = str(confirmed[0][0])

    # A start on a changelog that holds transactions says where the node picks up; a name in the URL wins.
    served = start_serve([source + "&application_name=ops"], log_dir, "-v", http=False)
    assert wait_for(lambda: _walsender_name(pg, "csnd"), "the service's walsender") == "ops"
    status, err = served.terminate()
    assert status == 0, err
    resumes = [
        ln
        for ln in err.splitlines()
        if re.fullmatch(TIME + rf" csnd: node dn1 resumes after csn {durable} from slot csnd at lsn {at}", ln)
    ]
    assert len(resumes) == 1, err
    assert lsn_from_str(at) > 0


def _has_all(served: Served) -> bool:
    return served.newest_csn() >= 20


def test_json_log_lines_for_log_shippers(tmp_path: Path) -> None:
    gen = subprocess.run(
        [*CSND, "generate", "--transactions", "20", "--out", str(tmp_path / "gen")],
        capture_output=True,
        text=True,
    )
    assert gen.returncode == 0, gen.stderr
    stream = str(tmp_path / "gen" / "dn1.pgstream")
    ways: list[tuple[dict[str, str] | None, tuple[str, ...]]] = [
        ({"CSND_LOG_FORMAT": "json"}, ()),
        (None, ("--log-format", "json")),
    ]
    toml = tmp_path / "csnd.toml"
    toml.write_text('log_format = "json"\n')
    ways.append((None, ("--config", str(toml))))
    for i, (env, args) in enumerate(ways):
        served = start_serve([stream], str(tmp_path / f"log{i}"), "-v", *args, env=env)
        assert served.lines[0].startswith("csnd serve: listening on ")  # (the ready line stays as it was)
        # (stopped once the pipeline runs: a stop while its decoders start is another story)
        wait_for(partial(_has_all, served), "the stream in the changelog")
        status, err = served.terminate()
        assert status == 0, err
        docs = [json.loads(ln) for ln in err.splitlines()]  # (every line one object)
        assert docs and all(
            re.fullmatch(TIME, d["time"])
            and d["level"] in ("info", "warning")
            and d["logger"].startswith("csnd")
            for d in docs
        ), docs
        stopped = [d for d in docs if d["message"].startswith("stopped: ")]
        assert len(stopped) == 1 and isinstance(stopped[0]["csn"], int), docs

    bad = subprocess.run(
        [*CSND, "changelog", str(tmp_path / "log0")],
        capture_output=True,
        text=True,
        env={**os.environ, "CSND_LOG_FORMAT": "xml"},
    )
    assert (bad.returncode, bad.stderr) == (
        2,
        "csnd: error: CSND_LOG_FORMAT: expected text or json, got 'xml'\n",
    )
