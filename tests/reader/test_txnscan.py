"""`take_whole_txns`: the compiled loop against its Python twin, and the twin against the parser."""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from csnd.core.ids import Lsn, lsn_from_str
from csnd.reader import copyloop as copyloop_module
from csnd.reader import txnscan
from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.pgoutput import (
    CHANGE_FRAME_MIN,
    XLOGDATA_HEADER_SIZE,
    Begin,
    Change,
    ChangeFrames,
    Commit,
    Keepalive,
    ScannedTxn,
    TxnRun,
    encode_begin,
    encode_commit,
    encode_delete,
    encode_insert,
    encode_keepalive,
    encode_type,
    encode_update,
    encode_xlogdata,
    iter_change_frames,
    one_change_frame,
    parse_hot_frame,
    parse_txn_frame,
)
from csnd.reader.txnscan import NO_STOP, take_whole_txns_py
from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase

take_whole_txns_c: Callable[..., Any] | None
try:
    from csnd.reader._txnscan import take_whole_txns as take_whole_txns_c
except ImportError:  # (reported by test_the_compiled_loop_is_built)
    take_whole_txns_c = None

IMPLEMENTATIONS = [take_whole_txns_py] + ([] if take_whole_txns_c is None else [take_whole_txns_c])


def test_the_compiled_loop_is_built() -> None:
    """`make test` installs with a C compiler: the service's reader must not fall back unnoticed."""
    assert take_whole_txns_c is not None, "csnd.reader._txnscan was not built (is a C compiler installed?)"
    if os.environ.get("CSND_IMPL", "").lower() == "python":  # (asked for the twin)
        assert txnscan.IMPLEMENTATION == "python" and txnscan.take_whole_txns is take_whole_txns_py
    else:
        assert txnscan.IMPLEMENTATION == "c" and txnscan.take_whole_txns is take_whole_txns_c
        # and it reads a psycopg connection through libpq's own calls
        assert txnscan.COPY_READER == "libpq's PQgetCopyData", txnscan.COPY_READER


class Conn:
    """`get_copy_data` over a list of results; (0, empty) once they run out, as a drained socket."""

    def __init__(self, results: list[tuple[int, Any]]) -> None:
        self.results = list(results)
        self.reads = 0

    def get_copy_data(self, _async: int) -> tuple[int, Any]:
        self.reads += 1
        if not self.results:
            return 0, memoryview(b"")
        return self.results.pop(0)


def copy(payload: bytes) -> tuple[int, memoryview]:
    return len(payload), memoryview(payload)


def xlog(lsn: int, message: bytes) -> bytes:
    return encode_xlogdata(lsn, lsn + 100, 7, message)


def one_row(lsn: int, xid: int, rows: int = 1) -> list[bytes]:
    frames = [xlog(lsn, encode_begin(lsn + 10 * (rows + 1), 1_000 + xid, xid))]
    for i in range(rows):
        frames.append(xlog(lsn + 10 * (i + 1), encode_insert(16384, [b"%d" % i, None])))
    frames.append(
        xlog(lsn + 10 * (rows + 1), encode_commit(lsn + 10 * (rows + 1), lsn + 10 * (rows + 2), 2_000 + xid))
    )
    return frames


def as_read(
    out: tuple[list[Any], list[tuple[int, Any]], int],
) -> tuple[list[Any], list[tuple[int, bytes]], int]:
    txns, back, received = out
    return txns, [(n, bytes(d)) for n, d in back], received


@pytest.mark.parametrize("take", IMPLEMENTATIONS, ids=lambda f: f.__module__)
def test_whole_transactions_carry_what_the_parser_reads(take: Callable[..., Any]) -> None:
    frames = one_row(0x1000, 700, rows=3) + one_row(0x2000, 701, rows=0) + one_row(0x3000, 702)
    conn = Conn([copy(f) for f in frames])
    txns, back, received = take(conn.get_copy_data, 100, 512, NO_STOP)
    assert [n for n, _ in back] == [0]  # stopped at the drained socket, which it hands back
    assert len(txns) == 3 and received == 0x3000 + 20
    for txn, (first, last) in zip(txns, [(0, 4), (5, 6), (7, 9)], strict=True):
        begin_at, begin = parse_txn_frame(frames[first])  # type: ignore[misc]
        commit_at, commit = parse_txn_frame(frames[last])  # type: ignore[misc]
        assert isinstance(begin, Begin) and isinstance(commit, Commit)
        assert type(txn) is ScannedTxn  # (the compiled loop makes instances of the class too)
        assert (txn.begin_at, txn.final_lsn, txn.begin_time, txn.xid) == (
            begin_at,
            begin.final_lsn,
            begin.commit_time,
            begin.xid,
        )
        assert (txn.commit_at, txn.flags, txn.commit_lsn, txn.end_lsn, txn.commit_time) == (
            commit_at,
            commit.flags,
            commit.commit_lsn,
            commit.end_lsn,
            commit.commit_time,
        )
        changes = frames[first + 1 : last]
        if not changes:
            assert txn.blob is None and txn.lsns is None
            continue
        assert txn.blob == b"".join(struct.pack("!I", len(f)) + f for f in changes)
        assert txn.lsns == [0x1000 + 10 * (i + 1) for i in range(3)] if first == 0 else [0x3010]
        assert len(list(iter_change_frames(txn.blob, False))) == len(changes)


