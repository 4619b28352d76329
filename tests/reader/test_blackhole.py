"""A black-holed replication path: bytes stop in both directions, nothing is closed.

No reset and no end of stream ever arrive, so only the reader's own bound on
silence (`receive_timeout_s`, with a reply asked for half way) can notice.
The reader then reconnects -- around the hole, through the same proxy, whose
new connections flow -- and the recording must hold every committed
transaction exactly once, as the test_decoding witness slot has them.

The source URL lowers the walsender's own wal_sender_timeout for its
connections (a user-settable option), so the server lets go of the slot
held by the black-holed connection within seconds instead of a minute.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from csnd.core.ids import lsn_from_str
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.pgoutput.messages import Commit
from csnd.reader.record_cmd import record
from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase
from tests.fixtures.proxy import Proxy
from tests.reader.test_live import _compare, _ours, _slots, _witness
from tests.service.servekit import wait_for

# Small, so the test does not wait a minute; the walsender's (below) is a little longer,
# as in production, where both default to 60 s and the reader notices first or together.
RECEIVE_TIMEOUT_S = 2.0
SERVER_TIMEOUT = "3s"


def test_black_holed_connection_is_noticed_and_resumed_without_loss_or_doubles(
    pg: PgDatabase, tmp_path: Path
) -> None:
    workload.setup(pg.dsn)
    _slots(pg)
    workload.run(pg.dsn, rounds=1, seed=3)
    first_end = lsn_from_str(pg.current_lsn())
    out = tmp_path / "r.pgstream"
    with Proxy("127.0.0.1", pg.server.port) as proxy:
        url = (
            f"postgresql://postgres@127.0.0.1:{proxy.port}/{pg.name}"
            f"?options=-c%20wal_sender_timeout%3D{SERVER_TIMEOUT}"
        )
        opts = LiveOptions(url, "csnd", "csnd_pub", binary=False, receive_timeout_s=RECEIVE_TIMEOUT_S)
        src = LiveSource("dn1", opts)
        result: dict[str, Any] = {}

        def capture() -> None:
            try:
                result["summary"] = record(src, str(out), progress=None)
            except BaseException as e:  # (reported by the assertion below)
                result["error"] = e

        t = threading.Thread(target=capture)
        t.start()
        try:
            wait_for(lambda: src.received_lsn >= first_end or "error" in result, "the stream to flow")
            assert proxy.black_hole() == 1, "the proxy carried no replication connection"
            workload.run(pg.dsn, rounds=1, seed=4)  # committed while the path is dead
            wait_for(
                lambda: src.reconnects >= 1 or "error" in result,
                "the reader to give up the silent connection and reconnect",
                seconds=90,
                diagnose=lambda: f"silences {src.silences}, received {src.received_lsn:X}",
            )
            workload.run(pg.dsn, rounds=1, seed=5)
            end = pg.current_lsn()
            src.options.until_lsn = lsn_from_str(end)
            t.join(120)
        finally:
            src.close()
            t.join(30)
    assert not t.is_alive(), "the recording did not end after the reconnect"
    assert "error" not in result, result.get("error")
    assert src.silences >= 1 and src.reconnects >= 1
    ours, _ = _ours(out)
    theirs, _ = _witness(pg, end)
    assert len(theirs) >= 3 * 2  # (each round commits transactions: the comparison is not empty)
    _compare(ours, theirs)


def test_keepalive_options_go_to_libpq_unless_the_url_sets_them(pg: PgDatabase) -> None:
    """The replication connection asks for TCP keepalive; the URL's own value wins."""
    src = LiveSource(
        "dn1", LiveOptions(f"{pg.url}?keepalives_idle=42", "csnd", "csnd_pub", receive_timeout_s=7.0)
    )
    pgconn = src.link.open(started=False)
    try:
        info = {o.keyword.decode(): (o.val or b"").decode() for o in pgconn.info}
    finally:
        src.link.drop()
    assert info["keepalives"] == "1"
    assert info["keepalives_idle"] == "42"
    assert info["keepalives_interval"] == "5" and info["keepalives_count"] == "3"
    assert info["tcp_user_timeout"] == "7000"


def test_receive_timeout_is_a_live_setting_of_serve() -> None:
    """`receive_timeout` rides on the URL, in [defaults] and as --receive-timeout, and reaches the reader."""
    from csnd.core.errors import ConfigError
    from csnd.service.config import build_config

    url = "postgresql://h/db?slot=s&publication=p"
    c = build_config(
        {"defaults": {"receive_timeout": 9}}, {"changelog": "c"}, [url, url + "&receive_timeout=2.5"]
    )
    assert [s.live.receive_timeout_s for s in c.sources] == [9.0, 2.5]
    assert c.sources[1].live.options("postgresql://h/db").receive_timeout_s == 2.5
    c = build_config({}, {"changelog": "c", "receive_timeout": 4.0}, [url], environ={})
    assert c.sources[0].live.receive_timeout_s == 4.0
    assert build_config({}, {"changelog": "c"}, [url], environ={}).sources[0].live.receive_timeout_s == 60.0
    with pytest.raises(ConfigError, match="receive_timeout: expected a number > 0, got '0'"):
        build_config({}, {"changelog": "c"}, [url + "&receive_timeout=0"], environ={})


def test_a_pause_downstream_longer_than_the_timeout_is_not_silence(pg: PgDatabase) -> None:
    """Data that arrived while the reader was held up downstream breaks the silence the last look saw."""
    workload.setup(pg.dsn)
    _slots(pg)
    src = LiveSource("dn1", LiveOptions(pg.url, "csnd", "csnd_pub", binary=False, receive_timeout_s=1.0))
    idles: list[float] = []

    class Quiet:
        def idle(self) -> None:  # (called when a wait for data timed out)
            idles.append(time.monotonic())
            if len(idles) == 1:
                workload.run(pg.dsn, rounds=1, seed=6)  # commits that arrive while downstream is busy:
                time.sleep(1.5)  # held up past the receive timeout (a load, not a synchronisation)
            else:
                src.close()  # idle again after reading them: enough

        def finishing(self) -> None:
            pass

    commits = sum(1 for _lsn, m in src.events(quiet=Quiet()) if isinstance(m, Commit))
    assert commits > 0
    assert (src.silences, src.reconnects) == (0, 0)
