"""Who may call what: bearer tokens with roles, checked by a server interceptor.

One check in front of every method instead of one in each handler (grpc's
examples/python/auth): a call whose metadata lacks `authorization: Bearer
<token>`, or whose token no credential holds, never reaches the servicer and
ends UNAUTHENTICATED; a credential whose role does not cover the method ends
PERMISSION_DENIED.  Two roles:

    read    Subscribe, Fetch, Status, ListSubscriptions, reflection, health
    admin   all of that, and ResetSubscription, DeleteSubscription, StartSnapshot

Credentials come from `--token-file` (one token, role admin: what it always
allowed) and from `--credentials-file` (one per consumer, docs/design.md
section 8): a name, a role, the SHA-256 of the token (the file holds no
token), and the named subscriptions the credential may hold.  A read
credential holds only those, so one consumer cannot take over another's
named subscription; the servicer asks `Credentials.identify` when a stream
names one (the name is in the stream's first message, past the interceptor).
A presented token is hashed and compared with every credential in constant
time, so how long a refusal takes says nothing of what was close.

Some services stay open: by default gRPC health checking
(`grpc.health.v1.Health`), so a Kubernetes gRPC probe or `grpc_health_probe`
-- which cannot send a token -- can ask whether the service is up.  Health
tells only SERVING or NOT_SERVING, nothing of the data; `--health-needs-token`
closes it too.  Reflection stays behind a token: it describes the API, and
a tool that uses it (grpcurl) can send the token as it calls.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Final

import grpc

from csnd.core.errors import ConfigError
from csnd.core.tokens import read_token_file

AUTH_HEADER: Final = "authorization"
HEALTH_SERVICE: Final = "grpc.health.v1.Health"
READ: Final = "read"
ADMIN: Final = "admin"
ROLES: Final = (READ, ADMIN)
# The methods that change what others read or start work on the sources: admin only.
# Every other method of every service (open ones aside) needs `read`.
# Under both names the changefeed answers to (csnd.service.server.SERVICE_NAMES: the
# contract's, and the deprecated earlier one), so neither name is a way around the role.
ADMIN_METHODS: Final = frozenset(
    f"/{service}/{m}"
    for service in ("csnd.changefeed.v1.Changefeed", "csnd.v1.Changefeed")
    for m in ("ResetSubscription", "DeleteSubscription", "StartSnapshot")
)
# The name the `--token-file` token goes by (in refusals and logs).
TOKEN_FILE_NAME: Final = "token-file"
_NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")
_PATTERN_RE: Final = re.compile(r"[A-Za-z0-9_.:@*-]{1,128}")
_DIGEST_RE: Final = re.compile(r"[0-9a-fA-F]{64}")

__all__ = [
    "ADMIN",
    "AUTH_HEADER",
    "HEALTH_SERVICE",
    "READ",
    "AccessInterceptor",
    "Credential",
    "Credentials",
    "read_credentials_file",
    "read_token_file",
    "token_digest",
]


def token_digest(token: str) -> bytes:
    """The SHA-256 of a token's text, as the credentials file holds it (in hex)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True)
class Credential:
    name: str
    role: str  # READ or ADMIN
    digest: bytes = b""  # SHA-256 of the token
    # Named subscriptions it may hold: names, or patterns with `*` ("*": any).
    subscriptions: tuple[str, ...] = ()

    def may_hold(self, subscription: str) -> bool:
        """Whether a stream with this credential may use the named subscription."""
        return self.role == ADMIN or any(fnmatchcase(subscription, p) for p in self.subscriptions)

    def may_call(self, method: str) -> bool:
        return self.role == ADMIN or method not in ADMIN_METHODS


