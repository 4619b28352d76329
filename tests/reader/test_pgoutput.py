"""Parse/encode round trips of every pgoutput v2 message, and bad input."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from csnd.reader import pgoutput as p

u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"]), max_size=20)
opt_xid = st.none() | u32


@given(u64, i64, u32)
def test_begin(final_lsn: int, t: int, xid: int) -> None:
    m = p.parse_message(p.encode_begin(final_lsn, t, xid), False)
    assert isinstance(m, p.Begin)
    assert (m.final_lsn, m.commit_time, m.xid) == (final_lsn, t, xid)


@given(u64, u64, i64, st.integers(0, 255))
def test_commit(c: int, e: int, t: int, flags: int) -> None:
    m = p.parse_message(p.encode_commit(c, e, t, flags), False)
    assert isinstance(m, p.Commit)
    assert (m.flags, m.commit_lsn, m.end_lsn, m.commit_time) == (flags, c, e, t)


@given(
    opt_xid,
    u32,
    names,
    names,
    st.sampled_from("dnfi"),
    st.lists(st.tuples(st.integers(0, 1), names, u32, st.integers(-1, 2**31 - 1)), max_size=8),
)
def test_relation(
    xid: int | None, relid: int, ns: str, name: str, ident: str, cols: list[tuple[int, str, int, int]]
) -> None:
    columns = tuple(p.Column(*c) for c in cols)
    m = p.parse_message(p.encode_relation(relid, ns, name, ident, columns, xid=xid), xid is not None)
    assert isinstance(m, p.Relation)
    assert (m.xid, m.relid, m.namespace, m.name, m.replident, m.columns) == (
        xid,
        relid,
        ns,
        name,
        ident,
        columns,
    )


@given(opt_xid, u32, names, names)
def test_type(xid: int | None, oid: int, ns: str, name: str) -> None:
    m = p.parse_message(p.encode_type(oid, ns, name, xid=xid), xid is not None)
    assert isinstance(m, p.TypeMsg)
    assert (m.xid, m.type_oid, m.namespace, m.name) == (xid, oid, ns, name)


tuple_values = st.lists(
    st.none() | st.just(p.UNCHANGED) | st.binary(max_size=10) | st.text(max_size=10), max_size=6
)


@given(opt_xid, u32, tuple_values, st.none() | tuple_values, st.sampled_from("KO"))
def test_changes(
    xid: int | None, relid: int, new: list[p.TupleValue], old: list[p.TupleValue] | None, kind: str
) -> None:
    ins = p.parse_message(p.encode_insert(relid, new, xid=xid), xid is not None)
    assert isinstance(ins, p.Change) and (ins.kind, ins.xid, ins.relid) == ("I", xid, relid)
    assert ins.data == b"N" + p.encode_tuple(new)
    upd = p.parse_message(p.encode_update(relid, new, old, kind, xid=xid), xid is not None)
    assert isinstance(upd, p.Change) and upd.kind == "U" and upd.relid == relid
    assert upd.data == (b"" if old is None else kind.encode() + p.encode_tuple(old)) + b"N" + p.encode_tuple(
        new
    )
    dele = p.parse_message(p.encode_delete(relid, new, kind, xid=xid), xid is not None)
    assert (
        isinstance(dele, p.Change) and dele.kind == "D" and dele.data == kind.encode() + p.encode_tuple(new)
    )


@given(opt_xid, st.lists(u32, min_size=1, max_size=5), st.integers(0, 3))
def test_truncate(xid: int | None, relids: list[int], options: int) -> None:
    m = p.parse_message(p.encode_truncate(relids, options, xid=xid), xid is not None)
    assert isinstance(m, p.Truncate) and (m.xid, m.options, m.relids) == (xid, options, tuple(relids))


@given(opt_xid, names, st.binary(max_size=50), u64, st.booleans())
def test_message(xid: int | None, prefix: str, content: bytes, lsn: int, tx: bool) -> None:
    m = p.parse_message(p.encode_message(prefix, content, lsn, tx, xid=xid), xid is not None)
    assert isinstance(m, p.LogicalMessage)
    assert (m.xid, m.transactional, m.lsn, m.prefix, m.content) == (xid, tx, lsn, prefix, content)


@given(u32, u32, u64, u64, i64, st.booleans())
def test_stream_messages(xid: int, sub: int, c: int, e: int, t: int, first: bool) -> None:
    s = p.parse_message(p.encode_stream_start(xid, first), False)
    assert isinstance(s, p.StreamStart) and (s.xid, s.first_segment) == (xid, first)
    assert isinstance(p.parse_message(p.encode_stream_stop(), True), p.StreamStop)
    sc = p.parse_message(p.encode_stream_commit(xid, c, e, t), False)
    assert isinstance(sc, p.StreamCommit) and (sc.xid, sc.commit_lsn, sc.end_lsn, sc.commit_time) == (
        xid,
        c,
        e,
        t,
    )
    sa = p.parse_message(p.encode_stream_abort(xid, sub), False)
    assert isinstance(sa, p.StreamAbort) and (sa.xid, sa.subxid) == (xid, sub)


def test_origin() -> None:
    m = p.parse_message(p.encode_origin(123, "node_a"), False)
    assert isinstance(m, p.Origin) and (m.commit_lsn, m.name) == (123, "node_a")


@settings(max_examples=50)
@given(u64, u64, i64, st.binary(max_size=30), st.booleans())
def test_frames(start: int, end: int, t: int, body: bytes, reply: bool) -> None:
    f = p.parse_frame(p.encode_xlogdata(start, end, t, b"E" + body))
    assert isinstance(f, p.XLogData) and (f.data_start, f.wal_end, f.send_time, f.payload) == (
        start,
        end,
        t,
        b"E" + body,
    )
    k = p.parse_frame(p.encode_keepalive(end, t, reply))
    assert isinstance(k, p.Keepalive) and (k.wal_end, k.send_time, k.reply_requested) == (end, t, reply)


def test_unknown_message_type_is_named() -> None:
    with pytest.raises(p.FrameError, match=r"unknown pgoutput message type 'Z'"):
        p.parse_message(b"Z\x00\x00", False)


def test_unknown_frame_type_is_named() -> None:
    with pytest.raises(p.FrameError, match=r"unknown CopyData message type 'x'"):
        p.parse_frame(b"x123")


@pytest.mark.parametrize(
    "raw",
    [
        p.encode_begin(1, 2, 3)[:-1],
        p.encode_commit(1, 2, 3)[:5],
        p.encode_relation(1, "public", "t", "d", [p.Column(1, "id", 23, -1)])[:-3],
        p.encode_message("csn", b"tick 5", 9, False)[:-2],
        p.encode_stream_abort(1, 2)[:-1],
        b"R",
    ],
)
def test_truncated_messages_are_errors(raw: bytes) -> None:
    with pytest.raises(p.FrameError, match="corrupt"):
        p.parse_message(raw, False)


def test_stream_block_structure_is_checked() -> None:
    parser = p.PgOutputParser()
    parser.parse(p.encode_stream_start(5, True))
    # inside a block, changes carry their xid
    ins = parser.parse(p.encode_insert(1, ["x"], xid=6))
    assert isinstance(ins, p.Change) and ins.xid == 6
    with pytest.raises(p.FrameError, match="inside the open stream block of transaction 5"):
        parser.parse(p.encode_stream_start(7, True))
    parser.parse(p.encode_stream_stop())
    with pytest.raises(p.FrameError, match="Stream Stop without a Stream Start"):
        parser.parse(p.encode_stream_stop())


def test_status_update_layout() -> None:
    raw = p.encode_status_update(0x10, 0x20, 0x30, 99, True)
    assert raw[0:1] == b"r" and len(raw) == 34 and raw[-1] == 1
    assert int.from_bytes(raw[9:17], "big") == 0x20


def _fields(m: object) -> tuple[object, ...]:
    return (type(m), *(getattr(m, s) for s in type(m).__slots__))  # type: ignore[attr-defined]


@settings(max_examples=300)
@given(
    st.sampled_from("BC"),
    u64,
    u64,
    i64,
    u32,
    st.integers(0, 255),
    st.integers(-30, 0) | st.integers(0, 5),
    st.binary(max_size=8),
)
@example("B", 1, 2, 3, 4, 0, -1, b"")  # one byte short of a whole frame
@example("C", 1, 2, 3, 4, 0, -1, b"")
def test_txn_frame_fast_path_agrees_with_the_general_path(
    tag: str, a: int, b: int, t: int, xid: int, flags: int, cut: int, pad: bytes
) -> None:
    """A Begin or Commit frame, whole, cut short or padded: the same message, or None where the general path fails."""
    msg = p.encode_begin(a, t, xid) if tag == "B" else p.encode_commit(a, b, t, flags)
    frame = p.encode_xlogdata(b, a, t, msg)
    frame = frame[:cut] if cut < 0 else frame + pad[:cut]
    fast = p.parse_txn_frame(frame)
    try:
        general = p.parse_frame(frame)
        assert isinstance(general, p.XLogData)
        expected: tuple[int, object] | None = (general.data_start, p.parse_message(general.payload, False))
    except p.FrameError:
        expected = None
    if expected is None:
        assert fast is None
    else:
        assert fast is not None and fast[0] == expected[0] and _fields(fast[1]) == _fields(expected[1])


def test_txn_frame_fast_path_leaves_every_other_frame_to_the_general_path() -> None:
    assert p.parse_txn_frame(p.encode_xlogdata(1, 2, 3, p.encode_stream_stop())) is None
    assert p.parse_txn_frame(p.encode_keepalive(5, 6, False)) is None
    assert p.parse_txn_frame(b"") is None
