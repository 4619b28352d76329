"""NodeSender: a change's position (dataStart) must go forward in its transaction and stay before its commit.

Refused: a change whose dataStart is below the previous change's of the same
transaction, or beyond the transaction's commit LSN.  Legal: equal
dataStarts (one multi-insert gives several rows one LSN), other
transactions' changes in between at any position (streamed transactions
interleave), and Relation frames at 0/0 anywhere, also inside stream blocks
(docs/design.md section 9) -- they are not changes.  The property test checks the
rule against a brute-force oracle over random runs.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.core.errors import LsnOrderViolation, ProtocolError
from csnd.core.ids import Lsn, Xid
from csnd.decoder.change import DecodedRun
from csnd.reader.pgoutput import (
    Begin,
    Column,
    Commit,
    LogicalMessage,
    Relation,
    StreamCommit,
    StreamStart,
    StreamStop,
)
from csnd.sender import FinishedTxn, NodeSender

COMMIT = 0x1_0000


def _feed(ns: NodeSender, *items: tuple[int, object]) -> list[FinishedTxn]:
    out: list[FinishedTxn] = []
    for lsn, item in items:
        out.extend(ns.feed(lsn, item))  # type: ignore[arg-type]
        ns._check()
    return out


def _run(lsns: list[int], xid: int | None = None) -> tuple[int, DecodedRun]:
    return lsns[0], DecodedRun(xid, lsns, [f'"n": {i}' for i in range(len(lsns))])  # type: ignore[arg-type]


def _one(lsn: int, xid: int | None = None) -> tuple[int, DecodedRun]:
    """A TRUNCATE of one table, as the decoder pool hands it on."""
    return lsn, DecodedRun(xid, [Lsn(lsn)], ['"op": "truncate"'], "truncate")  # type: ignore[arg-type]


def _begin(xid: int, final: int = COMMIT) -> tuple[int, Begin]:
    return 0x100, Begin(final, 5, xid)  # type: ignore[arg-type]


def _commit(final: int = COMMIT) -> tuple[int, Commit]:
    return final + 0x30, Commit(0, final, final + 0x30, 5)  # type: ignore[arg-type]


def _relation() -> tuple[int, Relation]:
    return 0, Relation(None, 16384, "public", "t", "d", (Column(1, "id", 23, -1),))


def test_equal_positions_are_legal() -> None:
    ns = NodeSender("dn1", "single")
    out = _feed(ns, _begin(745), _run([0x200, 0x200, 0x200]), _run([0x200, 0x300]), _one(0x300), _commit())
    assert [lsn for _, lsn, _ in out[0].changes] == [0x200, 0x200, 0x200, 0x200, 0x300, 0x300]


@pytest.mark.parametrize(
    "items",
    [
        [_run([0x300, 0x200])],  # inside one run
        [_run([0x200, 0x300, 0x280, 0x400])],
        [_run([0x300]), _run([0x2FF])],  # across runs
        [_run([0x300]), _one(0x200)],  # a truncate after a row change
        [_one(0x300), _run([0x200, 0x400])],
    ],
)
def test_a_position_going_backwards_is_refused(items: list[tuple[int, object]]) -> None:
    ns = NodeSender("dn1", "single")
    with pytest.raises(LsnOrderViolation) as ei:
        _feed(ns, _begin(745), *items)
    err = ei.value
    assert isinstance(err, ProtocolError)
    msg = str(err)
    assert msg.startswith("node dn1: change at 0/2") and "in transaction 745 follows a change at 0/" in msg
    assert "never goes backwards" in msg and err.xid == 745 and err.lsn is not None and err.lsn < 0x300


def test_a_change_beyond_its_commit_is_refused() -> None:
    """The issue's case: a change at F80001/DC578 inside a transaction committed at 1/134870."""
    ns = NodeSender("dn1", "single")
    with pytest.raises(LsnOrderViolation) as ei:
        _feed(ns, _begin(745, 0x1_0013_4870), _run([0x1_0013_0000, 0xF8_0001_000D_C578]))
    assert str(ei.value) == (
        "node dn1: change at F80001/DC578 in transaction 745 lies beyond the transaction's commit at "
        "1/134870; the stream is corrupt"
    )
    assert (ei.value.lsn, ei.value.xid) == (0xF8_0001_000D_C578, 745)