@pytest.mark.parametrize("take", IMPLEMENTATIONS, ids=lambda f: f.__module__)
def test_a_transaction_cut_by_another_frame_is_handed_back_as_read(take: Callable[..., Any]) -> None:
    type_msg = xlog(0x1005, encode_type(16385, "public", "mood"))
    frames = [*one_row(0x100, 1), *one_row(0x1000, 2)[:2], type_msg]
    results = [copy(f) for f in frames]
    conn = Conn(results)
    txns, back, received = take(conn.get_copy_data, 100, 512, NO_STOP)
    assert len(txns) == 1 and received == 0x100 + 20
    assert len(back) == 3 and all(
        a is b for a, b in zip(back, results[3:], strict=True)
    )  # (for the general path)
    assert conn.reads == 6


@pytest.mark.parametrize("take", IMPLEMENTATIONS, ids=lambda f: f.__module__)
def test_it_stops_after_the_transaction_that_reaches_stop_at(take: Callable[..., Any]) -> None:
    frames = one_row(0x100, 1) + one_row(0x200, 2) + one_row(0x300, 3)
    conn = Conn([copy(f) for f in frames])
    txns, back, received = take(conn.get_copy_data, 100, 512, 0x200)
    assert [t[3] for t in txns] == [1, 2] and back == [] and received == 0x200 + 20
    assert conn.reads == 6


@pytest.mark.parametrize("take", IMPLEMENTATIONS, ids=lambda f: f.__module__)
@pytest.mark.parametrize("good_reads", [0, 3, 4])
def test_a_failing_read_propagates(take: Callable[..., Any], good_reads: int) -> None:
    """At the first read, after a whole transaction, or inside one: what was read is dropped (re-sent)."""
    frames = [copy(f) for f in one_row(0x100, 1) + one_row(0x200, 2)]

    def breaks(_async: int) -> tuple[int, Any]:
        if not frames or len(frames) == 6 - good_reads:
            raise OSError("connection reset")
        return frames.pop(0)

    with pytest.raises(OSError, match="connection reset"):
        take(breaks, 100, 512, NO_STOP)


def test_the_compiled_limits_are_the_parsers() -> None:
    """The C file writes the frame layouts' lengths out; the twin uses the parser's own."""
    from csnd.reader import _txnscan

    assert _txnscan.HEADER == XLOGDATA_HEADER_SIZE
    assert _txnscan.CHANGE_MIN == CHANGE_FRAME_MIN
    assert len(xlog(0, encode_begin(0, 0, 0))) == _txnscan.BEGIN_SIZE
    assert len(xlog(0, encode_commit(0, 0, 0))) == _txnscan.COMMIT_SIZE


@pytest.mark.parametrize("take", IMPLEMENTATIONS, ids=lambda f: f.__module__)
@pytest.mark.parametrize(
    ("frame", "taken"),
    [
        (xlog(0x110, encode_insert(16384, [None])), False),  # 34 bytes: too short for a change
        (xlog(0x110, encode_insert(16384, [None, None])), True),  # 35
        (xlog(0x100, encode_begin(0x120, 5, 1))[:45], False),
        (xlog(0x100, encode_begin(0x120, 5, 1)), True),  # 46
        (xlog(0x120, encode_commit(0x120, 0x128, 6))[:50], False),
        (xlog(0x120, encode_commit(0x120, 0x128, 6)), True),  # 51
    ],
)
def test_a_frame_at_each_length_limit_is_taken_as_the_parser_takes_it(
    take: Callable[..., Any], frame: bytes, taken: bool
) -> None:
    frames = one_row(0x100, 1, rows=1)
    tag = frame[25]
    at = {ord("B"): 0, ord("I"): 1, ord("C"): 2}[tag]
    frames[at] = frame
    assert (parse_hot_frame(frame, False) is not None) == taken
    txns, back, _ = take(Conn([copy(f) for f in frames]).get_copy_data, 100, 512, NO_STOP)
    assert len(txns) == (1 if taken else 0)
    assert len(back) == (1 if taken else at + 1)  # (the drained read; or the frames up to the refused one)


