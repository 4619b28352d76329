"""`csnd replay` of one node writes its released transactions without the merge: the same bytes as through it."""

from __future__ import annotations

import threading
import time
from itertools import accumulate, pairwise
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.changelog.sync import SyncPoint
from csnd.coordinator import AloneOrder, CsnMerge, json_line
from csnd.core.errors import ProtocolError
from csnd.core.ids import Csn, Lsn, Xid
from csnd.runtime import items
from csnd.runtime.items import EndItem, TxnItem, cut_batches
from csnd.runtime.jsonsink import JsonLinesSink
from csnd.runtime.merger import Merger, write_alone
from csnd.sender.txn import FinishedTxn
from csnd.service.sink import ChangelogSink
from tests.runtime.queued import QueuedInput

_TXN = st.tuples(
    st.lists(st.integers(0, 2), max_size=12),  # cid steps: cids never decrease inside a transaction
    st.booleans(),  # in memory (a list) or spilled (an iterator)
    st.none() | st.text(min_size=1, max_size=6),  # gid
    st.integers(0, 10**12),  # commit time
)


def _txns(drawn: list[tuple[list[int], bool, str | None, int]]) -> list[FinishedTxn]:
    txns = []
    for k, (steps, in_memory, gid, commit_time) in enumerate(drawn):
        changes = [
            (cid, 0x100 + i, f'"lsn": "0/{i:X}", "body": "t{k} é"') for i, cid in enumerate(accumulate(steps))
        ]
        csn = 10 * (k + 1)
        txns.append(
            FinishedTxn(
                "dn1",
                Csn(csn),
                None if gid is None else f"{gid}-{k}",  # one gid, one transaction
                Xid(700 + k),
                Lsn(0x900 + csn),
                Lsn(0x910 + csn),
                commit_time,
                changes if in_memory else iter(changes),
                len(changes),
            )
        )
    return txns


def _through_the_merge(txns: list[FinishedTxn]) -> str:
    merge = CsnMerge(["dn1"])
    lines = []
    for txn in txns:
        for batch in cut_batches(txn):
            merge.add_batch("dn1", batch)
        lines += [json_line(t) + "\n" for t in merge.pop_ready()]
    return "".join(lines)


@settings(max_examples=100, deadline=None)
@given(drawn=st.lists(_TXN, max_size=6), bound=st.integers(1, 5))
def test_lines_written_alone_are_the_merges_lines(
    tmp_path_factory: pytest.TempPathFactory, drawn: list[tuple[list[int], bool, str | None, int]], bound: int
) -> None:
    """Empty, one-cid, many-cid, in-memory and spilled transactions, cut at any batch bound."""
    with mock.patch.object(items, "MERGE_BATCH_CHANGES", bound):
        expected = _through_the_merge(_txns(drawn))
        path = tmp_path_factory.mktemp("alone") / "out.jsonl"
        out = JsonLinesSink(str(path))
        order = AloneOrder("dn1")
        for txn in _txns(drawn):
            write_alone(out, txn, order)
        out.commit()
    assert path.read_text(encoding="utf-8") == expected
    assert out.transactions == len(drawn)


def test_a_csn_that_does_not_increase_is_a_protocol_error(tmp_path: Path) -> None:
    first, second = _txns([([0], True, None, 5), ([0], True, "g", 6)])
    second.csn = first.csn
    out = JsonLinesSink(str(tmp_path / "out.jsonl"))
    order = AloneOrder("dn1")
    write_alone(out, first, order)
    with pytest.raises(ProtocolError) as info:
        write_alone(out, second, order)
    e = info.value
    assert (e.node, e.xid, e.lsn) == ("dn1", second.xid, second.commit_lsn)
    assert "transaction g-1 (xid 701, csn 10, commit 0/914) was released after csn 10" in str(e)
    assert "strictly increasing csn order" in str(e)