class Credentials:
    """Every credential the service takes; `identify` finds the one a call's metadata presents."""

    def __init__(self, entries: Iterable[Credential]) -> None:
        self.entries = tuple(entries)
        names = [c.name for c in self.entries]
        for c in self.entries:
            if names.count(c.name) > 1:
                raise ConfigError(f"credential {c.name!r} is given twice; each name must be once")
        digests = [c.digest for c in self.entries]
        for c in self.entries:
            if digests.count(c.digest) > 1:
                raise ConfigError(
                    f"credential {c.name!r} has the token of another credential; give each its own token"
                )

    @classmethod
    def of(cls, token: str | None, credentials_file: str | None) -> Credentials | None:
        """The `--token-file` token (as admin) and the `--credentials-file` entries; None: neither."""
        entries = []
        if token is not None:
            entries.append(Credential(TOKEN_FILE_NAME, ADMIN, token_digest(token)))
        if credentials_file is not None:
            entries += read_credentials_file(credentials_file)
        return cls(entries) if entries else None

    def identify(self, metadata: Iterable[tuple[str, Any]] | None) -> Credential | None:
        """The credential whose token `metadata` presents as `authorization: Bearer <token>`; None: none."""
        got = _presented(metadata)
        if got is None or not got.startswith("Bearer "):
            return None
        digest = token_digest(got[len("Bearer ") :])
        found = None
        for c in self.entries:  # (every one compared: the time does not depend on which matched)
            if hmac.compare_digest(c.digest, digest):
                found = c
        return found


def _presented(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    value = next((v for k, v in metadata or () if k == AUTH_HEADER), None)
    return value if isinstance(value, str) else None


def read_credentials_file(path: str) -> list[Credential]:
    """The credentials of a `--credentials-file` (format: docs/design.md section 8); ConfigError naming the line."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"cannot read the credentials file {path}: {reason}") from None
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            out.append(_credential(fields))
        except ValueError as e:
            raise ConfigError(
                f"credentials file {path} line {number}: {e}; a line is NAME ROLE TOKEN-SHA256 "
                "[SUBSCRIPTION,...] (docs/design.md section 8)"
            ) from None
    if not out:
        raise ConfigError(f"credentials file {path} holds no credential; give one per line, or leave it out")
    return out


def _credential(fields: Sequence[str]) -> Credential:
    if len(fields) not in (3, 4):
        raise ValueError(f"{len(fields)} fields, not 3 or 4")
    name, role, digest = fields[:3]
    if not _NAME_RE.fullmatch(name):
        raise ValueError(
            f"name {name!r} must be 1-128 letters, digits and _.:@- (starting with one of the first two)"
        )
    if role not in ROLES:
        raise ValueError(f"role {role!r} is not read or admin")
    if not _DIGEST_RE.fullmatch(digest):
        raise ValueError(
            "the token's SHA-256 must be 64 hex digits (sha256sum of the token, without a newline)"
        )
    subscriptions = tuple(fields[3].split(",")) if len(fields) == 4 else ()
    bad = [s for s in subscriptions if not _PATTERN_RE.fullmatch(s)]
    if bad:
        raise ValueError(f"subscription {bad[0]!r} is not a name or a pattern with *")
    return Credential(name, role, bytes.fromhex(digest), subscriptions)


def _aborting(code: grpc.StatusCode, details: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    def abort(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, details)

    return abort


def refusing(handler: Any, code: grpc.StatusCode, details: str) -> Any:
    """A handler of `handler`'s shape that ends every call with `code` at once.

    The refusal must have the method's shape (streaming or not), or grpc
    would wait for a request the client never sends.
    """
    abort = _aborting(code, details)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class AccessInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Refuses a call without a known token, or whose credential's role does not cover the method."""

    def __init__(self, credentials: Credentials, open_services: Iterable[str] = (HEALTH_SERVICE,)) -> None:
        self.credentials = credentials
        # A method arrives as "/package.Service/Method".
        self._open = tuple(f"/{s}/" for s in open_services)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        method = str(details.method)
        if self._open and method.startswith(self._open):
            return continuation(details)
        metadata = details.invocation_metadata
        who = self.credentials.identify(metadata)
        if who is not None and who.may_call(method):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None  # an unknown method: UNIMPLEMENTED, as without a token
        if who is not None:
            return refusing(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"credential {who.name!r} has role {who.role}: {method.rsplit('/', 1)[-1]} needs an admin "
                "credential (--token-file, or role admin in --credentials-file)",
            )
        why = (
            "this service needs a token: send 'authorization: Bearer <token>' metadata (--token-file)"
            if _presented(metadata) is None
            else "the bearer token was not accepted: check --token-file (the service's --token-file "
            "or --credentials-file must hold it)"
        )
        return refusing(handler, grpc.StatusCode.UNAUTHENTICATED, why)
