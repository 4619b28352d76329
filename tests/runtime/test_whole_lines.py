"""A lone node's transactions written whole by the decoder workers: the same bytes as message by message.

With one node in single-node mode the decoder pool hands a transaction whose
Begin, row changes and Commit fall in one batch to a worker whole, and the
worker writes its line (`decoder.change.WholeTxns`); everything else still
goes change by change through the sender's buffer and the coordinator's
formatting.  The two paths must write the same lines, whatever the stream
and wherever batches are cut.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.coordinator import AloneOrder
from csnd.core.errors import LsnOrderViolation, TimestampError
from csnd.core.ids import PG_TIME_MAX_US, Csn, Lsn, Xid
from csnd.decoder.change import WholeTxns
from csnd.decoder.pool import BatchEnd, DecoderPool
from csnd.reader import pgoutput as p
from csnd.reader.events import Event, EventStream
from csnd.reader.recorded import RecordedSource, checked_commit_times
from csnd.reader.streamfile import StreamHeader, StreamWriter
from csnd.runtime.merger import write_alone
from csnd.sender.node import NodeSender
from csnd.service.sink import ChangelogSink
from tests.runtime.queued import QuietSink

RELID = 16384


class _Lines(QuietSink):
    """A sink keeping the lines and relation versions written to it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[str] = []
        self._parts: list[str] = []

    def start_transaction(self, csn: Csn) -> None:
        self._parts = []

    def write(self, text: str) -> None:
        self._parts.append(text)

    def end_transaction(self, csn: Csn, tail: str) -> None:
        self.out.append("".join([*self._parts, tail]))

    def relations(self, csn: Csn, entries: Sequence[tuple[str, str]]) -> None:
        self.out += [f"relation {csn} {node} {body}" for node, body in entries]


def _relation(name: str = "t") -> bytes:
    cols = [p.Column(1, "id", 23, -1), p.Column(0, "v", 25, -1)]
    return p.encode_relation(RELID, "public", name, "d", cols)


# One transaction: its changes ("i"/"u"/"d"), and what else it carries: a Relation
# re-sent inside it, a Truncate, a keepalive, or nothing.
_TXN = st.tuples(
    st.lists(st.sampled_from("iud"), max_size=5), st.sampled_from(["", "", "", "rel", "trunc", "ka"])
)


def _write_stream(path: Path, txns: list[tuple[list[str], str]]) -> None:
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=True, mode="single")) as w:
        w.write_frame(p.encode_xlogdata(0, 0, 1, _relation()))
        lsn = 0x1000
        for k, (changes, extra) in enumerate(txns):
            xid = 700 + k
            commit = lsn + 0x800
            w.write_frame(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(commit, 1000 + k, xid)))
            at = lsn
            for i, op in enumerate(changes):
                if extra and i == len(changes) // 2:
                    if extra == "rel":
                        w.write_frame(p.encode_xlogdata(at, at, 1, _relation(f"t{k}")))
                    elif extra == "trunc":
                        w.write_frame(p.encode_xlogdata(at, at, 1, p.encode_truncate([RELID])))
                    else:
                        w.write_frame(p.encode_keepalive(at, 1))
                at += 8 * (i % 2)  # (some changes share a position, as a multi-insert's rows do)
                key = struct.pack("!i", k * 10 + i)
                text = f"v{k}-{i} é".encode()
                if op == "i":
                    msg = p.encode_insert(RELID, [key, text])
                elif op == "u":
                    msg = p.encode_update(RELID, [key, text])
                else:
                    msg = p.encode_delete(RELID, [key, None])
                w.write_frame(p.encode_xlogdata(at, at, 1, msg))
            w.write_frame(
                p.encode_xlogdata(commit, commit, 1, p.encode_commit(commit, commit + 0x10, 5_000 + k))
            )
            lsn += 0x1000


