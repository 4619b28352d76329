"""A gRPC response stream read on the caller's own thread, with a timeout.

    socket ─► gRPC's threads ─► channel thread ─► call's condition ─► caller's thread (next_message)

grpc's synchronous streaming iterator (`for msg in call`) blocks without a
timeout, so the client read each stream on a response thread of its own and
handed what arrived to the caller through a queue.  Live, one transaction at
a time, a message then crossed gRPC's channel thread, the response thread and
the caller's thread: two Python wake-ups and a queue after gRPC's own, for a
`csnd subscribe` that only waits for the next line anyway
(docs/performance.md, "Live latency").  `CallerReader.next_message` does
what the iterator's `__next__` does, with a timeout: it asks gRPC for the
next message once, and waits on the call's own condition, which the channel
thread notifies when the message is there.  The next message is asked for as
soon as one is taken, so gRPC receives it while the caller writes.

It uses the rendezvous's private state (`grpc._channel._MultiThreadedRendezvous`
as grpcio 1.85 has it: `_state`, `_call`, `_event_handler`); `supported`
tells whether a call has it, and the client reads in a response thread when
it does not.  Only the caller's thread may call `next_message`.
"""

from __future__ import annotations

import time
from typing import Any, Final

import grpc

try:  # (private: checked for by `supported`, never assumed)
    from grpc import _channel as _grpc_channel
    from grpc._cython import cygrpc as _cygrpc

    _RECEIVE: Any = _cygrpc.OperationType.receive_message
except (ImportError, AttributeError):  # pragma: no cover  (another grpcio)
    _grpc_channel = None
    _RECEIVE = None

__all__ = ["CallerReader", "supported"]

_NO_FLAGS: Final = 0


def supported(call: object) -> bool:
    """Whether `call` (a streaming call of grpc's synchronous API) can be read on the caller's thread here."""
    if _grpc_channel is None or _RECEIVE is None:
        return False
    # grpc's private names, looked at once per call: another grpcio without
    # them (or with other types behind them) gets the response thread.
    try:
        state: Any = call._state  # type: ignore[attr-defined]
        return (
            isinstance(call, _grpc_channel._MultiThreadedRendezvous)
            and callable(_grpc_channel._event_handler)
            and callable(call._response_deserializer)
            and call._call is not None
            and isinstance(state.due, set)
            and {"condition", "response", "code"} <= set(vars(state))
        )
    except (AttributeError, TypeError):
        return False


class CallerReader:
    """The messages of one streaming call, taken on the caller's thread (`supported(call)` must hold)."""

    __slots__ = ("_call", "_state", "_handler")

    def __init__(self, call: Any) -> None:
        self._call = call
        self._state = call._state
        self._handler = _grpc_channel._event_handler(call._state, call._response_deserializer)

    def next_message(self, timeout: float) -> Any | None:
        """The next message; None when none came within `timeout` seconds (0: only look).

        At the stream's end: StopIteration when the service ended it with OK,
        the call itself (a grpc.RpcError) otherwise -- as the iterator does.
        """
        state = self._state
        deadline = time.monotonic() + timeout
        with state.condition:
            self._ask()
            while True:
                response = state.response
                if response is not None:
                    state.response = None
                    self._ask()  # (the next one is received while the caller works)
                    return response
                if _RECEIVE not in state.due and state.code is not None:
                    if state.code is grpc.StatusCode.OK:
                        raise StopIteration
                    raise self._call
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                state.condition.wait(left)

    def _ask(self) -> None:
        """Asks gRPC for the next message unless one is asked for or waiting (the condition is held)."""
        state = self._state
        if state.response is not None or _RECEIVE in state.due or state.code is not None:
            return
        # (added before the operation, as grpc's own iterator does: the channel thread
        # may complete it before `operate` returns, and must find it due)
        state.due.add(_RECEIVE)
        if not self._call._call.operate((_cygrpc.ReceiveMessageOperation(_NO_FLAGS),), self._handler):
            state.due.remove(_RECEIVE)
