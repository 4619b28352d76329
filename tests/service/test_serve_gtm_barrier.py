"""The GTM commit barrier's timeout as a setting of `csnd serve`, and what a start it cannot finish says.

A writer stopped between taking its CSN and deciding keeps the barrier of
a GTM-mode initial snapshot from draining: `csnd serve
--gtm-barrier-timeout 2` gives up after it, exits naming the gid, and the
GTM hands out CSNs again.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from csnd.core.errors import ConfigError
from csnd.gtm.liveload import LoadOptions, setup
from csnd.gtm.pggtm import PgGtm
from csnd.service.config import build_config
from csnd.testing.cluster import LocalCluster, start_cluster
from tests.service.servekit import CSND


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with start_cluster(2) as c:
        setup(LoadOptions(nodes=c.urls(), gtm=c.gtm_url, publication="csnd_pub"))
        yield c


def test_the_barrier_timeout_comes_from_the_flag_the_variable_and_the_file() -> None:
    url = "postgresql://h/db?slot=s&publication=p&mode=gtm"
    flags = {"changelog": "c", "gtm": "postgresql://g/db"}
    assert build_config({}, flags, [url], environ={}).gtm_barrier_timeout_s is None  # (the barrier's 10 s)
    assert build_config({"gtm_barrier_timeout": 2.5}, flags, [url], environ={}).gtm_barrier_timeout_s == 2.5
    env = {"CSND_GTM_BARRIER_TIMEOUT": "4"}
    assert build_config({"gtm_barrier_timeout": 2.5}, flags, [url], environ=env).gtm_barrier_timeout_s == 4.0
    given = {**flags, "gtm_barrier_timeout": 1.0}
    assert build_config({"gtm_barrier_timeout": 2.5}, given, [url], environ=env).gtm_barrier_timeout_s == 1.0
    with pytest.raises(ConfigError, match="gtm_barrier_timeout"):
        build_config({"gtm_barrier_timeout": 0}, flags, [url], environ={})


def test_a_barrier_held_by_a_stuck_writer_times_out_names_the_gid_and_releases_the_gtm(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    urls = cluster.urls()
    sources = [f"{n}={u}?slot=bt_s&publication=csnd_pub&mode=gtm&snapshot=initial" for n, u in urls.items()]
    # A writer stopped right after taking its CSN, as the barrier sees it: a commit record with
    # the CSN taken, no decision, its GTM session alive.  (No node transaction of its own is
    # left open: a slot's consistent point would wait for it before the barrier is reached.)
    with PgGtm(cluster.gtm_url) as gtm:
        gtm.begin_commit("held-1", {})
        taken = gtm.take_csn("held-1")
        served = subprocess.run(
            [*CSND, "serve", *sources, "--changelog", str(tmp_path / "log"), "--listen", "127.0.0.1:0",
             "--gtm", cluster.gtm_url, "--gtm-barrier-timeout", "2"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert served.returncode == 1, (served.returncode, served.stderr)
        assert "held-1" in served.stderr and "after 2s" in served.stderr, served.stderr
        assert "released the gtm" in served.stderr and "Traceback" not in served.stderr, served.stderr
        with PgGtm(cluster.gtm_url) as other:  # (released: CSNs are handed out again)
            assert other.next() > taken
        gtm.end_commit("held-1")
