"""A subscriber whose TCP path to the service goes silent for good (packets dropped, nothing closed).

Between `csnd subscribe` and `csnd serve` sits a proxy that black-holes the
connection it carries (tests.fixtures.proxy) while new connections flow, as
a path that died without a reset looks.  The service sends a keepalive every
5 s: the client takes a stream that has sent nothing for its silence bound as
dead, says so, and reconnects after its last line (no gap, no duplicate);
the service frees the old stream (its client timeout and keepalives).  Before
the client looked at the silence itself it relied on gRPC's HTTP/2 pings,
which a black hole held up about 60 s ("Stream removed (ping timeout)").
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from csnd.consumers.connection import open_channel, wait_reachable
from tests.fixtures.pg import PgDatabase
from tests.fixtures.proxy import Proxy
from tests.service.servekit import CSND, Served, start_serve, wait_for

SLOT = "csnd"


@pytest.fixture
def served(pg: PgDatabase, tmp_path: Path) -> Iterator[Served]:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY, v text)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    s = start_serve(
        [f"dn1={pg.url}?slot={SLOT}&publication=csnd_pub&create_slot=true"], str(tmp_path / "changelog")
    )
    try:
        yield s
    finally:
        s.kill()


def _ids(path: Path) -> list[int]:
    lines = [x for x in path.read_bytes().split(b"\n")[:-1] if x.strip()]
    return [int(ch["new"]["id"]) for line in lines for ch in json.loads(line)["changes"]]


def _insert(pg: PgDatabase, ids: range) -> None:
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        for i in ids:
            c.execute("INSERT INTO item VALUES (%s, 'x')", (i,))


# A named subscriber: its reconnect takes the subscription over, so the service
# frees the old stream at once.  An anonymous one's old stream waits out the
# client timeout (30 s; tests/service/test_changefeed.py drops a silent stream
# with a short one), and the fault class client-black-hole (tests/faults) cuts
# an anonymous and a named subscriber at once and checks every row once.
@pytest.mark.parametrize("name", ["bh"])
def test_black_holed_subscriber_reconnects_and_is_freed(
    pg: PgDatabase, served: Served, tmp_path: Path, name: str | None
) -> None:
    host, _, port = served.address.rpartition(":")
    out, err = tmp_path / "sub.out", tmp_path / "sub.err"
    with Proxy(host, int(port)) as proxy, open(out, "wb") as o, open(err, "wb") as e:
        cmd = [*CSND, "subscribe", f"127.0.0.1:{proxy.port}", *(["--name", name] if name else [])]
        sub = subprocess.Popen(cmd, stdout=o, stderr=e)
        try:
            _insert(pg, range(10))
            wait_for(lambda: len(_ids(out)) == 10, "the first rows at the subscriber")
            assert proxy.black_hole() == 1
            _insert(pg, range(10, 20))
            # Bounded by the client's silence bound and a reconnect, well inside this ceiling.
            wait_for(lambda: len(_ids(out)) >= 20, "the rows after the black hole", seconds=90)
            _insert(pg, range(20, 25))
            wait_for(lambda: len(_ids(out)) >= 25, "the rows after the reconnect")
            # The service freed the old stream: one consumer, connected through a new connection.
            wait_for(
                lambda: [c.get("connected") for c in served.status()["consumers"]] == [True],
                "the service to free the black-holed stream",
                seconds=90,
            )
        finally:
            sub.kill()
            sub.wait()
    assert _ids(out) == list(range(25)), "a gap or a duplicate across the reconnect"
    text = err.read_text()
    assert "nothing from the service for" in text and "reconnecting after csn" in text, text
    assert "Traceback" not in text, text


def test_a_new_channel_opens_a_new_connection(served: Served) -> None:
    """A reconnect after a dead path must not ride the dead path again.

    gRPC shares one connection among channels to the same target (its global
    subchannel pool): a client that closed its silent channel and opened a
    new one could get the black-holed connection back, and waited for gRPC's
    ping timeout (about 60 s) instead of reconnecting at once (seen in one
    fault-suite seed of eight).  Each channel the client opens is a
    connection of its own."""
    host, _, port = served.address.rpartition(":")
    with Proxy(host, int(port)) as proxy:
        target = f"127.0.0.1:{proxy.port}"
        first = open_channel(target, None)
        second = open_channel(target, None)
        try:
            wait_reachable(first, (), 30)
            wait_reachable(second, (), 30)
            assert proxy.accepted >= 2, f"{proxy.accepted} connection for two channels"
        finally:
            first.close()
            second.close()