def test_a_streamed_change_beyond_its_commit_is_refused_at_the_stream_commit() -> None:
    ns = NodeSender("dn1", "single")
    _feed(ns, (0x100, StreamStart(746, True)), _run([0x200, 0x2_0000], 747), (0, StreamStop()))  # type: ignore[arg-type]
    with pytest.raises(
        LsnOrderViolation, match=r"change at 0/20000 in transaction 746 lies beyond .* 0/10000"
    ):
        _feed(ns, (COMMIT + 0x30, StreamCommit(746, 0, COMMIT, COMMIT + 0x30, 5)))  # type: ignore[arg-type]


def test_streamed_changes_going_backwards_name_the_subtransaction() -> None:
    ns = NodeSender("dn1", "single")
    _feed(ns, (0x100, StreamStart(746, True)), _run([0x500], 746), (0, StreamStop()))  # type: ignore[arg-type]
    with pytest.raises(LsnOrderViolation, match=r"change at 0/400 in transaction 746 \(subtransaction 747\)"):
        _feed(ns, (0x100, StreamStart(746, False)), _run([0x400], 747))  # type: ignore[arg-type]


def test_interleaved_transactions_and_relations_at_zero_are_legal() -> None:
    """Streamed blocks interleave with other transactions; Relation frames sit at 0/0, also in blocks."""
    ns = NodeSender("dn1", "single")
    out = _feed(
        ns,
        (0x100, StreamStart(746, True)),  # type: ignore[arg-type]
        _relation(),
        _run([0x600, 0x700], 746),
        (0, StreamStop()),
        _begin(745, 0x900),  # a transaction that began earlier, sent whole at its commit
        _relation(),
        _run([0x300, 0x800]),
        (0x850, LogicalMessage(None, False, 0x850, "other", b"x")),  # type: ignore[arg-type]
        _commit(0x900),
        (0x100, StreamStart(746, False)),  # type: ignore[arg-type]
        _relation(),
        _run([0x700, 0xA00], 748),
        (0, StreamStop()),
        (0xB30, StreamCommit(746, 0, 0xB00, 0xB30, 5)),  # type: ignore[arg-type]
    )
    assert [t.xid for t in out] == [745, 746]
    assert [lsn for _, lsn, _ in out[1].changes] == [0x600, 0x700, 0x700, 0xA00]


@given(
    st.lists(st.integers(0x100, 0x1100), min_size=1, max_size=12),
    st.lists(st.integers(1, 4), min_size=1, max_size=12),
    st.booleans(),
)
def test_positions_against_the_oracle(lsns: list[int], cuts: list[int], streamed: bool) -> None:
    """Random changes cut into random runs: refused exactly when the oracle says the order breaks."""
    bound = 0x1000
    ok = all(a <= b for a, b in itertools.pairwise(lsns)) and max(lsns) <= bound
    runs, i = [], 0
    for n in cuts * len(lsns):
        if i >= len(lsns):
            break
        runs.append(lsns[i : i + n])
        i += n
    ns = NodeSender("dn1", "single")
    xid = 746 if streamed else None
    head = [(0x100, StreamStart(Xid(746), True))] if streamed else [_begin(745, bound)]
    tail = (
        [(0, StreamStop()), (bound + 0x30, StreamCommit(Xid(746), 0, Lsn(bound), Lsn(bound + 0x30), 5))]
        if streamed
        else [_commit(bound)]
    )
    items = [*head, *(_run(r, xid) for r in runs), *tail]
    if ok:
        (txn,) = _feed(ns, *items)
        assert [lsn for _, lsn, _ in txn.changes] == lsns
    else:
        with pytest.raises(LsnOrderViolation):
            _feed(ns, *items)
