"""`csnd serve`'s HTTP probes and its dashboard over TLS, against the service as a subprocess.

/healthz answers from before the ready line on; /readyz says 503 and why
until the service is ready (here: while its new slot waits for a transaction
held open on the server), 200 once it is, 503 again while its node is down
for longer than --readiness-grace, and 200 when the node is back.  With
--tls-cert/--tls-key the dashboard is HTTPS with the changefeed's
certificate.
"""

from __future__ import annotations

import http.client
import subprocess
import threading
import urllib.parse
from pathlib import Path

import pytest

from csnd.testing.pgserver import free_port
from tests.fixtures.pg import PgDatabase
from tests.fixtures.tls import self_signed, trusting
from tests.service.servekit import CSND, start_serve, wait_for


def _ask(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, cert: str | None = None
) -> tuple[int, str]:
    parts = urllib.parse.urlsplit(url)
    conn = (
        http.client.HTTPSConnection(parts.hostname or "", parts.port, context=trusting(cert), timeout=30)
        if cert is not None
        else http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    )
    try:
        conn.request(method, parts.path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def _answer(url: str) -> tuple[int, str] | None:
    """The answer at `url`, or None while nothing listens there yet."""
    try:
        return _ask(url)
    except OSError:
        return None


def test_readyz_from_start_to_a_node_down_and_back(pg: PgDatabase, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE TABLE hold (id int)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE item")
    port = free_port()
    base = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(
        [*CSND, "serve", f"dn1={pg.url}?slot=csnd&publication=csnd_pub&create_slot=true",
         "--changelog", str(tmp_path / "log"), "--listen", "127.0.0.1:0", "--http", f"127.0.0.1:{port}",
         "--decoders", "1", "--readiness-grace", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        with pg.connect() as held, pg.connect() as probe:
            held.execute("BEGIN")
            held.execute("INSERT INTO hold VALUES (1)")  # (an xid: the new slot waits for it to end)

            def creating() -> bool:
                assert proc.poll() is None, proc.communicate(timeout=30)
                row = probe.execute(
                    "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'csnd'"
                ).fetchone()
                return row is not None and int(str(row[0])) > 0

            wait_for(creating, "the slot being created")
            assert wait_for(lambda: _answer(base + "healthz"), "/healthz") == (200, "ok\n")
            code, why = _ask(base + "readyz")
            assert code == 503 and why.startswith("not ready: starting: preparing the slots"), why
            assert "\n" not in why.rstrip("\n")
            assert not any(ln.startswith("csnd serve: listening on") for ln in lines)
            held.execute("COMMIT")
        wait_for(lambda: any(ln.startswith("csnd serve: dashboard on ") for ln in lines), "the ready lines")
        assert (
            wait_for(lambda: _ask(base + "readyz")[0] == 200, "ready")
            and _ask(base + "readyz")[1] == "ready\n"
        )

        pg.execute("INSERT INTO item VALUES (1)")  # (streaming: a stop now is an outage, not a bad start)
        wait_for(lambda: '"newest_csn": "0"' not in _ask(base + "api/status")[1], "the row in the changelog")
        pg.server.stop("immediate")
        try:
            down = wait_for(
                lambda: (a := _ask(base + "readyz"))[0] == 503 and a[1], "/readyz noticing the node is down"
            )
            assert down.startswith("not ready: node dn1 has been reconnecting for "), down
            assert "(over 1s)" in down
            assert _ask(base + "healthz")[0] == 200 and _ask(base + "readyz", "HEAD") == (503, "")
        finally:
            pg.server.start()
        wait_for(lambda: _ask(base + "readyz")[0] == 200, "ready again once the node is back", seconds=180)
    finally:
        if proc.poll() is None:
            proc.terminate()
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


@pytest.fixture(scope="module")
def dn1(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("gen")
    subprocess.run(
        [*CSND, "generate", "--transactions", "20", "--out", str(out)], check=True, capture_output=True
    )
    return str(out / "dn1.pgstream")


def test_the_dashboard_is_served_over_tls_with_the_changefeed_certificate(dn1: str, tmp_path: Path) -> None:
    cert, key = self_signed(str(tmp_path))
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    served = start_serve(
        [dn1], str(tmp_path / "log"), "--tls-cert", cert, "--tls-key", key, "--token-file", str(token)
    )
    try:
        url = served.http
        assert url is not None and url.startswith("https://127.0.0.1:"), served.lines
        assert _ask(url + "healthz", cert=cert) == (200, "ok\n")
        wait_for(lambda: _ask(url + "readyz", cert=cert)[0] == 200, "ready")
        assert _ask(url + "api/status", cert=cert)[0] == 401
        code, body = _ask(url + "api/status", headers={"Authorization": "Bearer s3cret"}, cert=cert)
        assert code == 200 and '"changelog"' in body
        with pytest.raises((http.client.HTTPException, OSError)):  # (a plain HTTP client gets no answer)
            _ask(url.replace("https:", "http:") + "healthz")
        assert _ask(url + "healthz", "HEAD", cert=cert) == (200, "")
    finally:
        code, err = served.terminate()
    assert code == 0 and err == "", err  # (the plain client's failed handshake is not a traceback)
