"""NodeSender: every protocol error, one test each, and hand-picked semantics cases.

Each error test asserts that the message names the node and the transaction
(xid or gid) -- what an operator needs to find the spot in the WAL.
"""

from __future__ import annotations

import pickle

import pytest

from csnd.core.errors import (
    ConfigError,
    CsndError,
    InternalError,
    MalformedMarker,
    ProtocolError,
    TruncatedStream,
)
from csnd.core.ids import Csn, Lsn, Xid
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.reader.pgoutput import (
    Begin,
    Change,
    Commit,
    Keepalive,
    LogicalMessage,
    Origin,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    TypeMsg,
)
from csnd.sender import FinishedTxn, NodeSender

LSN = Lsn(0x16B3000)


def _m(text: str, transactional: bool = False, xid: int | None = None, lsn: int = LSN) -> LogicalMessage:
    return LogicalMessage(
        None if xid is None else Xid(xid), transactional, Lsn(lsn), "csn", text.encode("ascii")
    )


def _ch(lsn: int, xid: int | None = None, body: str = '"op": "insert"') -> DecodedRun:
    return DecodedRun(None if xid is None else Xid(xid), [Lsn(lsn)], [body], "insert")


def _feed(ns: NodeSender, *items: DecodedItem) -> list[FinishedTxn]:
    out: list[FinishedTxn] = []
    for item in items:
        lsn = getattr(item, "lsn", 0) or getattr(item, "end_lsn", 0) or LSN
        out.extend(ns.feed(Lsn(lsn), item))
        ns._check()
    return out


def _plain(xid: int, commit_lsn: int, *middle: DecodedItem) -> list[DecodedItem]:
    return [Begin(Lsn(commit_lsn), 5, Xid(xid)), *middle, Commit(0, Lsn(commit_lsn), Lsn(commit_lsn + 88), 5)]


def _raises(
    ns: NodeSender, *items: DecodedItem, words: tuple[str, ...], cls: type[CsndError] = ProtocolError
) -> CsndError:
    with pytest.raises(cls) as ei:
        _feed(ns, *items)
    msg = str(ei.value)
    assert msg.startswith(f"node {ns.node}: "), msg
    for w in words:
        assert w in msg, (w, msg)
    err = pickle.loads(pickle.dumps(ei.value))
    assert str(err) == msg
    return ei.value


# --- the end of the stream ---------------------------------------------------------------


def test_stream_ends_inside_a_transaction() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, Begin(Lsn(0x16B3748), 5, Xid(745)), _ch(0x16B3700))
    with pytest.raises(TruncatedStream) as ei:
        ns.finish()
    msg = str(ei.value)
    assert msg.startswith("node dn2: stream ended inside transaction 745") and "begun at 0/16B3000" in msg
    assert ei.value.xid == 745


def test_stream_ends_inside_a_stream_block() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, StreamStart(Xid(746), True), _ch(0x16B3700, 746))
    with pytest.raises(
        TruncatedStream, match=r"node dn2: stream ended inside a stream block of transaction 746"
    ):
        ns.finish()


def test_stream_ends_with_a_streamed_transaction_open() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, StreamStart(Xid(746), True), _ch(0x16B3700, 746), StreamStop())
    _feed(ns, StreamStart(Xid(747), True), _ch(0x16B3800, 747), StreamStop())
    with pytest.raises(TruncatedStream) as ei:
        ns.finish()
    msg = str(ei.value)
    assert "streamed transaction 746" in msg and "1 more" in msg and "since 0/16B3000" in msg


def test_stream_ends_with_a_committing_transaction_open() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, _m("committing g-17 41", lsn=0x16B3900), _m("committing g-18 41"))
    _feed(ns, *_plain(750, 0x16B4000, _ch(0x16B3F00), _m("commit g-18 43", True)))
    with pytest.raises(TruncatedStream) as ei:
        ns.finish()
    msg = str(ei.value)
    assert msg.startswith("node dn2: stream ended with global transaction g-17 committing")
    assert "committing csn 41" in msg and "0/16B3900" in msg and "1 committed transactions wait" in msg


def test_clean_end() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, _m("committing g-1 1"), *_plain(745, 0x16B4000, _ch(0x16B3F00), _m("commit g-1 2", True)))
    ns.finish()


# --- commit markers --------------------------------------------------------------------


def test_committed_changes_without_a_commit_marker() -> None:
    ns = NodeSender("dn2", "gtm")
    err = _raises(
        ns,
        *_plain(745, 0x16B3748, _ch(0x16B3700)),
        words=("transaction 745", "0/16B3748", "no commit marker", "1 changes"),
    )
    assert err.xid == 745 and err.lsn == 0x16B3748


