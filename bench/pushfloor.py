"""The floor of a Python gRPC push, for `python -m bench latency --floor`: a relay that does no work.

    slot `floor` ─► pg_recvlogical ─ pipe ─► relay: one gRPC handler reads the pipe, yields the
                                                    whole transactions read as one message ─► client: prints it

The relay and its client are what any changefeed served from Python to a
Python subscriber must at least do for a live transaction: one message from
a server-streaming handler to another process, which prints it.  The
reception is pg_recvlogical's own (C), and there is no decoding and no
changelog.  Each message holds the whole transactions that one read of the
pipe completed, sent at once: live, one transaction a message; behind, what
is ready goes together, as csnd's changefeed batches.  Run instead of
`csnd serve`, against the `pg_recvlogical` twin on the same load at the
same time, it says how much of csnd's latency any design of this shape
would have on this machine.

`sync`: grpc's thread-per-stream server and blocking client, as csnd's
changefeed and `csnd subscribe` are (the bench starts the client with the
poller `csnd subscribe` chooses, csnd.consumers.grpcpoll).  `durable`: the
same, and the relay appends each message to a file and fsyncs it before
sending it, as csnd serves only what its changelog made durable.  `aio`:
grpc.aio on both sides (an asyncio loop reading the pipe and writing to the
stream), the design an asynchronous changefeed would take.

    python -m bench.pushfloor relay sync|aio    (reads stdin; prints its port on stderr)
    python -m bench.pushfloor relay durable FILE
    python -m bench.pushfloor client sync|durable|aio PORT
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any, Final

import grpc

METHOD: Final = "/csnd.bench.Floor/Lines"
KINDS: Final = ("sync", "durable", "aio")
COMMIT: Final = b"COMMIT"  # (test_decoding's last line of a transaction: the message goes then)
READ_BYTES: Final = 1 << 16


def _handler(behaviour: Any) -> grpc.GenericRpcHandler:
    method = grpc.unary_stream_rpc_method_handler(behaviour)  # (no serializers: the lines go as bytes)
    return grpc.method_handlers_generic_handler("csnd.bench.Floor", {"Lines": method})


def whole_transactions(pending: bytes) -> tuple[bytes, bytes]:
    """(the complete transactions at the start of `pending`, what follows them): up to the end of
    its last complete COMMIT line."""
    complete = pending[: pending.rfind(b"\n") + 1]  # (whole lines only)
    at = complete.rfind(b"\n" + COMMIT) + 1
    if at == 0 and not complete.startswith(COMMIT):
        return b"", pending
    end = complete.index(b"\n", at) + 1
    return pending[:end], pending[end:]


def relay_sync(log_path: str | None) -> None:
    """`log_path`: append each message to this file and fsync it before sending it (`durable`)."""

    def lines(_request: bytes, _context: grpc.ServicerContext) -> Iterator[bytes]:
        fd, pending = sys.stdin.fileno(), b""
        log = -1 if log_path is None else os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        while chunk := os.read(fd, READ_BYTES):
            message, pending = whole_transactions(pending + chunk)
            if message:
                if log >= 0:
                    os.write(log, message)
                    os.fsync(log)
                yield message

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((_handler(lines),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, file=sys.stderr, flush=True)
    server.wait_for_termination()


async def relay_aio() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)

    async def lines(_request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        pending = b""
        while chunk := await reader.read(READ_BYTES):
            message, pending = whole_transactions(pending + chunk)
            if message:
                await context.write(message)

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handler(lines),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, file=sys.stderr, flush=True)
    await server.wait_for_termination()


def client_sync(port: int) -> None:
    out = sys.stdout.buffer
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for line in channel.unary_stream(METHOD)(b""):
            out.write(line)
            out.flush()


async def client_aio(port: int) -> None:
    out = sys.stdout.buffer
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream: AsyncIterator[bytes] = channel.unary_stream(METHOD)(b"")
        async for line in stream:
            out.write(line)
            out.flush()


def main(argv: list[str]) -> None:
    role, kind = argv[0], argv[1]
    if kind not in KINDS:
        raise SystemExit(f"pushfloor: kind {kind!r} is not one of {', '.join(KINDS)}")
    if role == "relay" and kind == "aio":
        asyncio.run(relay_aio())
    elif role == "relay":
        relay_sync(argv[2] if kind == "durable" else None)
    elif role == "client" and kind == "aio":
        asyncio.run(client_aio(int(argv[2])))
    elif role == "client":
        client_sync(int(argv[2]))
    else:
        raise SystemExit(f"pushfloor: role {role!r} is neither relay nor client")


if __name__ == "__main__":
    main(sys.argv[1:])
