"""Reading whole one-piece transactions off a replication connection, a batch at a time (sans-I/O).

On a busy node nearly every transaction the walsender sends is one piece:
its Begin, its row changes (Insert, Update, Delete) and its Commit, one
after another, nothing else between them.  `take_whole_txns` reads such
transactions with the connection's `get_copy_data` and returns each as a
`ScannedTxn`, a NamedTuple of its fields and its changes framed as a `ChangeFrames`
run (`uint32 length | XLogData payload` per frame), which `reader.live` hands
on as one `TxnRun`.  It stops at the first frame that is not part of one --
a keepalive, a Relation, a Begin or Commit too short for its fields, a
transaction of more than `max_changes` changes, an empty or failed read --
and hands that frame back, with the frames of the transaction it was in,
exactly as `get_copy_data` returned them, for the general path to take
(which reports errors and handles every other message).

The loop is the live reader's one serial step per frame, and in Python it
is most of the service's CPU for one-row transactions: about 1 us of
interpreter per frame, three frames a transaction.  `_txnscan.c` is the
same function compiled, built at install when a C compiler is there (as
psycopg's C implementation is); this module is the reference it is tested
against and what runs without it, or with `CSND_IMPL=python` in the
environment (to compare them).  `IMPLEMENTATION` says which one runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast

from csnd.core.compiled import compiled_module
from csnd.core.errors import ConfigError
from csnd.core.ids import Lsn
from csnd.reader.pgoutput import (
    CHANGE_FRAME_MIN,
    CHANGE_TAGS,
    RUN_FRAME_LENGTH,
    XLOGDATA_HEADER_SIZE,
    XLOGDATA_START,
    Begin,
    Commit,
    ScannedTxn,
    parse_txn_frame,
    scanned_txn,
)

CopyData = tuple[int, Any]  # what `PGconn.get_copy_data` returns: (nbytes, memoryview)

NO_STOP: Final = 2**64 - 1


def take_whole_txns_py(
    get_copy_data: Callable[[int], CopyData], max_frames: int, max_changes: int, stop_at: int
) -> tuple[list[ScannedTxn], list[CopyData], int]:
    """`(whole transactions, frames handed back, highest dataStart read)`; see the module docstring.

    Reads until a frame ends the batch, until `max_frames` were read (checked
    between transactions), or after a transaction that brought the highest
    dataStart to `stop_at` or past it (the caller's `--until-lsn`; `NO_STOP`
    for none).  The highest dataStart counts only whole transactions' frames:
    the caller reads the handed-back ones itself.
    """
    txns: list[ScannedTxn] = []
    pending: list[CopyData] = []
    received = high = 0
    frames = 0
    begin: tuple[Lsn, Begin] | None = None  # the open transaction's Begin and where it came
    parts: list[bytes] = []
    lsns: list[Lsn] = []
    while True:
        if begin is None and (frames >= max_frames or received >= stop_at):
            return txns, pending, received
        got = get_copy_data(1)
        frames += 1
        nbytes, data = got
        pending.append(got)
        if nbytes <= 0:
            return txns, pending, received
        payload = bytes(data)
        n = len(payload)
        # (the parser's own tests and lengths: `parse_change_frame`'s, `parse_txn_frame`)
        if begin is None:
            txn_frame = parse_txn_frame(payload)
            if txn_frame is None:
                return txns, pending, received
            high, first = txn_frame
            if type(first) is not Begin:
                return txns, pending, received
            begin = (high, first)
            continue
        if n > CHANGE_FRAME_MIN and payload[0] == 0x77 and payload[XLOGDATA_HEADER_SIZE] in CHANGE_TAGS:
            if len(lsns) >= max_changes:
                return txns, pending, received
            start = XLOGDATA_START.unpack_from(payload, 1)[0]
            high = max(high, start)
            parts.append(RUN_FRAME_LENGTH.pack(n))
            parts.append(payload)
            lsns.append(start)
            continue
        txn_frame = parse_txn_frame(payload)
        if txn_frame is None:
            return txns, pending, received
        start, last = txn_frame
        if type(last) is not Commit:
            return txns, pending, received
        received = max(received, high, start)
        blob = b"".join(parts) if lsns else None
        txns.append(scanned_txn(*begin, blob, lsns or None, start, last))
        begin, parts, lsns, pending = None, [], [], []


_compiled = compiled_module("csnd.reader._txnscan")
if _compiled is not None:
    try:
        _compiled.bind_txn_type(ScannedTxn)  # (it makes its transactions of this class)
    except AttributeError:
        raise ConfigError(
            f"the compiled {_compiled.__name__} ({_compiled.__file__}) was built from an older "
            "_txnscan.c, without bind_txn_type; rebuild it (pip install -e . or make install), "
            "or run the Python twins with CSND_IMPL=python"
        ) from None
take_whole_txns: Callable[[Callable[[int], CopyData], int, int, int], Any] = (
    take_whole_txns_py if _compiled is None else _compiled.take_whole_txns
)
IMPLEMENTATION: Final = "python" if _compiled is None else "c"


def _load_copy_reader() -> tuple[Callable[[Any, type[BaseException]], Callable[[int], CopyData]] | None, str]:
    """The compiled loop's own reader of a connection, and why it is not used when it is not.

    It calls libpq's PQgetCopyData itself, on the libpq psycopg loaded
    (`_txnscan.bind_libpq`), so the frames the loop takes make no Python
    objects at all.
    """
    if _compiled is None:
        return None, "the compiled loop is not in use"
    from psycopg import pq

    if pq.__impl__ not in ("binary", "c"):  # (psycopg's pure-Python libpq wrapper: its own copy of the calls)
        return None, f"psycopg's libpq wrapper is its {pq.__impl__} one"
    why_not = _compiled.bind_libpq(pq.version())
    if why_not is not None:
        return None, why_not
    return _compiled.CopyReader, "libpq's PQgetCopyData"


_CopyReader, COPY_READER = _load_copy_reader()


def copy_reader(pgconn: Any) -> Callable[[int], CopyData]:
    """`pgconn.get_copy_data`, or the compiled loop's reader of the same connection (`COPY_READER` says which).

    The two return the same `(nbytes, data)` and raise the same
    `psycopg.OperationalError` ("receiving copy data failed: ...", or "the
    connection is closed"); the compiled loop reads through its own reader
    without making a Python object per frame.
    """
    import psycopg
    from psycopg import pq

    if _CopyReader is None or not isinstance(pgconn, pq.PGconn):  # (a stand-in: tests, benches)
        return cast("Callable[[int], CopyData]", pgconn.get_copy_data)
    return _CopyReader(pgconn, psycopg.OperationalError)