def test_streamed_changes_without_a_commit_marker() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, StreamStart(Xid(745), True), _ch(0x16B3700, 745), StreamStop())
    _raises(
        ns,
        StreamCommit(Xid(745), 0, Lsn(0x16B3748), Lsn(0x16B37A0), 5),
        words=("transaction 745", "no commit marker"),
    )


def test_commit_marker_rolled_back_with_its_savepoint() -> None:
    """A marker in a rolled-back subtransaction does not count."""
    ns = NodeSender("dn2", "gtm")
    _feed(ns, StreamStart(Xid(745), True), _ch(0x16B3700, 745), _m("commit g-1 5", True, 746), StreamStop())
    _feed(ns, StreamAbort(Xid(745), Xid(746)))
    _raises(
        ns,
        StreamCommit(Xid(745), 0, Lsn(0x16B3748), Lsn(0x16B37A0), 5),
        words=("transaction 745", "no commit marker"),
    )


def test_empty_transaction_without_marker_is_skipped() -> None:
    ns = NodeSender("dn2", "gtm")
    other = LogicalMessage(None, True, Lsn(LSN), "app", b"x")
    assert _feed(ns, *_plain(745, 0x16B3748, other)) == []
    assert ns.statistics().skipped_empty == 1
    # and one whose changes were all rolled back
    _feed(ns, StreamStart(Xid(746), True), _ch(0x16B3800, 747), StreamStop(), StreamAbort(Xid(746), Xid(747)))
    assert _feed(ns, StreamCommit(Xid(746), 0, Lsn(0x16B3900), Lsn(0x16B3958), 5)) == []
    assert ns.confirmable_lsn == 0x16B3958
    ns.finish()


def test_empty_transaction_with_marker_is_released() -> None:
    """A distributed txn's part on a node where every change rolled back still counts."""
    ns = NodeSender("dn2", "gtm")
    _feed(ns, _m("committing g-1 9"))
    (t,) = _feed(ns, *_plain(745, 0x16B3748, _m("commit g-1 10", True)))
    assert (t.csn, t.gid, t.xid, t.n_changes, list(t.changes)) == (10, "g-1", 745, 0, [])


def test_commit_csn_not_above_committing_csn() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, _m("committing g-17 41"))
    err = _raises(
        ns,
        *_plain(745, 0x16B3748, _ch(0x16B3700), _m("commit g-17 41", True)),
        words=("global transaction g-17", "csn 41", "committing csn 41"),
    )
    assert err.xid == 745


def test_csn_going_backwards() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, *_plain(745, 0x16B3748, _ch(0x16B3700), _m("commit g-1 50", True)))
    _raises(
        ns,
        *_plain(746, 0x16B3848, _ch(0x16B3800), _m("commit g-2 49", True)),
        words=("global transaction g-2", "csn 49", "csn 50 was already released", "backwards"),
    )


def test_csn_below_a_tick() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, _m("tick 100"))
    _raises(
        ns,
        *_plain(745, 0x16B3748, _ch(0x16B3700), _m("commit g-1 99", True)),
        words=("global transaction g-1", "csn 99", "watermark 100"),
    )


def test_duplicate_gid() -> None:
    ns = NodeSender("dn2", "gtm")
    _feed(ns, _m("committing g-17 41"))
    _raises(ns, _m("committing g-17 42"), words=("g-17", "duplicate committing marker"))


def test_abort_for_unknown_gid() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(ns, _m("abort g-17"), words=("abort marker", "g-17", "no committing marker was seen"))


def test_second_commit_marker() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        _m("commit g-1 5", True),
        _m("commit g-2 6", True),
        words=("transaction 745", "second commit marker", "g-2", "g-1"),
    )


def test_cid_going_down() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        _m("cid 3", True),
        _m("cid 2", True),
        words=("transaction 745", "cid marker 2 after cid 3"),
    )


@pytest.mark.parametrize(
    "text",
    [
        "committing g-1",
        "commit g-1 x",
        "tick",
        "tick -5",
        "cid 1 2",
        "abort",
        "abort  ",
        "hello 1",
        "commit  5",
        "",
    ],
)
def test_malformed_marker(text: str) -> None:
    ns = NodeSender("dn2", "gtm")
    err = _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        _m(text, True),
        words=("malformed csn marker",),
        cls=MalformedMarker,
    )
    assert repr(text.encode())[:-1] in str(err)  # the content is named


def test_non_ascii_marker() -> None:
    ns = NodeSender("dn2", "gtm")
    msg = LogicalMessage(None, False, LSN, "csn", "tick 5é".encode())
    _raises(ns, msg, words=("malformed csn marker",), cls=MalformedMarker)


@pytest.mark.parametrize(
    ("text", "transactional"),
    [
        ("committing g-1 5", True),
        ("abort g-1", True),
        ("tick 5", True),
        ("commit g-1 5", False),
        ("cid 1", False),
    ],
)
def test_marker_with_wrong_transactionality(text: str, transactional: bool) -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns, Begin(Lsn(0x16B3748), 5, Xid(745)), _m(text, transactional), words=(repr(text), "transactional")
    )


