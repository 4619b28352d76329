"""A live node's small batches decoded in the reader thread: the same items, in the same order."""

from __future__ import annotations

import os
import signal
import struct
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.core.errors import DecodeError, WorkerError
from csnd.core.ids import Lsn
from csnd.decoder.change import DecodedRun, WholeTxns
from csnd.decoder.pool import BatchEnd, DecoderPool
from csnd.reader import pgoutput as p
from csnd.reader.events import Event, EventStream
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import StreamHeader, StreamWriter

_COLUMNS = [p.Column(1, "id", 23, -1), p.Column(0, "note", 25, -1)]


def _stream(path: Path, sizes: list[int]) -> list[Event]:
    """One Relation, then a transaction of `sizes[t]` INSERTs each (a text column, an int)."""
    with StreamWriter(str(path), StreamHeader(node="dn1", binary=True, mode="single")) as w:
        w.write_frame(p.encode_xlogdata(0, 0, 1, p.encode_relation(16384, "public", "t", "d", _COLUMNS)))
        lsn = 0x1000
        for t, n in enumerate(sizes):
            xid = 700 + t
            end = lsn + 8 * (n + 1)
            w.write_frame(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(end, 5 + t, xid)))
            for i in range(n):
                row: list[bytes | str | None] = [struct.pack("!i", xid * 1000 + i), f'é {t}/{i} "q"'.encode()]
                w.write_frame(p.encode_xlogdata(lsn + 8 * (i + 1), lsn, 1, p.encode_insert(16384, row)))
            w.write_frame(p.encode_xlogdata(end, lsn, 1, p.encode_commit(end, end + 8, 5 + t)))
            lsn = end + 0x100
    return list(RecordedSource(str(path)).events(raw_changes=True))


def _paused(pool: DecoderPool, events: list[Event], pauses: set[int]) -> EventStream:
    """`events`, the pool told the source drained after each index in `pauses` (as a live source does)."""
    for i, event in enumerate(events):
        yield event
        if i in pauses:
            pool.drained()


def _gated(pool: DecoderPool, events: list[Event], gate: threading.Event) -> EventStream:
    """`events`, each transaction read only once `gate` is set (then cleared), the pool told the
    source drained after each Commit: a live node whose next transaction comes once the last is out."""
    for event in events:
        if isinstance(event[1], p.Begin):
            assert gate.wait(30)
            gate.clear()
        yield event
        if isinstance(event[1], p.Commit):
            pool.drained()


def _comparable(item: Any) -> Any:
    if isinstance(item, DecodedRun):
        return ("run", item.xid, list(item.lsns), list(item.bodies), item.op)
    if isinstance(item, WholeTxns):
        return ("wholes", [(w.xid, w.commit_lsn) for w in item.txns], list(item.lines))
    if isinstance(item, BatchEnd):
        return None  # (where batches end is the cutting's, not the output's)
    return repr(item)


def _decode(
    events: list[Event], pauses: set[int], *, live: bool, write_lines: bool, inline_changes: int
) -> tuple[list[Any], DecoderPool]:
    pool = DecoderPool("dn1", 2, binary=True, batch_changes=8, inline_changes=inline_changes)
    stream: EventStream = _paused(pool, events, pauses)
    out = [
        c
        for lsn, item in pool.run(stream, write_lines=write_lines, reports_pauses=live)
        if (c := (lsn, _comparable(item)))[1] is not None
    ]
    return out, pool


# A live node's streams: transactions of these sizes, paused every few events, lines written by the
# workers or not, and the largest batch decoded in the reader thread (shared with test_collect_here).
live_examples = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
live_streams = given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=8),
    pause_every=st.integers(1, 9),
    write_lines=st.booleans(),
    inline_changes=st.sampled_from([1, 4, 64]),
)


@live_examples
@live_streams
def test_a_live_pool_gives_what_the_workers_give_byte_for_byte(
    tmp_path: Path, sizes: list[int], pause_every: int, write_lines: bool, inline_changes: int
) -> None:
    """Oracle: every batch through the workers (no inline decoding); the live pool, pausing at
    random points, decodes its small ones in the reader thread and must yield the same items."""
    events = _stream(tmp_path / "s.pgstream", sizes)
    pauses = set(range(0, len(events), pause_every))
    expected, _ = _decode(events, pauses, live=True, write_lines=write_lines, inline_changes=0)
    got, pool = _decode(events, pauses, live=True, write_lines=write_lines, inline_changes=inline_changes)
    assert got == expected
    assert pool.stats.changes == sum(sizes)


