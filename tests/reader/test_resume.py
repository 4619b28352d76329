"""ResumeFilter: a stream cut anywhere and re-sent from the confirmed position
reads exactly like the stream that was never cut (brute-force oracle)."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.ids import Lsn, Xid
from csnd.reader import pgoutput as p
from csnd.reader.resume import Item, ResumeFilter
from tests.fixtures.witness import assemble

REL = p.Column(1, "id", 25, -1)


def _item(lsn: int, raw: bytes, in_stream: bool) -> Item:
    payload = p.encode_xlogdata(lsn, lsn, 0, raw)
    return (Lsn(lsn), p.parse_message(raw, in_stream), payload)


@st.composite
def streams(draw: Any) -> tuple[list[Item], list[tuple[int, int]]]:
    """A walsender's output: (items, [(item index after commit, end lsn)])."""
    n = draw(st.integers(1, 6))
    kinds = draw(st.lists(st.sampled_from(["plain", "streamed", "nontx"]), min_size=n, max_size=n))
    lsn = 100
    items: list[Item] = [_item(0, p.encode_relation(1, "public", "t", "d", [REL]), False)]
    commits: list[tuple[int, int]] = []
    xid = 500
    open_streams: list[tuple[int, list[int]]] = []  # streamed txns whose blocks are being sent
    for kind in kinds:
        xid += 10
        if kind == "nontx":
            lsn += 8
            items.append(_item(lsn, p.encode_message("app", b"m%d" % lsn, lsn, False), False))
            continue
        nchanges = draw(st.integers(1, 5))
        change_lsns: list[int] = []
        for _ in range(nchanges):
            if not change_lsns or draw(st.booleans()):
                lsn += 8  # sometimes several changes share one LSN (multi-insert)
            change_lsns.append(lsn)
        if kind == "plain":
            items.append(_item(change_lsns[0], p.encode_begin(lsn + 8, 0, xid), False))
            for c in change_lsns:
                items.append(_item(c, p.encode_insert(1, [f"{xid}:{c}"]), False))
            lsn += 16
            items.append(_item(lsn, p.encode_commit(lsn - 8, lsn, 0), False))
            commits.append((len(items), lsn))
        else:
            blocks = draw(st.integers(1, 3))
            per = max(1, len(change_lsns) // blocks)
            first = True
            chunks = [change_lsns[i : i + per] for i in range(0, len(change_lsns), per)]
            # Empty blocks too: pgoutput streams a block whose changes it then filters out
            # (tables outside the publication), as the first, a middle or the only block.
            for k in sorted(draw(st.lists(st.integers(0, len(chunks)), max_size=2)), reverse=True):
                chunks.insert(k, [])
            if draw(st.integers(0, 9)) == 0:
                chunks = [[]]  # (every change filtered out)
            for chunk in chunks:
                items.append(_item(0, p.encode_stream_start(xid, first), False))
                first = False
                for c in chunk:
                    sub = xid + (1 if draw(st.booleans()) else 0)
                    items.append(_item(c, p.encode_insert(1, [f"{xid}:{c}"], xid=sub), True))
                items.append(_item(0, p.encode_stream_stop(), False))
            if draw(st.booleans()):
                lsn += 8
                items.append(_item(lsn, p.encode_stream_abort(xid, xid + 1), False))
            lsn += 16
            items.append(_item(lsn, p.encode_stream_commit(xid, lsn - 8, lsn, 0), False))
            commits.append((len(items), lsn))
    del open_streams
    return items, commits


def _resend(items: list[Item], confirmed: int) -> list[Item]:
    """What the server sends on a new connection starting at `confirmed`."""
    out: list[Item] = [items[0]]  # the relation, as a new walsender sends it again
    txn_end: dict[int, int] = {}
    xid: int | None = None
    for _lsn, m, _ in items:
        if isinstance(m, p.Begin):
            xid = m.xid
        elif isinstance(m, p.Commit):
            assert xid is not None
            txn_end[xid] = m.end_lsn
        elif isinstance(m, p.StreamCommit):
            txn_end[m.xid] = m.end_lsn
    cur: int | None = None
    for item in items[1:]:
        _, m, _ = item
        if isinstance(m, (p.Begin, p.StreamStart, p.StreamAbort, p.StreamCommit)):
            cur = m.xid
        if isinstance(m, p.LogicalMessage) and not m.transactional:
            if m.lsn > confirmed:
                out.append(item)
            continue
        assert cur is not None
        if txn_end[cur] > confirmed:
            out.append(item)
    return out


def _as_runs(items: list[Item], data: Any) -> list[Item]:
    """`items` as a live reader with runs hands them on: consecutive plain row changes as
    `ChangeFrames`, cut where the draw says (a pause of the socket, the run bound)."""
    out: list[Item] = []
    run: list[Item] = []

    def end_run() -> None:
        if run:
            blob = b"".join(struct.pack("!I", len(payload)) + payload for _, _, payload in run)
            lsns = [lsn for lsn, _, _ in run]
            out.append((lsns[0], p.ChangeFrames(blob, False, None, lsns), blob))
            run.clear()

    for item in items:
        m = item[1]
        if type(m) is p.Change and m.xid is None:
            if run and data.draw(st.integers(0, 3)) == 0:
                end_run()
            run.append(item)
            continue
        end_run()
        out.append(item)
    end_run()
    return _as_whole(out, data)


def _as_whole(items: list[Item], data: Any) -> list[Item]:
    """Begin, one run (or none) and Commit, one after another, as a `TxnRun` of one where the draw says."""
    out: list[Item] = []
    i = 0
    while i < len(items):
        m = items[i][1]
        if type(m) is p.Begin:
            k = i + 1
            run = items[k][1] if k < len(items) and type(items[k][1]) is p.ChangeFrames else None
            k += run is not None
            if k < len(items) and type(items[k][1]) is p.Commit and data.draw(st.booleans()):
                commit_at, commit = items[k][0], items[k][1]
                assert type(commit) is p.Commit and (run is None or type(run) is p.ChangeFrames)
                blob, lsns = (None, None) if run is None else (run.blob, run.lsns)
                whole = p.scanned_txn(items[i][0], m, blob, lsns, commit_at, commit)
                out.append((items[i][0], p.TxnRun([whole]), b""))
                i = k + 1
                continue
        out.append(items[i])
        i += 1
    return _as_txn_runs(out, data)


def _as_txn_runs(items: list[Item], data: Any) -> list[Item]:
    """Consecutive whole transactions as one `TxnRun` (the compiled loop's batch), cut where the draw says."""
    out: list[Item] = []
    for item in items:
        m = item[1]
        last = out[-1][1] if out else None
        if type(m) is p.TxnRun and type(last) is p.TxnRun and data.draw(st.booleans()):
            last.txns += m.txns
        else:
            out.append(item)
    return out


def _deliver(f: ResumeFilter, items: list[Item]) -> list[tuple[int, Any]]:
    out: list[tuple[int, Any]] = []
    for item in items:
        for lsn, m, _ in f.feed(item):
            if type(m) is p.TxnRun:
                events: list[tuple[int, Any]] = [e for txn in m.frames() for e in txn.events()]
            else:
                events = [(lsn, m)]
            for lsn_e, e in events:
                if type(e) is p.ChangeFrames:  # (back to single changes, for the oracle)
                    for lsn_i, kind, xid, relid, tuple_data in p.iter_change_frames(e.blob, False, e.head):
                        out.append((lsn_i, p.Change(kind, xid, relid, tuple_data)))
                else:
                    out.append((lsn_e, e))
    return out


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_cut_and_resend_is_invisible(stream: tuple[list[Item], list[tuple[int, int]]], data: Any) -> None:
    _check_cut_and_resend(stream, data, runs=False)


@settings(max_examples=300, deadline=None)
@given(streams(), st.data())
def test_cut_and_resend_is_invisible_when_changes_come_in_runs(
    stream: tuple[list[Item], list[tuple[int, int]]], data: Any
) -> None:
    """A run is judged change by change: re-sent in runs cut elsewhere, only its new tail passes.

    And a whole transaction, or a batch of them (a `TxnRun` either way), passes whole only if
    it is new.
    """
    _check_cut_and_resend(stream, data, runs=True)


def _check_cut_and_resend(stream: tuple[list[Item], list[tuple[int, int]]], data: Any, runs: bool) -> None:
    items, commits = stream
    expected = assemble([(lsn, m) for lsn, m, _ in items])
    f = ResumeFilter()
    delivered: list[tuple[int, Any]] = []
    pos = 0  # how far the first connection got
    confirmed = 0
    remaining = items
    for _ in range(data.draw(st.integers(1, 3))):
        cut = data.draw(st.integers(0, len(remaining)))
        delivered += _deliver(f, _as_runs(remaining[:cut], data) if runs else remaining[:cut])
        pos += cut
        # confirm some durable position: the end of a transaction fully delivered so far
        done = [end for idx, end in commits if idx <= pos or idx <= cut]
        done_now = [end for end in done if end >= confirmed]
        if done_now and data.draw(st.booleans()):
            confirmed = data.draw(st.sampled_from(done_now))
        confirm_late = data.draw(st.booleans())
        if not confirm_late:
            f.confirmed(Lsn(confirmed))
        delivered += [(lsn, m) for lsn, m, _ in f.reconnected(Lsn(confirmed))]
        if confirm_late:
            f.confirmed(Lsn(confirmed))  # lands after the new connection started
        remaining = _resend(items, confirmed)
        pos = 0
        commits = [
            (i, end)
            for i, (lsn, m, _) in enumerate(remaining, 1)
            for end in [getattr(m, "end_lsn", None)]
            if end is not None and isinstance(m, (p.Commit, p.StreamCommit))
        ]
    delivered += _deliver(f, _as_runs(remaining, data) if runs else remaining)
    got = assemble(delivered)
    assert got == expected
    _check_blocks(delivered)


def _check_blocks(delivered: list[tuple[int, Any]]) -> None:
    """The rules the sender holds downstream to (csnd/sender/node.py): Begin and Commit alternate; a
    transaction's first delivered block says first_segment and only that one; blocks do not
    nest; a Stream Commit follows a block of its transaction."""
    open_: set[int] = set()  # transactions with a delivered block, not yet ended
    block: int | None = None
    txn: int | None = None  # the open non-streamed transaction: a Begin comes only outside one
    for _lsn, m in delivered:
        if isinstance(m, p.Begin):
            assert txn is None, f"Begin of {m.xid} inside transaction {txn} (delivered twice?)"
            txn = m.xid
        elif isinstance(m, p.Commit):
            assert txn is not None, "Commit without a Begin"
            txn = None
        elif isinstance(m, p.StreamStart):
            assert block is None, "nested stream blocks"
            assert m.first_segment == (m.xid not in open_), (m.xid, m.first_segment)
            open_.add(m.xid)
            block = m.xid
        elif isinstance(m, p.StreamStop):
            assert block is not None, "Stream Stop outside a block"
            block = None
        elif isinstance(m, p.StreamCommit):
            assert block is None and m.xid in open_, f"Stream Commit of {m.xid}, never started downstream"
            open_.discard(m.xid)
        elif isinstance(m, p.StreamAbort) and m.subxid == m.xid:
            open_.discard(m.xid)


def _plain_txn(xid: int, lsn: int) -> tuple[list[Item], int]:
    """Begin, one insert, Commit; and the commit's end LSN."""
    items = [
        _item(lsn, p.encode_begin(lsn + 8, 0, xid), False),
        _item(lsn, p.encode_insert(1, [str(xid)]), False),
        _item(lsn + 8, p.encode_commit(lsn, lsn + 8, 0), False),
    ]
    return items, lsn + 8


def test_confirmed_transactions_are_forgotten_so_memory_stays_bounded() -> None:
    f = ResumeFilter()
    f.feed(_item(0, p.encode_relation(1, "public", "t", "d", [REL]), False))
    ends = []
    for i in range(1000):
        items, end = _plain_txn(1000 + i, 100 + 16 * i)
        for item in items:
            assert f.feed(item) == [item]
        ends.append(end)
        if i % 100 == 99:
            f.confirmed(Lsn(ends[i - 50]))  # (from the durable side: taken at the next commit)
    # forgotten at the commits after each confirm: all up to the one before the last
    assert sorted(f.completed.values()) == [e for e in ends if e > ends[849]]
    f.confirmed(Lsn(ends[-1]))
    items, _ = _plain_txn(5000, 100 + 16 * 1000)
    for item in items:
        f.feed(item)
    assert len(f.completed) == 1


def _scanned(xid: int, lsn: int) -> p.ScannedTxn:
    """A one-insert transaction as the compiled loop reads it (`_plain_txn`'s, scanned)."""
    payload = p.encode_xlogdata(lsn, lsn, 0, p.encode_insert(1, [str(xid)]))
    blob = struct.pack("!I", len(payload)) + payload
    return p.ScannedTxn(
        Lsn(lsn),
        Lsn(lsn + 8),
        0,
        Xid(xid),
        blob,
        [Lsn(lsn)],
        Lsn(lsn + 8),
        0,
        Lsn(lsn + 8),
        Lsn(lsn + 16),
        0,
    )


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 60), st.data())
def test_batches_of_whole_transactions_re_sent_after_reconnects_come_once_each(n: int, data: Any) -> None:
    """`TxnRun`s of many plain transactions, cut anywhere and re-sent after reconnects in other cuts.

    Each new connection re-sends what ends after the confirmed position.  Every
    transaction comes once, in order, as when each comes as a `TxnRun` of its own,
    and the filter remembers little more than it does then.
    """
    txns = [_scanned(1000 + i, 0x100 + 0x20 * i) for i in range(n)]
    connections: list[list[int]] = []  # each connection's batch sizes
    confirms: list[int] = []  # transactions durable after each connection
    start = 0
    for _ in range(data.draw(st.integers(1, 4))):
        stop = data.draw(st.integers(start, n))
        sizes: list[int] = []
        while start + sum(sizes) < stop:
            sizes.append(data.draw(st.integers(1, stop - start - sum(sizes))))
        connections.append(sizes)
        start = data.draw(st.integers(start, stop))  # (a confirmed position only moves forward)
        confirms.append(start)
    connections.append([n - start] if start < n else [])

    def run(batched: bool) -> tuple[list[int], dict[int, int]]:
        f = ResumeFilter()
        got: list[int] = []
        at = 0
        for k, sizes in enumerate(connections):
            for size in sizes:
                batch = txns[at : at + size]
                events = [p.TxnRun(batch)] if batched else [p.TxnRun([t]) for t in batch]
                for m in events:
                    for _, out, _ in f.feed((Lsn(0), m, b"")):
                        done = out.frames() if type(out) is p.TxnRun else [out]
                        got += [txn.begin.xid for txn in done]  # type: ignore[union-attr]
                at += size
            if k < len(confirms):
                confirmed = txns[confirms[k] - 1].end_lsn if confirms[k] else 0
                f.confirmed(Lsn(confirmed))
                f.reconnected(Lsn(confirmed))
                at = confirms[k]
        return got, f.completed

    got, completed = run(batched=True)
    assert got == [1000 + i for i in range(n)]
    got_one, completed_one = run(batched=False)
    assert got_one == got
    # A batch is forgotten once its last may be: only the one across the line is still held.
    assert completed_one.items() <= completed.items()
    assert len(completed) - len(completed_one) < max((k for sizes in connections for k in sizes), default=1)
