"""Fuzzing the pgoutput parser (csnd.reader.pgoutput) with mutated, truncated and arbitrary frames.

What a damaged stream may hand the parser: every encoded message kind,
then a byte changed, bytes cut off or added, or plain noise.  The answer
must be a message, or `FrameError` -- never another exception -- and the
fast paths the reader takes for changes, Begin and Commit must give what
the general path gives (or leave the frame to it).
"""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import FrameError
from csnd.reader import pgoutput as p

FUZZ = settings(max_examples=100, deadline=None)

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(max_size=6)
tuples = st.lists(st.none() | st.just(p.UNCHANGED) | st.binary(max_size=6), min_size=1, max_size=3)


def _encoded(in_stream: bool) -> st.SearchStrategy[bytes]:
    """One pgoutput v2 message of any kind (with the extra xid of a stream block when `in_stream`)."""
    x = u32 if in_stream else st.none()
    cols = st.lists(st.builds(p.Column, st.integers(0, 1), names, u32, st.integers(-1, 99)), max_size=3)
    return st.one_of(
        st.builds(p.encode_begin, u64, i64, u32),
        st.builds(p.encode_commit, u64, u64, i64),
        st.builds(p.encode_origin, u64, names),
        st.builds(
            lambda r, n, c, xid: p.encode_relation(r, "public", n, "d", c, xid=xid), u32, names, cols, x
        ),
        st.builds(lambda t, n, xid: p.encode_type(t, "public", n, xid=xid), u32, names, x),
        st.builds(lambda r, v, xid: p.encode_insert(r, v, xid=xid), u32, tuples, x),
        st.builds(lambda r, v, xid: p.encode_delete(r, v, xid=xid), u32, tuples, x),
        st.builds(lambda r, v, xid: p.encode_update(r, v, xid=xid), u32, tuples, x),
        st.builds(lambda r, xid: p.encode_truncate(r, xid=xid), st.lists(u32, max_size=3), x),
        st.builds(
            lambda t, lsn, pre, c, xid: p.encode_message(pre, c, lsn, t, xid=xid),
            st.booleans(),
            u64,
            names,
            st.binary(max_size=8),
            x,
        ),
        st.builds(p.encode_stream_start, u32, st.booleans()),
        st.just(p.encode_stream_stop()),
        st.builds(p.encode_stream_commit, u32, u64, u64, i64),
        st.builds(p.encode_stream_abort, u32, u32),
    )


@st.composite
def _mutated(draw: st.DrawFn, good: bytes) -> bytes:
    how = draw(st.sampled_from(["flip", "cut", "extend", "insert", "same"]))
    at = draw(st.integers(0, len(good)))
    if how == "flip" and good:
        at = min(at, len(good) - 1)
        return good[:at] + bytes([good[at] ^ draw(st.integers(1, 255))]) + good[at + 1 :]
    if how == "cut":
        return good[:at]
    if how == "extend":
        return good + draw(st.binary(min_size=1, max_size=8))
    if how == "insert":
        return good[:at] + draw(st.binary(min_size=1, max_size=4)) + good[at:]
    return good


def _fields(msg: object) -> tuple[object, ...]:
    slots = getattr(msg, "__slots__", None)
    return (type(msg).__name__, *(getattr(msg, f) for f in (slots if slots is not None else vars(msg))))


def _general(payload: bytes, in_stream: bool) -> tuple[object, ...] | None:
    """The general path's reading of an XLogData frame: (dataStart, message fields), None if it refuses."""
    try:
        frame = p.parse_frame(payload)
        if isinstance(frame, p.Keepalive):
            return None
        return (frame.data_start, _fields(p.parse_message(frame.payload, in_stream)))
    except FrameError:
        return None


@FUZZ
@given(st.data(), st.booleans())
def test_a_mutated_message_parses_or_is_a_frame_error(data: st.DataObject, in_stream: bool) -> None:
    raw = data.draw(_mutated(data.draw(_encoded(in_stream))))
    try:
        msg = p.parse_message(raw, in_stream)
    except FrameError as e:
        assert e.message
        return
    assert isinstance(msg, p.Message)


@FUZZ
@given(st.data(), st.booleans(), u64, u64, i64)
def test_the_fast_paths_agree_with_the_general_path(
    data: st.DataObject, in_stream: bool, start: int, end: int, t: int
) -> None:
    """What `parse_change_frame` and `parse_txn_frame` take, the general path reads the same way."""
    frame = data.draw(_mutated(p.encode_xlogdata(start, end, t, data.draw(_encoded(in_stream)))))
    general = _general(frame, in_stream)
    fast = p.parse_change_frame(frame, in_stream)
    if fast is not None:
        assert general == (fast[0], _fields(fast[1]))
    if not in_stream:
        txn = p.parse_txn_frame(frame)
        if txn is not None:
            assert general == (txn[0], _fields(txn[1]))


@FUZZ
@given(st.binary(max_size=80), st.booleans())
def test_noise_parses_or_is_a_frame_error(raw: bytes, in_stream: bool) -> None:
    for parse in (p.parse_frame, lambda b: p.parse_message(b, in_stream)):
        with contextlib.suppress(FrameError):
            parse(raw)
    p.parse_change_frame(raw, in_stream)  # (these refuse by returning None, never by raising)
    p.parse_txn_frame(raw)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.booleans().flatmap(_encoded), max_size=12), st.data())
def test_a_parser_over_a_mutated_sequence_parses_or_raises_a_frame_error(
    msgs: list[bytes], data: st.DataObject
) -> None:
    """The stream-block state machine: any order of any messages, one of them damaged."""
    if msgs:
        i = data.draw(st.integers(0, len(msgs) - 1))
        msgs[i] = data.draw(_mutated(msgs[i]))
    parser = p.PgOutputParser()
    for raw in msgs:
        try:
            parser.parse(raw)
        except FrameError:
            return


@FUZZ
@given(
    st.lists(
        st.tuples(u64, st.sampled_from([p.encode_insert, p.encode_delete]), u32, tuples),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),
    st.sampled_from([4, 8]),
)
def test_a_run_of_change_frames_reads_back_every_change(
    changes: list[tuple[int, object, int, list[object]]], in_stream: bool, head: int
) -> None:
    xid = 77 if in_stream else None
    blob = b""
    want = []
    for lsn, encode, relid, values in changes:
        payload = p.encode_xlogdata(lsn, lsn, 1, encode(relid, values, xid=xid))  # type: ignore[operator]
        blob += struct.pack("!I", len(payload)) + b"\x00" * (head - 4) + payload
        change = p.parse_message(payload[p.XLOGDATA_HEADER_SIZE :], in_stream)
        assert isinstance(change, p.Change)
        want.append((lsn, change.kind, change.xid, change.relid, change.data))
    assert list(p.iter_change_frames(blob, in_stream, head)) == want


def test_a_truncate_of_a_negative_or_huge_relation_count_is_a_frame_error() -> None:
    for n in (-1, 2**31 - 1):
        with pytest.raises(FrameError, match="corrupt Truncate message"):
            p.parse_message(b"T" + struct.pack("!iB", n, 0) + b"\x00" * 8, False)
