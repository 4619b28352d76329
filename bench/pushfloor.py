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
sending it, as csnd serves only what its changelog made durable.
`handoff`: `durable`, with the pipe read, written and fsynced by a thread
of its own that hands each message to the stream's thread through a
condition, as csnd's reader hands its changelog to each subscriber's
stream: the one hand-off a service that feeds any number of subscribers
from one source keeps.  `aio`: grpc.aio on both sides (an asyncio loop
reading the pipe and writing to the stream), the design an asynchronous
changefeed would take.

`--work-us N` (sync, durable, handoff): the relay also spins N µs of
Python CPU a transaction, holding the GIL, before it writes the message,
standing in for the work csnd does on each transaction (parse, decode,
order, frame).  Swept, it says how much such work the goal's bar leaves.

    python -m bench.pushfloor relay sync|aio [--work-us N]   (reads stdin; prints its port on stderr)
    python -m bench.pushfloor relay durable|handoff FILE [--work-us N]
    python -m bench.pushfloor client sync|durable|handoff|aio PORT
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from typing import Any, Final

import grpc

METHOD: Final = "/csnd.bench.Floor/Lines"
KINDS: Final = ("sync", "durable", "handoff", "aio")
WRITES_A_FILE: Final = ("durable", "handoff")
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


def transactions_in(message: bytes) -> int:
    """How many transactions `message` (whole ones, `whole_transactions`) holds: its COMMIT lines."""
    return message.count(b"\n" + COMMIT) + message.startswith(COMMIT)


def spin(seconds: float) -> None:
    """Python CPU for `seconds`, the GIL held as csnd's own work on a transaction holds it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def relayed_messages(log_path: str | None, work_s: float) -> Iterator[bytes]:
    """The messages of stdin, each after `work_s` of CPU a transaction and, given `log_path`, appended to
    that file and fsynced."""
    fd, pending = sys.stdin.fileno(), b""
    log = -1 if log_path is None else os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    while chunk := os.read(fd, READ_BYTES):
        message, pending = whole_transactions(pending + chunk)
        if message:
            if work_s:
                spin(work_s * transactions_in(message))
            if log >= 0:
                os.write(log, message)
                os.fsync(log)
            yield message


def relay_sync(log_path: str | None, work_s: float, handoff: bool) -> None:
    """`log_path`: append each message to this file and fsync it before sending it (`durable`).

    `handoff`: a thread of the relay's own reads the pipe and makes each message durable, and the
    stream's thread sends what it handed over (`handoff`)."""
    if handoff:
        ready: deque[bytes] = deque()
        handed = threading.Condition()

        def read_pipe() -> None:
            for message in relayed_messages(log_path, work_s):
                with handed:
                    ready.append(message)
                    handed.notify()

        threading.Thread(target=read_pipe, name="floor-reader", daemon=True).start()

        def lines(_request: bytes, _context: grpc.ServicerContext) -> Iterator[bytes]:
            while True:
                with handed:
                    handed.wait_for(lambda: ready)
                    message = b"".join(ready)
                    ready.clear()
                yield message

    else:

        def lines(_request: bytes, _context: grpc.ServicerContext) -> Iterator[bytes]:
            yield from relayed_messages(log_path, work_s)

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
    p = argparse.ArgumentParser(prog="python -m bench.pushfloor", description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=("relay", "client"))
    p.add_argument("kind", choices=KINDS)
    p.add_argument("where", nargs="?", help="relay durable|handoff: the file to append to; client: the port")
    p.add_argument("--work-us", type=float, default=0.0, help="relay: µs of Python CPU a transaction")
    a = p.parse_args(argv)
    if a.where is None and (a.role == "client" or a.kind in WRITES_A_FILE):
        p.error(f"{a.role} {a.kind} needs " + ("the port" if a.role == "client" else "the file"))
    if a.role == "relay" and a.kind == "aio":
        if a.work_us:
            p.error("--work-us is for the sync, durable and handoff relays")
        asyncio.run(relay_aio())
    elif a.role == "relay":
        log_path = a.where if a.kind in WRITES_A_FILE else None
        relay_sync(log_path, a.work_us / 1e6, a.kind == "handoff")
    elif a.kind == "aio":
        asyncio.run(client_aio(int(a.where)))
    else:
        client_sync(int(a.where))


if __name__ == "__main__":
    main(sys.argv[1:])