# Any sequence of reads: whole transactions, the frames that cut them, corrupt
# and short frames, keepalives, an empty or failed read.
def _frame_kinds(lsn: int) -> st.SearchStrategy[tuple[int, bytes]]:
    payload = st.one_of(
        st.builds(lambda x: xlog(lsn, encode_begin(lsn + 50, 9, x)), st.integers(0, 2**32 - 1)),
        st.builds(lambda v: xlog(lsn, encode_insert(16384, [v])), st.binary(max_size=40)),
        st.builds(lambda: xlog(lsn, encode_update(16384, [b"1"], old=None))),
        st.builds(lambda: xlog(lsn, encode_delete(16384, [b"1"]))),
        st.builds(lambda f: xlog(lsn, encode_commit(lsn, lsn + 8, 11, f)), st.integers(0, 255)),
        st.builds(lambda: encode_keepalive(lsn, 5, True)),
        st.builds(lambda: xlog(lsn, encode_type(16385, "s", "t"))),
        st.binary(max_size=60),  # anything at all, short or not 'w'
        st.builds(
            lambda cut, whole: whole[:cut],
            st.integers(0, 60),
            st.sampled_from(
                [
                    xlog(lsn, encode_begin(1, 2, 3)),
                    xlog(lsn, encode_commit(1, 2, 3)),
                    xlog(lsn, encode_insert(1, [b"x"])),
                ]
            ),
        ),
    )
    return st.one_of(
        payload.map(copy),
        st.sampled_from([(0, memoryview(b"")), (-1, memoryview(b"")), (-2, memoryview(b""))]),
    )


def _whole(lsn: int, xid: int, rows: int) -> list[tuple[int, Any]]:
    return [copy(f) for f in one_row(lsn, xid, rows)]


_whole_txns = st.builds(_whole, st.integers(0, 2**40), st.integers(0, 2**32 - 1), st.integers(0, 8))
# Whole transactions (which random frames alone rarely make), then single
# frames of any kind and whole transactions mixed.
reads = st.tuples(
    st.lists(_whole_txns, max_size=6),
    st.lists(
        st.one_of(st.integers(0, 2**40).flatmap(_frame_kinds).map(lambda r: [r]), _whole_txns), max_size=12
    ),
).map(lambda parts: [r for part in parts[0] + parts[1] for r in part])


@settings(max_examples=400, deadline=None)
@given(
    results=reads,
    max_frames=st.one_of(st.integers(0, 8), st.just(1000)),
    max_changes=st.one_of(st.integers(0, 6), st.just(512)),
    stop_at=st.one_of(st.just(NO_STOP), st.just(NO_STOP), st.integers(0, 2**41)),
)
def test_the_compiled_loop_equals_its_twin(
    results: list[tuple[int, Any]], max_frames: int, max_changes: int, stop_at: int
) -> None:
    a, b = Conn(results), Conn(results)
    assert take_whole_txns_c is not None
    got_c = as_read(take_whole_txns_c(a.get_copy_data, max_frames, max_changes, stop_at))
    got_py = as_read(take_whole_txns_py(b.get_copy_data, max_frames, max_changes, stop_at))
    assert got_c == got_py
    assert a.reads == b.reads
    event(f"{min(len(got_c[0]), 3)} whole transactions (3: three or more)")


# --- the live reader's copy loop around it -------------------------------------------------------


class _Ended(Exception):
    pass


class PausingConn:
    """`get_copy_data` over frames, with the socket found drained (0) before the given ones.

    The frames end with a keepalive: a read past it raises `_Ended` (from
    inside the compiled loop too, which then drops what it read: as it
    would at a lost connection, which re-sends them).
    """

    def __init__(self, frames: list[bytes], pauses: set[int]) -> None:
        self.frames, self.pauses, self.at = frames, set(pauses), 0
        self.reads = 0

    def get_copy_data(self, _async: int) -> tuple[int, Any]:
        self.reads += 1
        if self.at in self.pauses:
            self.pauses.discard(self.at)
            return 0, memoryview(b"")
        if self.at == len(self.frames):
            raise _Ended
        self.at += 1
        return copy(self.frames[self.at - 1])