def test_a_gid_seen_again_is_a_protocol_error_alone_as_through_the_merge() -> None:
    """The same gid with another csn: the merge's check, which the sender no longer makes once it released the first."""
    first, second = _txns([([0], True, "g", 5), ([0], True, "g", 6)])
    second.gid = first.gid
    with pytest.raises(ProtocolError, match="global transaction g-0 has csn 20 on node dn1"):
        _through_the_merge([first, second])
    order = AloneOrder("dn1")
    order.check(first.csn, first.gid, first.xid, first.commit_lsn)
    with pytest.raises(ProtocolError) as info:
        order.check(second.csn, second.gid, second.xid, second.commit_lsn)
    assert (info.value.node, info.value.xid, info.value.lsn) == ("dn1", second.xid, second.commit_lsn)
    assert "global transaction g-0 already committed on this node with csn 10" in str(info.value)
    # the memory of gids is bounded, as the merge's is
    small = AloneOrder("dn1", recent_gids=2)
    for csn, gid in enumerate(["a", "b", "c", "a"], 1):
        small.check(Csn(csn), gid, Xid(700 + csn), Lsn(0x900 + csn))  # "a" was forgotten after "c"
    with pytest.raises(ProtocolError):
        small.check(Csn(9), "c", Xid(709), Lsn(0x909))


def test_a_node_releasing_faster_than_it_is_written_still_has_its_slot_confirmed(tmp_path: Path) -> None:
    """Alone, the loop takes a bounded round of transactions, so confirms are not starved by a full queue."""
    n = 3 * CsnMerge(["dn1"]).max_pending_batches
    txns = _txns([([0], True, None, 5)] * n)
    for k, txn in enumerate(txns):
        txn.xid = Xid(700 + k)  # (the drawn list repeats one transaction)
    partial = tmp_path / "out.jsonl.partial"
    lines_then: list[int] = []  # the output's lines at each confirmation

    def note_lines(lsn: int) -> None:
        lines_then.append(partial.read_text(encoding="utf-8").count("\n"))  # written and synced

    queued: list[items.NodeItem] = [*(TxnItem(t, t.end_lsn) for t in txns), EndItem()]
    node = QueuedInput("dn1", "single", queued, on_confirm=note_lines)
    out = JsonLinesSink(str(tmp_path / "out.jsonl"))
    Merger([node], out, confirm_interval_s=0.0).run()
    out.commit()
    assert out.transactions == n
    assert len(node.confirmed) >= 3  # one per round at least, before the stream ended
    assert node.confirmed == sorted(node.confirmed) and node.confirmed[0] > 0
    for lsn, lines in zip(node.confirmed, lines_then, strict=True):
        assert lsn <= txns[lines - 1].end_lsn  # nothing confirmed before its line was on disk
    assert node.final == txns[-1].end_lsn


def test_an_os_error_reading_a_source_is_one_line_naming_node_file_and_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """EIO in the middle of a recording: not a bare 'Input/output error', and the output is abandoned, not presented."""
    import errno

    from csnd.cli import main
    from csnd.reader import streamfile
    from csnd.testing.widestream import write_wide_stream

    path = tmp_path / "s.pgstream"
    write_wide_stream(str(path), 3000, rows_per_txn=10)
    real_scan = streamfile.StreamFileReader.scan

    def failing_scan(self: streamfile.StreamFileReader, *a: object, **k: object) -> object:
        for i, item in enumerate(real_scan(self, *a, **k)):  # type: ignore[arg-type]
            if i == 200:
                raise OSError(errno.EIO, "Input/output error")
            yield item

    monkeypatch.setattr(streamfile.StreamFileReader, "scan", failing_scan)
    out = tmp_path / "out.jsonl"
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:  # (main() installs the command line's stop handlers: give pytest its own back)
        assert main(["replay", str(path), "--decoders", "1", "--output", str(out)]) == 1
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"csnd replay: error: node bench: cannot read {path}: Input/output error; "
        f"the incomplete output is in {out}.partial"
    ]
    assert not out.exists()


