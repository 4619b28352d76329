"""Bearer-token authentication for every call of the service, as a server interceptor.

One check in front of every method instead of one in each handler (grpc's
examples/python/auth): a call whose metadata lacks `authorization: Bearer
<token>` never reaches the servicer and ends UNAUTHENTICATED.  The token is
compared in constant time.

Some services stay open: by default gRPC health checking
(`grpc.health.v1.Health`), so a Kubernetes gRPC probe or `grpc_health_probe`
-- which cannot send a token -- can ask whether the service is up.  Health
tells only SERVING or NOT_SERVING, nothing of the data; `--health-needs-token`
closes it too.  Reflection stays behind the token: it describes the API, and
a tool that uses it (grpcurl) can send the token as it calls.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Any, Final

import grpc

from csnd.core.tokens import read_token_file

AUTH_HEADER: Final = "authorization"
HEALTH_SERVICE: Final = "grpc.health.v1.Health"
__all__ = ["AUTH_HEADER", "HEALTH_SERVICE", "BearerTokenInterceptor", "read_token_file"]


def _aborting(code: grpc.StatusCode, details: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    def abort(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(code, details)

    return abort


class BearerTokenInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Refuses every call without the token, except to the services named in `open_services`."""

    def __init__(self, token: str, open_services: Iterable[str] = (HEALTH_SERVICE,)) -> None:
        self._expected = f"Bearer {token}".encode()
        # A method arrives as "/package.Service/Method".
        self._open = tuple(f"/{s}/" for s in open_services)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        if self._open and str(details.method).startswith(self._open):
            return continuation(details)
        got = next((v for k, v in details.invocation_metadata or () if k == AUTH_HEADER), None)
        if got is not None and hmac.compare_digest(got.encode(), self._expected):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None  # an unknown method: UNIMPLEMENTED, as without a token
        why = (
            "this service needs a token: send 'authorization: Bearer <token>' metadata (--token-file)"
            if got is None
            else "the bearer token was not accepted: check --token-file"
        )
        # The refusal must have the method's shape (streaming or not), or
        # grpc would wait for a request the client never sends.
        abort = _aborting(grpc.StatusCode.UNAUTHENTICATED, why)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(abort)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(abort)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(abort)
        return grpc.unary_unary_rpc_method_handler(abort)