class _SpinCheck:
    """The loop's close flag (`link.closed`): asked once a round, it fails a loop that goes round without reading."""

    def __init__(self, conn: PausingConn) -> None:
        self.conn, self.reads, self.rounds = conn, -1, 0

    def is_set(self) -> bool:
        if self.conn.reads != self.reads:
            self.reads, self.rounds = self.conn.reads, 0
        self.rounds += 1
        assert self.rounds < 1000, f"the copy loop goes round without reading (after {self.reads} reads)"
        return False


def _changes_in_order(
    frames: list[bytes], pauses: set[int], runs: bool, until: int | None = None
) -> list[tuple[str, int]]:
    """Every event the copy loop yields, flattened to (what, LSN): whole transactions and runs opened."""
    source = LiveSource("dn1", LiveOptions("", "s", "p", until_lsn=None if until is None else Lsn(until)))
    source.link.wait = lambda *a, **k: True  # type: ignore[method-assign]
    source.link.consume = lambda *a, **k: None  # type: ignore[method-assign]
    source.feedback.send_status = lambda *a, **k: None  # type: ignore[method-assign]
    conn = PausingConn(frames, pauses)
    source.link.closed = _SpinCheck(conn)  # type: ignore[assignment]
    out: list[tuple[str, int]] = []
    try:
        for lsn, msg, _ in source._copy_loop(conn, runs=runs, pauses=None):  # type: ignore[arg-type]
            events: list[tuple[int, object]]
            if isinstance(msg, TxnRun):
                events = [e for txn in msg.frames() for e in txn.events()]
            else:
                events = [(lsn, msg)]
            for at, event in events:
                if isinstance(event, ChangeFrames):
                    out += [("change", x) for x in event.lsns]
                elif isinstance(event, Change):
                    out.append(("change", at))
                else:
                    out.append((type(event).__name__, at))
    except _Ended:
        pass
    return [*out, ("received", source.received_lsn)]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8),
    pause_at=st.lists(st.integers(0, 400), max_size=12),
    type_msg_at=st.lists(st.integers(0, 400), max_size=2),
    until=st.one_of(st.none(), st.none(), st.just(0), st.integers(0, 0x10000 * 10)),
)
def test_the_live_loop_keeps_frame_order_wherever_the_socket_runs_dry(
    sizes: list[int], pause_at: list[int], type_msg_at: list[int], until: int | None
) -> None:
    """Frames handed back by the whole-transaction loop come first, before the socket's next ones.

    Against the same frames read one by one (no runs), with the socket
    drained at random frames (a transaction cut by a pause is handed back
    part-read), Type messages inside transactions, and `--until-lsn`
    anywhere (0/0 too): the same events, ending at the same place, with
    the same received position.
    """
    frames: list[bytes] = []
    for i, rows in enumerate(sizes):
        frames += one_row(0x10000 * (i + 1), 700 + i, rows)
    for at in sorted(type_msg_at, reverse=True):
        at = min(at, len(frames))
        if 0 < at < len(frames) and frames[at - 1][25] != ord("C"):  # (inside a transaction)
            frames.insert(at, xlog(0x10000 * (len(sizes) + 1), encode_type(16385 + at, "s", "t")))
    frames.append(encode_keepalive(0x10000 * (len(sizes) + 1), 9))  # (then the stream ends: `_Ended`)
    pauses = {min(p, len(frames) - 1) for p in pause_at}
    assert _changes_in_order(frames, pauses, True, until) == _changes_in_order(frames, set(), False, until)


@given(st.lists(st.sampled_from("IUD"), min_size=0, max_size=3), st.integers(0, 2**64 - 1000))
def test_one_change_frame_reads_a_run_of_one_as_iter_change_frames_does(kinds: list[str], lsn: int) -> None:
    """The decoder workers' short way for a one-row transaction's run; a run of any other length is None."""
    encoders = {
        "I": lambda: encode_insert(16384, [b"\x00\x00\x00\x07", b"x"]),
        "U": lambda: encode_update(16384, [b"\x00\x00\x00\x07", None]),
        "D": lambda: encode_delete(16384, [b"\x00\x00\x00\x07", None]),
    }
    frames = [xlog(lsn, encoders[k]()) for k in kinds]
    blob = b"".join(struct.pack("!I", len(f)) + f for f in frames)
    one = one_change_frame(blob)
    if len(kinds) != 1:
        assert one is None
        return
    assert one is not None
    start, kind, relid, data_at = one
    ((want_lsn, want_kind, want_xid, want_relid, want_data),) = list(iter_change_frames(blob, False))
    assert (start, kind, relid, blob[data_at:]) == (want_lsn, want_kind, want_relid, want_data)
    assert want_xid is None


