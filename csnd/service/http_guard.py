"""Who the dashboard answers: the Host a request names, and the session cookie `/login` gives.

    Host: rebind.example:8080 ─► host_allowed ─► no  ─► 403 (the probes excepted)
    POST /login, good token ──► Sessions.issue(now) ─► csnd_session=<issued>.<hmac>; Max-Age=...
    Cookie: csnd_session=...  ─► Sessions.valid(value, now) ─► yes while now - issued < ttl

DNS rebinding: a page on `rebind.example` has its name re-resolved to
127.0.0.1 and then reads `http://rebind.example:8080/api/status` as its own
origin -- the browser sends `Host: rebind.example:8080`.  So a request is
answered only when its Host is a name the service knows: `localhost`, the
name `--http` listens on, one of `--http-allowed-hosts` (`*`: any), or an
address literal (127.0.0.1, 10.1.2.3, [::1]: no DNS answer makes a browser
send one; the user typed it).  A request without a Host (HTTP/1.0 tools) is
not from a browser and is answered.  The port is not looked at: the attack
is in the name.

A session is the time it was issued and an HMAC of that time under a key
derived from the token: it proves the holder gave the token at that time,
it is not the token (a stolen cookie opens the dashboard, not the
changefeed), and it ends `ttl` seconds after it was issued whatever the
browser does with Max-Age.  No state on the server: a restart keeps the
sessions, a new token ends them all.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable
from typing import Final

# What a Host header's name may be (a DNS name or an address literal); anything else is refused.
_HOST_NAME: Final = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?\.?", re.ASCII)
_SESSION_LABEL: Final = b"csnd dashboard session"


def host_name(host: str) -> str:
    """The name of a Host header value: lowercase, without the port, brackets or a final dot."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8080
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def check_allowed_host(name: str) -> str:
    """`name` as `--http-allowed-hosts` takes it (lowercase, no final dot); ValueError if it is none."""
    if name == "*":
        return name
    if not _HOST_NAME.fullmatch(name.lower()) or name.startswith("."):
        raise ValueError(name)
    return name.lower().rstrip(".")


def host_allowed(host: str | None, known: Iterable[str]) -> bool:
    """Whether a request with this Host header is answered (see the module docstring)."""
    if host is None:
        return True
    name = host_name(host)
    if name == "localhost" or is_address(name):
        return True
    known = set(known)
    return "*" in known or name in known


class Sessions:
    """Session cookie values under a token: `issue(now)` and `valid(value, now)`."""

    def __init__(self, token: str, ttl_s: int) -> None:
        self._key = hmac.new(token.encode(), _SESSION_LABEL, hashlib.sha256).digest()
        self.ttl_s = ttl_s

    def _mac(self, issued: int) -> str:
        return hmac.new(self._key, str(issued).encode(), hashlib.sha256).hexdigest()

    def issue(self, now: float) -> str:
        issued = int(now)
        return f"{issued}.{self._mac(issued)}"

    def valid(self, value: str, now: float) -> bool:
        issued_text, _, mac = value.partition(".")
        if not issued_text.isascii() or not issued_text.isdigit() or len(issued_text) > 12:
            return False
        issued = int(issued_text)
        if not hmac.compare_digest(mac.encode(), self._mac(issued).encode()):
            return False
        # (issued ahead of now: the clock went back, or a forgery; refused either way)
        return issued <= now < issued + self.ttl_s