class _SlowFsync(Changelog):
    """A changelog on a disk slow enough that appends overtake every sync."""

    def fsync(self, point: SyncPoint) -> None:
        time.sleep(0.002)
        super().fsync(point)


def test_a_background_group_commit_confirms_only_what_a_finished_sync_covers(tmp_path: Path) -> None:
    """The service's sink syncs on its own thread while the runtime appends: a slot never passes durable.

    Every run must keep the slot behind the durable changelog.  The transactions come in three
    parts, each after a sync has covered the one before, so confirmations happen mid-run (the
    interesting case) whatever the scheduler does: left to it, a fast runtime was done before the
    first sync on some runs, and a starved sync thread on others.
    """
    assert _group_commit_run(tmp_path / "run") >= 2


def _group_commit_run(directory: Path) -> int:
    """One run of the group-commit scenario, every confirmation checked; how many there were."""
    n = 3 * CsnMerge(["dn1"]).max_pending_batches
    txns = _txns([([0], True, None, 5)] * n)
    for k, txn in enumerate(txns):
        txn.xid = Xid(700 + k)
    log = _SlowFsync(str(directory / "changelog"))
    sink = ChangelogSink(log)
    sink.start()
    durable_then: list[int] = []  # the changelog's durable CSN at each confirmation
    cuts = [0, n // 3, 2 * n // 3, n]
    parts: list[list[items.NodeItem]] = [
        [TxnItem(t, t.end_lsn) for t in txns[a:b]] for a, b in pairwise(cuts)
    ]
    parts[-1].append(EndItem())
    node = QueuedInput("dn1", "single", parts[0], on_confirm=lambda lsn: durable_then.append(log.durable_csn))

    def feed_after_syncs() -> None:
        """Each part once a sync has covered the part before it."""
        for cut, part in zip(cuts[1:], parts[1:], strict=False):
            covered = txns[cut - 1].csn
            deadline = time.monotonic() + 60  # a ceiling, not a timing goal
            while (log.durable_csn or 0) < covered and time.monotonic() < deadline:
                time.sleep(0.001)
            node.out.put_many(part)

    feeder = threading.Thread(target=feed_after_syncs, daemon=True)
    try:
        feeder.start()
        Merger([node], sink, confirm_interval_s=0.0, durable_always=True).run()
    finally:
        feeder.join(timeout=60)
        sink.stop()
    end_of = {t.csn: t.end_lsn for t in txns}
    assert node.confirmed == sorted(node.confirmed)
    for lsn, durable in zip(node.confirmed, durable_then, strict=True):
        assert lsn <= end_of.get(Csn(durable), 0), (lsn, durable)  # never past the durable changelog
    assert node.final == txns[-1].end_lsn and log.durable_csn == txns[-1].csn
    log.close()
    return len(node.confirmed)


def test_a_transaction_is_made_durable_without_waiting_for_a_timer_or_more_input(tmp_path: Path) -> None:
    """A live source's lone transaction reaches the disk while its source stays open and silent.

    The confirmation interval is an hour, so only a group commit asked for as
    soon as the transaction is appended can make it durable: the wait below is
    a ceiling for a stalled run, not a timing goal.
    """
    (txn,) = _txns([([0], True, None, 5)])
    log = Changelog(str(tmp_path / "changelog"))
    sink = ChangelogSink(log)
    sink.start()
    node = QueuedInput("dn1", "single", [TxnItem(txn, txn.end_lsn)])
    merger = Merger([node], sink, confirm_interval_s=3600.0, durable_always=True)
    runner = threading.Thread(target=merger.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while (log.durable_csn or 0) < txn.csn and time.monotonic() < deadline:
            time.sleep(0.001)
        assert log.durable_csn == txn.csn  # durable with the source still open and nothing more sent
    finally:
        node.out.put_many([EndItem()])
        runner.join(timeout=60)
        sink.stop()
        log.close()
    assert not runner.is_alive()