def test_transactional_marker_outside_a_transaction() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(ns, _m("cid 4", True, None), words=("'cid 4'", "outside any transaction"))


def test_markers_in_single_node_mode() -> None:
    ns = NodeSender("pg1", "single")
    _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        _m("commit g-1 5", True),
        words=("single-node mode", "gtm mode", "745"),
    )


# --- stream structure ------------------------------------------------------------------


def test_change_outside_any_transaction() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(ns, _ch(0x16B3700), words=("0/16B3700", "outside any transaction"))


def test_change_of_a_subtransaction_outside_a_block() -> None:
    ns = NodeSender("dn2", "gtm")
    err = _raises(ns, _ch(0x16B3700, 746), words=("subtransaction 746", "outside any stream block"))
    assert err.xid == 746


def test_change_without_xid_inside_a_block() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(ns, StreamStart(Xid(745), True), _ch(0x16B3700), words=("stream block of transaction 745",))


def test_commit_without_begin() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns, Commit(0, Lsn(0x16B3748), Lsn(0x16B37A0), 5), words=("Commit", "without a Begin", "0/16B3748")
    )


def test_begin_inside_begin() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        Begin(Lsn(0x16B3848), 5, Xid(746)),
        words=("transaction 746", "transaction 745"),
    )


def test_commit_lsn_differs_from_begin() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        Commit(0, Lsn(0x16B3750), Lsn(0x16B37A0), 5),
        words=("transaction 745", "0/16B3750", "0/16B3748"),
    )


def test_stream_commit_of_unknown_transaction() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        StreamCommit(Xid(745), 0, Lsn(0x16B3748), Lsn(0x16B37A0), 5),
        words=("transaction 745", "never streamed"),
    )


def test_stream_block_continuing_an_unseen_transaction() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(ns, StreamStart(Xid(745), False), words=("transaction 745", "first block was never seen"))


def test_first_stream_block_twice() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        StreamStart(Xid(745), True),
        StreamStop(),
        StreamStart(Xid(745), True),
        words=("transaction 745", "already streaming"),
    )


def test_stream_start_inside_a_transaction() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        Begin(Lsn(0x16B3748), 5, Xid(745)),
        StreamStart(Xid(746), True),
        words=("transaction 746", "transaction 745"),
    )


def test_stream_stop_without_start() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(ns, StreamStop(), words=("Stream Stop without a Stream Start",))


def test_stream_commit_inside_a_block() -> None:
    ns = NodeSender("dn2", "gtm")
    _raises(
        ns,
        StreamStart(Xid(745), True),
        StreamCommit(Xid(746), 0, Lsn(0x16B3748), Lsn(0x16B37A0), 5),
        words=("Stream Commit of transaction 746", "block of transaction 745"),
    )


def test_undecoded_change_is_refused() -> None:
    ns = NodeSender("dn2", "gtm")
    raw = Change("I", None, 1, b"N")  # (what the decoder pool turns into a DecodedRun: mypy refuses it too)
    _raises(ns, raw, words=("unexpected Change",), cls=InternalError)  # type: ignore[arg-type]


def test_unknown_mode() -> None:
    with pytest.raises(ConfigError, match="unknown csn mode 'lamport'"):
        NodeSender("dn1", "lamport")


# --- semantics ---------------------------------------------------------------------------


def test_ignored_items() -> None:
    ns = NodeSender("dn1", "gtm")
    assert (
        _feed(
            ns,
            Origin(Lsn(LSN), "o"),
            TypeMsg(None, 1, "s", "t"),
            LogicalMessage(None, False, Lsn(LSN), "app", b""),
        )
        == []
    )


def test_cid_and_subtransactions_in_a_streamed_txn() -> None:
    ns = NodeSender("dn1", "gtm")
    out = _feed(
        ns,
        StreamStart(Xid(745), True),
        _ch(0x100, 745, "a"),
        _m("cid 1", True, 745),
        _ch(0x110, 746, "b"),  # savepoint 746, rolled back below
        _ch(0x120, 747, "c"),
        StreamStop(),
        _m("committing g-745 10"),
        _m("committing g-800 10"),
        Begin(Lsn(0x300), 5, Xid(800)),  # a small txn in between: committed first, larger csn
        _ch(0x200, None, "x"),
        _m("commit g-800 12", True),
        Commit(0, Lsn(0x300), Lsn(0x358), 5),
        StreamAbort(Xid(745), Xid(746)),
    )
    assert out == []
    out = _feed(
        ns,
        StreamStart(Xid(745), False),
        _m("cid 2", True, 745),
        _ch(0x400, 745, "d"),
        _m("commit g-745 11", True, 745),
        StreamStop(),
        StreamCommit(Xid(745), 0, Lsn(0x500), Lsn(0x558), 7),
    )
    t, t800 = out
    assert t800.gid == "g-800" and list(t800.changes) == [(0, 0x200, "x")]
    assert (t.csn, t.xid, t.commit_lsn, t.end_lsn, t.commit_time, t.n_changes) == (
        11,
        745,
        0x500,
        0x558,
        7,
        3,
    )
    assert list(t.changes) == [(0, 0x100, "a"), (1, 0x120, "c"), (2, 0x400, "d")]


