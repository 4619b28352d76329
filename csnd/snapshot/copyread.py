"""One `COPY ... TO STDOUT` read whole, as one bytes object: in one compiled call where it can be.

psycopg hands a COPY's data out one message (one row) a call, through its
generators: about 1 us a row of the copier process's time, more than the
server takes to send it.  `_copysplit.read_copy` loops on libpq's own
`PQgetCopyData` in C with the GIL released, on the connection psycopg made
(`pgconn.pgconn_ptr`), so the same libpq reads the same socket.  The
functions' addresses come from the libpq this process has loaded (psycopg's
own, the one mapped in the process); with none found, or more than one, or
without the compiled module, psycopg's loop reads it instead: the same bytes.

The COPY is sent and its result read with psycopg's `PGconn`: a failed
query or a COPY that ends in an error raises `psycopg.Error` with the
server's message, as psycopg's cursor would.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Protocol, cast

import psycopg
from psycopg import errors, generators, pq

from csnd.core.compiled import compiled_module

_copysplit = compiled_module("csnd.snapshot._copysplit")


class _PointerOf(Protocol):
    """psycopg's PGconn as its docs give it (`pq.abc.PGconn` does not declare the pointer)."""

    @property
    def pgconn_ptr(self) -> int | None: ...


@functools.lru_cache(maxsize=1)
def libpq_functions() -> tuple[int, int] | None:
    """The addresses of PQgetCopyData and PQfreemem in the libpq this process runs, or None."""
    if _copysplit is None:
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {ln.split()[-1] for ln in maps if "/libpq" in ln and ".so" in ln}
    except OSError:
        return None
    if len(paths) != 1:
        return None  # (none: a static build; several: which one psycopg uses is not known)
    try:
        lib = ctypes.CDLL(paths.pop())  # (already loaded: the same handle, nothing loaded again)
        get_copy_data = ctypes.cast(lib.PQgetCopyData, ctypes.c_void_p).value
        free_mem = ctypes.cast(lib.PQfreemem, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
    if not get_copy_data or not free_mem:
        return None
    return get_copy_data, free_mem


def read_copy(conn: psycopg.Connection[Any], statement: str) -> bytes:
    """All the data of `statement` (a COPY ... TO STDOUT), in one bytes object."""
    functions = libpq_functions()
    # (libpq's PGconn: psycopg's documented way to call what it does not wrap; None once closed)
    pointer = cast(_PointerOf, conn.pgconn).pgconn_ptr
    if functions is None or _copysplit is None or not pointer:
        with conn.cursor() as cur, cur.copy(statement) as copy:
            return b"".join(bytes(data) for data in copy)
    pgconn = conn.pgconn
    # (sent and its results awaited through psycopg's generators, which wait on the socket with the
    # GIL released: PGconn.get_result() blocks in libpq holding it, and a COPY that waits for a lock
    # would stop every other thread of the process -- copier threads run in the service's)
    pgconn.send_query(statement.encode())
    results = conn.wait(generators.execute(pgconn))
    result = results[0] if results else None
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        conn.wait(generators.fetch_many(pgconn))
        raise _error(result, pgconn, f"not a COPY TO STDOUT: {statement[:60]}")
    data, _status = _copysplit.read_copy(pointer, *functions)
    results = conn.wait(generators.fetch_many(pgconn))  # (the COPY's own result: ok, or its error)
    result = results[0] if results else None
    if result is None or result.status != pq.ExecStatus.COMMAND_OK:
        raise _error(result, pgconn, "the COPY ended without its result")
    return bytes(data)


def _error(result: Any, pgconn: Any, fallback: str) -> psycopg.Error:
    """The server's error, as psycopg's cursor would raise it (its class from the SQLSTATE)."""
    if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
        return errors.error_from_result(result)
    message = (pgconn.error_message or b"").decode("utf-8", "replace").strip()
    return psycopg.OperationalError(message or fallback)
