"""The dashboard beside a credentials file: it asks for a credential, as the changefeed does.

A service given only `--credentials-file` (no `--token-file`) guarded its
changefeed with the file but served `/api/status` and `/metrics` to anyone:
the dashboard knew only the single token.  Every credential of the file
(any role: the dashboard only shows figures) now opens it, by bearer token
or through `/login`.
"""

from __future__ import annotations

import hashlib
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from csnd.gtm import generate_cluster
from tests.service.servekit import start_serve

TOKEN = "viewer-s3cret"


def _get(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kw: object) -> None:
        return None


def _login(url: str, token: str) -> tuple[int, str]:
    """POSTs the login form; its status and Set-Cookie (not followed)."""
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url + "login", data=urllib.parse.urlencode({"token": token}).encode())
    try:
        with opener.open(request, timeout=30) as r:
            return int(r.status), r.headers.get("Set-Cookie", "")
    except urllib.error.HTTPError as e:
        return int(e.code), e.headers.get("Set-Cookie", "")


def test_a_credentials_file_alone_guards_the_dashboard_too(tmp_path: Path) -> None:
    generate_cluster(str(tmp_path), 1, 20, seed=1, binary=True)
    creds = tmp_path / "credentials"
    creds.write_text(f"viewer read {hashlib.sha256(TOKEN.encode()).hexdigest()}\n", encoding="utf-8")
    served = start_serve(
        [str(tmp_path / "dn1.pgstream")], str(tmp_path / "log"), "--credentials-file", str(creds)
    )
    try:
        assert served.http is not None
        for path in ("api/status", "metrics"):
            assert _get(served.http + path) == 401, f"/{path} answered a caller without a credential"
            assert _get(served.http + path, {"Authorization": "Bearer wrong"}) == 401
            assert _get(served.http + path, {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert _get(served.http + "healthz") == 200  # (the probes stay open)
        code, cookie = _login(served.http, TOKEN)
        assert code == 303 and cookie.startswith("csnd_session="), (code, cookie)
        session = cookie.split(";", 1)[0]
        assert _get(served.http + "api/status", {"Cookie": session}) == 200
        assert "csnd_session" not in _login(served.http, "wrong")[1]
    finally:
        served.terminate()