def test_out_of_order_commits_and_confirmable_lsn() -> None:
    """The slot may not pass a waiting commit, nor an unreleased committing marker."""
    ns = NodeSender("dn1", "gtm")
    _feed(ns, _m("committing g-1 10", lsn=0x100), _m("committing g-2 10", lsn=0x200))
    assert ns.watermark == 10 and ns.confirmable_lsn == 0
    assert _feed(ns, *_plain(2, 0x300, _ch(0x250), _m("commit g-2 12", True))) == []
    assert ns.confirmable_lsn == 0  # g-2 waits for g-1; g-1's committing marker is before 0x300
    _feed(ns, Keepalive(Lsn(0x400), 0, False))
    _feed(ns, _m("committing g-3 12", lsn=0x410))
    assert ns.confirmable_lsn == 0
    out = _feed(ns, *_plain(1, 0x500, _ch(0x450), _m("commit g-1 11", True)))
    assert [t.csn for t in out] == [11, 12]
    # g-3 is still committing: its marker arrived when the stream had reached 0x400
    assert ns.confirmable_lsn == 0x400
    assert ns.watermark == 12  # min(tick 12, committing 12), and the last released csn
    _feed(ns, _m("abort g-3"))
    assert ns.confirmable_lsn == 0x500 + 88
    assert ns.watermark == 12
    ns.finish()


def test_single_node_mode() -> None:
    ns = NodeSender("pg", "single")
    assert ns.watermark is None
    _feed(ns, Keepalive(Lsn(0x100), 0, False))
    assert ns.watermark == 0xFF and ns.confirmable_lsn == 0x100
    (t,) = _feed(ns, *_plain(745, 0x200, _ch(0x150)))
    assert (t.csn, t.gid, t.xid) == (0x200, None, 745)
    assert ns.watermark == 0x258 - 1 and ns.confirmable_lsn == 0x258  # end LSN 0x200 + 88
    # a keepalive while a transaction is open says nothing
    _feed(ns, StreamStart(Xid(746), True), _ch(0x300, 746), StreamStop(), Keepalive(Lsn(0x1000), 0, False))
    assert ns.watermark == 0x257 and ns.confirmable_lsn == 0x258
    (t,) = _feed(ns, StreamCommit(Xid(746), 0, Lsn(0x400), Lsn(0x458), 5))
    assert t.csn == 0x400
    ns.finish()


def test_resume_drops_durable_transactions() -> None:
    """Restarted from a confirmed position: re-sent, already durable transactions are dropped."""
    ns = NodeSender("dn1", "gtm", resume_csn=Csn(20))
    _feed(ns, _m("abort g-0"))  # its committing lay before the restart position
    _feed(ns, _m("committing g-1 18"), _m("committing g-2 18"))
    assert _feed(ns, *_plain(2, 0x300, _ch(0x250), _m("commit g-2 21", True))) == []
    assert _feed(ns, *_plain(1, 0x400, _ch(0x350), _m("commit g-1 19", True))) != []
    assert ns.statistics().dropped_resumed == 1
    assert _feed(ns, *_plain(3, 0x500, _ch(0x450), _m("commit g-3 15", True))) == []  # no committing seen
    ns.finish()


def test_spilled_transaction_released_in_order(tmp_path: object) -> None:
    ns = NodeSender("dn1", "gtm", spill_bytes=1000, spill_dir=str(tmp_path))
    items: list[DecodedItem] = [_m("committing g-1 1"), Begin(Lsn(0x100000), 5, Xid(7))]
    items += [_ch(0x1000 + i, None, f"row {i} " + "z" * 30) for i in range(500)]
    items += [_m("commit g-1 2", True), Commit(0, Lsn(0x100000), Lsn(0x100058), 5)]
    _feed(ns, *items[:-2])
    st = ns.statistics()
    assert (st.open_txns, st.committing, st.buffered_bytes) == (1, 1, 0)  # all on disk
    (t,) = _feed(ns, *items[-2:])
    st = ns.statistics()
    assert st.spilled_txns == 1 and st.spilled_bytes > 500 * 30
    assert (st.open_txns, st.committing, st.released, st.spilled_txns) == (0, 0, 1, 1)
    assert [c[1] for c in t.changes] == [0x1000 + i for i in range(500)]