def _folded(events: Iterable[Event]) -> EventStream:
    """Begin, a run (or none) and Commit, one after another, as a live reader hands them on: a `TxnRun` of one."""
    held: list[Event] = []
    for event in events:
        m = event[1]
        if type(m) is p.Begin:
            yield from held
            held = [event]
        elif held and type(m) is p.ChangeFrames and len(held) == 1:
            held.append(event)
        elif held and type(m) is p.Commit:
            begin_at, begin = held[0]
            run = held[1][1] if len(held) == 2 else None
            assert type(begin) is p.Begin and (run is None or type(run) is p.ChangeFrames)
            blob, lsns = (None, None) if run is None else (_head4(run), run.lsns)
            yield begin_at, p.TxnRun([p.scanned_txn(begin_at, begin, blob, lsns, event[0], m)])
            held = []
        else:
            yield from held
            held = []
            yield event
    yield from held


def _head4(run: p.ChangeFrames) -> bytes:
    """A run's frames with a 4-byte head, as the live reader frames them (a recording's may carry a CRC)."""
    out, pos, blob = [], 0, run.blob
    while pos < len(blob):
        (n,) = struct.unpack_from("!I", blob, pos)
        out.append(blob[pos : pos + 4] + blob[pos + run.head : pos + run.head + n])
        pos += run.head + n
    return b"".join(out)


def _batched(events: Iterable[Event], size: int) -> EventStream:
    """Consecutive whole transactions as one `TxnRun` of up to `size`, as the live reader's compiled loop reads them."""
    batch: list[p.ScannedTxn] = []
    for event in events:
        m = event[1]
        if type(m) is p.TxnRun:  # (`_folded`'s, of one)
            batch += m.txns
            if len(batch) < size:
                continue
        if batch:
            yield batch[0].begin_at, p.TxnRun(batch)
            batch = []
        if type(m) is not p.TxnRun:
            yield event
    if batch:
        yield batch[0].begin_at, p.TxnRun(batch)


def _lines(
    path: Path,
    raw: bool,
    batch_changes: int,
    write_lines: bool,
    fold: bool = False,
    changelog: Path | None = None,
    txn_runs: int = 0,
) -> tuple[list[str], int]:
    """The lines of the stream at `path` through pool, sender and `write_alone`, and how many came whole.

    With `changelog`, into a service's changelog there (its transaction lines, read back);
    with `txn_runs` (and `fold`), whole transactions come as `TxnRun`s of up to that many.
    """
    pool = DecoderPool("dn1", 2, binary=True, batch_changes=batch_changes)
    sender = NodeSender("dn1", "single")
    order, whole = AloneOrder("dn1"), 0
    log = Changelog(str(changelog)) if changelog is not None else None
    sink: _Lines | ChangelogSink = _Lines() if log is None else ChangelogSink(log)
    events = RecordedSource(str(path)).events(raw_changes=raw)
    if fold:
        events = _folded(events)
        if txn_runs:
            events = _batched(events, txn_runs)
    for lsn, item in pool.run(events, write_lines=write_lines):
        if isinstance(item, BatchEnd):
            continue
        whole += len(item) if type(item) is WholeTxns else 0
        for txn in sender.feed(lsn, item):
            write_alone(sink, txn, order)
    sender.finish()
    if log is None:
        assert isinstance(sink, _Lines)
        return sink.out, whole
    with log:
        log.sync()
        return [line.decode() for _, line in log.read(0)], whole


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    txns=st.lists(_TXN, min_size=1, max_size=8),
    batch_changes=st.integers(1, 6),
    raw=st.booleans(),
    txn_runs=st.integers(1, 4),
)
def test_lines_written_by_the_workers_are_the_coordinators(
    tmp_path: Path, txns: list[tuple[list[str], str]], batch_changes: int, raw: bool, txn_runs: int
) -> None:
    path = tmp_path / "s.pgstream"
    _write_stream(path, txns)
    expected, none_whole = _lines(path, raw, batch_changes, write_lines=False)
    got, whole = _lines(path, raw, batch_changes, write_lines=True)
    assert none_whole == 0
    assert got == expected
    # Only a transaction of row changes alone comes whole (and only if no batch cut ran through it).
    plain = sum(1 for changes, extra in txns if changes and not extra)
    assert whole <= plain
    if raw:  # as a live reader hands them on: the plain ones in one event each, so all of them whole
        assert _lines(path, raw, batch_changes, write_lines=False, fold=True) == (expected, 0)
        assert _lines(path, raw, batch_changes, write_lines=True, fold=True) == (expected, plain)
        # and in batches of them, as the compiled loop reads them (empty ones among them)
        for write in (False, True):
            got_runs = _lines(path, raw, batch_changes, write_lines=write, fold=True, txn_runs=txn_runs)
            assert got_runs == (expected, plain if write else 0)
        # into a changelog, whose sink appends a run of lines in one call
        txn_lines = [line for line in expected if not line.startswith("relation ")]
        for k, write in enumerate((False, True)):
            into = Path(tempfile.mkdtemp(dir=tmp_path, prefix=f"changelog-{k}-"))  # (new for each example)
            into_log = _lines(path, raw, batch_changes, write_lines=write, fold=True, changelog=into)
            assert into_log == (txn_lines, plain if write else 0)