# --- libpq's own reader (`copy_reader`) against psycopg's `get_copy_data`, on a real server -------


def _flat(msg: object, at: int) -> list[tuple[Any, ...]]:
    """A live event as plain tuples: every message's fields, every change frame's data."""
    if isinstance(msg, TxnRun):
        return [x for txn in msg.frames() for e in txn.events() for x in _flat(e[1], e[0])]
    if isinstance(msg, ChangeFrames):
        return [("change", *c) for c in iter_change_frames(msg.blob, msg.in_stream, msg.head)]
    if isinstance(msg, Change):
        return [("change", at, msg.kind, msg.xid, msg.relid, msg.data)]
    slots = [s for cls in type(msg).__mro__ for s in getattr(cls, "__slots__", ())]
    return [(type(msg).__name__, at, *(repr(getattr(msg, s, None)) for s in slots))]


def _read_live(pg: PgDatabase, slot: str, end: str) -> tuple[list[tuple[Any, ...]], int]:
    src = LiveSource("dn1", LiveOptions(pg.url, slot, "csnd_pub", until_lsn=lsn_from_str(end)))
    out: list[tuple[Any, ...]] = []
    batches = 0
    for lsn, msg in src.events(raw_changes=True):
        batches += isinstance(msg, TxnRun)
        if not isinstance(msg, Keepalive):  # (the server's clock and WAL end: not the stream's content)
            out += _flat(msg, lsn)
    return out, batches


def test_the_live_reader_reads_the_same_through_libpq_as_through_psycopg(
    pg: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots over the same WAL: one read with the compiled loop's own libpq calls, one with psycopg's.

    The WAL holds what the loop takes (one-row and many-row transactions)
    and what it hands back (Relation messages, a transaction too large for
    one run, a truncate, keepalives), so both of its paths are crossed.
    """
    if txnscan.COPY_READER != "libpq's PQgetCopyData":
        assert os.environ.get("CSND_IMPL", "").lower() == "python", txnscan.COPY_READER
        pytest.skip("CSND_IMPL=python: the compiled loop and its reader are not in use")
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('direct', 'pgoutput')")
    pg.execute("SELECT pg_create_logical_replication_slot('through_psycopg', 'pgoutput')")
    workload.run(pg.dsn, rounds=1)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS scan_ab (id int PRIMARY KEY, v text)")
        for i in range(300):
            conn.execute("INSERT INTO scan_ab VALUES (%s, %s)", (i, f'v{i} é \\ "'))
        with conn.transaction():
            conn.execute("INSERT INTO scan_ab SELECT g, 'big' FROM generate_series(1000, 1800) g")
        conn.execute("TRUNCATE scan_ab")
    end = pg.current_lsn()
    direct, direct_batches = _read_live(pg, "direct", end)
    monkeypatch.setattr(copyloop_module, "copy_reader", lambda pgconn: pgconn.get_copy_data)
    plain, plain_batches = _read_live(pg, "through_psycopg", end)
    assert direct == plain
    assert direct_batches > 0 and plain_batches > 0  # (the compiled loop took batches both ways)
    assert sum(1 for e in direct if e[0] == "change") >= 300 + 801


def test_libpq_s_own_reader_fails_as_psycopg_does(pg: PgDatabase) -> None:
    """Not in COPY, and closed: the same psycopg.OperationalError, the same words."""
    if txnscan.COPY_READER != "libpq's PQgetCopyData":
        pytest.skip(f"not in use: {txnscan.COPY_READER}")
    other = psycopg.connect(pg.dsn, autocommit=True)
    with pytest.raises(psycopg.OperationalError) as theirs:
        other.pgconn.get_copy_data(1)
    other.close()
    conn = psycopg.connect(pg.dsn, autocommit=True)  # (libpq adds each failure's words to the last ones)
    pgconn = conn.pgconn
    reader = txnscan.copy_reader(pgconn)
    assert reader is not pgconn.get_copy_data
    with pytest.raises(psycopg.OperationalError) as ours:
        reader(1)
    assert str(ours.value) == str(theirs.value) and "receiving copy data failed" in str(ours.value)
    conn.close()
    with pytest.raises(psycopg.OperationalError, match="the connection is closed"):
        reader(1)
    assert take_whole_txns_c is not None
    with pytest.raises(psycopg.OperationalError, match="the connection is closed"):
        take_whole_txns_c(reader, 10, 10, NO_STOP)