def test_small_live_batches_skip_the_workers_and_large_ones_use_them(tmp_path: Path) -> None:
    """A live pool paused after each transaction: the one-row ones are decoded in the reader thread,
    the ones larger than the bound go to the workers, and the output keeps stream order."""
    sizes = [1, 1, 20, 1, 30, 2]
    events = _stream(tmp_path / "s.pgstream", sizes)
    pool = DecoderPool("dn1", 2, binary=True, inline_changes=4)
    ids = []
    gate = threading.Event()  # (each transaction is read once the one before came out: the decoders are idle)
    gate.set()

    for _, item in pool.run(_gated(pool, events, gate), reports_pauses=True):
        if isinstance(item, DecodedRun):
            ids += [int(b.split('"id": ', 1)[1].split(",", 1)[0]) for b in item.bodies]
        if isinstance(item, p.Commit):
            gate.set()
    assert ids == [(700 + t) * 1000 + i for t, n in enumerate(sizes) for i in range(n)]
    assert (pool.stats.batches, pool.stats.inline_batches) == (6, 4)
    assert pool.stats.changes == sum(sizes)


def test_a_recorded_file_goes_to_the_workers_whatever_its_batches(tmp_path: Path) -> None:
    """Not live (no pauses reported): every batch goes to a worker, as before."""
    events = _stream(tmp_path / "s.pgstream", [1, 1, 1])
    pool = DecoderPool("dn1", 2, binary=True, batch_changes=1)
    stream: EventStream = (e for e in events)
    assert sum(isinstance(item, DecodedRun) for _, item in pool.run(stream)) == 3
    assert (pool.stats.batches, pool.stats.inline_batches) == (3, 0)


def test_a_relation_the_reader_thread_cannot_decode_fails_the_run_after_what_came_before(
    tmp_path: Path,
) -> None:
    """A Relation of a type binary mode cannot read, after two one-row transactions of a live node:
    both come out, then the run fails with the decoder's own error naming the node and relation."""
    events = _stream(tmp_path / "s.pgstream", [1, 1])
    bad = [p.Column(1, "id", 23, -1), p.Column(0, "shape", 999_999, -1)]
    relation = p.parse_message(p.encode_relation(16384, "public", "t", "d", bad), False)
    events.append((Lsn(0x4000), relation))
    pool = DecoderPool("dn1", 2, binary=True)
    seen = []
    with pytest.raises(DecodeError) as ei:
        for _, item in pool.run(_paused(pool, events, set(range(len(events)))), reports_pauses=True):
            seen.append(item)
    assert sum(isinstance(i, DecodedRun) for i in seen) == 2
    assert str(ei.value).startswith('node dn1: relation public.t (relid 16384): column "shape" has type')


def test_a_decoder_killed_while_batches_are_decoded_inline_fails_the_live_run(tmp_path: Path) -> None:
    """Live and idle, the workers get no batch, so no result read notices one dead: the collector must
    look at them anyway and fail the run (a service then restarts the pipeline), well before a stream
    of one-row transactions that never needs them ends."""
    events = _stream(tmp_path / "s.pgstream", [1])
    relation, txn = events[0], events[1:]
    pool = DecoderPool("dn1", 2, binary=True)
    victim = pool._procs[1]
    limit = 300_000
    after_kill = 0

    def stream() -> EventStream:
        nonlocal after_kill
        yield relation
        assert victim.pid is not None
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(30)
        while after_kill < limit:
            yield from txn
            pool.drained()
            after_kill += 1

    with pytest.raises(WorkerError, match=r"decoder worker 1 \(pid \d+\) was killed by signal 9"):
        for _ in pool.run(stream(), reports_pauses=True):
            pass
    assert after_kill < limit, "the dead worker was noticed only at the stream's end"
    assert pool.stats.inline_batches > 0