def test_a_stream_of_plain_transactions_comes_whole_and_its_lines_are_json(tmp_path: Path) -> None:
    path = tmp_path / "s.pgstream"
    _write_stream(path, [(["i", "u", "d"], "")] * 20)
    lines, whole = _lines(path, True, 2048, write_lines=True)
    assert whole == 20 and len(lines) == 21
    assert lines[0].startswith("relation 6144 dn1 ")  # (the table's version, before its first line)
    first = json.loads(lines[1])
    assert first["csn"] == 0x1800 and first["nodes"] == {"dn1": {"xid": 700, "commit_lsn": "0/1800"}}
    assert [c["op"] for c in first["changes"]] == ["insert", "update", "delete"]
    assert {c["cid"] for c in first["changes"]} == {0}


def _spliced(path: Path) -> EventStream:
    for lsn, msg in RecordedSource(str(path)).events(raw_changes=True):
        if isinstance(msg, p.Commit):  # a commit where its Begin did not announce it
            msg = p.Commit(msg.flags, Lsn(msg.commit_lsn + 8), msg.end_lsn, msg.commit_time)
        yield lsn, msg


@pytest.mark.parametrize("write_lines", [False, True])
def test_a_whole_transaction_is_checked_as_one_taken_message_by_message(
    tmp_path: Path, write_lines: bool
) -> None:
    path = tmp_path / "s.pgstream"
    _write_stream(path, [(["i"], "")])
    pool = DecoderPool("dn1", 1, binary=True)
    sender = NodeSender("dn1", "single")
    with pytest.raises(LsnOrderViolation, match="commits at 0/1808 but its Begin announced 0/1800"):
        for lsn, item in pool.run(_spliced(path), write_lines=write_lines):
            if not isinstance(item, BatchEnd):
                sender.feed(lsn, item)


def test_a_whole_transaction_with_a_commit_time_past_year_9999_is_refused_naming_it() -> None:
    """A corrupt commit time in a folded transaction fails where it came in, naming the node, LSN and xid."""
    begin = p.Begin(Lsn(0x1800), 0, Xid(777))
    commit = p.Commit(0, Lsn(0x1800), Lsn(0x1810), PG_TIME_MAX_US + 1)
    whole = p.TxnRun([p.scanned_txn(Lsn(0x1000), begin, None, None, Lsn(0x1800), commit)])
    with pytest.raises(TimestampError) as raised:
        list(checked_commit_times(iter([(Lsn(0x1000), whole)]), "dn1"))
    assert (raised.value.node, raised.value.lsn, raised.value.xid) == ("dn1", 0x1800, 777)


def test_a_batch_of_whole_transactions_with_a_commit_time_past_year_9999_is_refused_naming_it() -> None:
    """As for one: the batch's bad transaction is named, not the batch's first."""

    def scanned(at: int, xid: int, commit_time: int) -> p.ScannedTxn:
        commit = Lsn(at + 0x800)
        begin = p.Begin(commit, 0, Xid(xid))
        return p.scanned_txn(
            Lsn(at), begin, None, None, commit, p.Commit(0, commit, Lsn(commit + 0x10), commit_time)
        )

    good, bad = scanned(0x1000, 776, 5), scanned(0x2000, 777, PG_TIME_MAX_US + 1)
    with pytest.raises(TimestampError) as raised:
        list(checked_commit_times(iter([(Lsn(0x1000), p.TxnRun([good, bad]))]), "dn1"))
    assert (raised.value.node, raised.value.lsn, raised.value.xid) == ("dn1", 0x2800, 777)
