"""Live, the reader's thread hands a batch it decoded to the consumer itself: same items, same order."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from csnd.core.ids import Lsn
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.decoder.pool import BatchEnd, DecoderPool
from csnd.reader import pgoutput as p
from csnd.reader.events import EventStream
from tests.decoder.test_inline_decode import (
    _comparable,
    _decode,
    _gated,
    _paused,
    _stream,
    live_examples,
    live_streams,
)

Items = Iterator[tuple[Lsn, DecodedItem | BatchEnd]]


class Handled:
    """What a consumer did with each item, from the collector's thread or the reader's, in order."""

    def __init__(self, on_commit: threading.Event | None = None) -> None:
        self.items: list[tuple[Lsn, Any]] = []
        self.threads: list[str] = []  # per batch: the thread that handled it
        self.on_commit = on_commit  # set as each Commit is handled

    def take(self, lsn: Lsn, item: DecodedItem | BatchEnd) -> None:
        if isinstance(item, p.Commit) and self.on_commit is not None:
            self.on_commit.set()
        if isinstance(item, BatchEnd):
            self.threads.append(threading.current_thread().name)
            return
        self.items.append((lsn, _comparable(item)))

    def take_all(self, items: Items) -> None:
        for lsn, item in items:
            self.take(lsn, item)


@live_examples
@live_streams
def test_items_handled_in_either_thread_come_in_stream_order(
    tmp_path: Path, sizes: list[int], pause_every: int, write_lines: bool, inline_changes: int
) -> None:
    """Oracle: the workers only, every item yielded.  With `collect_here`, each batch is handled by
    the collector's thread or the reader's, as the race between them falls; what the consumer saw,
    in the order it saw it, must be the oracle's items."""
    events = _stream(tmp_path / "s.pgstream", sizes)
    pauses = set(range(0, len(events), pause_every))
    expected, _ = _decode(events, pauses, live=True, write_lines=write_lines, inline_changes=0)
    pool = DecoderPool("dn1", 2, binary=True, batch_changes=8, inline_changes=inline_changes)
    handled = Handled()
    run = pool.run(
        _paused(pool, events, pauses),
        write_lines=write_lines,
        reports_pauses=True,
        collect_here=handled.take_all,
    )
    for lsn, item in run:
        handled.take(lsn, item)
    assert handled.items == expected
    assert pool.stats.changes == sum(sizes)


def test_an_idle_collector_leaves_a_small_live_batch_to_the_reader_thread(tmp_path: Path) -> None:
    """Each transaction is read only once the one before was handled (the collector idle then): the
    one-row ones are handled in the reader's thread, the ones that went to the workers in the caller's."""
    sizes = [1, 1, 20, 1, 30, 2]
    events = _stream(tmp_path / "s.pgstream", sizes)
    pool = DecoderPool("dn1", 2, binary=True, inline_changes=4)
    gate = threading.Event()  # (each transaction is read once the one before was handled)
    gate.set()
    handled = Handled(on_commit=gate)

    for lsn, item in pool.run(_gated(pool, events, gate), reports_pauses=True, collect_here=handled.take_all):
        handled.take(lsn, item)
    runs = [item for _, item in handled.items if item[0] == "run"]
    assert [len(r[2]) for r in runs] == [n for n in sizes if n]
    # The Relation's batch (before any transaction) may go either way; the transactions' may not.
    assert handled.threads[-6:] == [
        "csnd-reader-dn1",
        "csnd-reader-dn1",
        "MainThread",
        "csnd-reader-dn1",
        "MainThread",
        "csnd-reader-dn1",
    ]
    assert pool.stats.batches_here >= 4


def test_a_consumer_failure_in_the_reader_thread_is_the_run_failure_not_a_reconnect(tmp_path: Path) -> None:
    """The consumer fails with an OSError (a full disk, say) on a batch the reader's thread handed it
    at a pause, inside the source's iterator, where a live source takes an OSError for a lost
    connection and reconnects.  The source must not see it: the run fails with the consumer's error."""
    events = _stream(tmp_path / "s.pgstream", [1, 1, 1])
    pool = DecoderPool("dn1", 2, binary=True)
    reconnects = 0
    read_after = 0
    full = OSError(errno.ENOSPC, "No space left on device")

    def stream() -> EventStream:
        nonlocal reconnects, read_after
        for event in events:
            if reconnects:
                read_after += 1
            yield event
            try:
                pool.drained()
            except OSError:  # (what `LiveSource` does with a lost connection)
                reconnects += 1

    def failing(items: Items) -> None:
        for _, item in items:
            if isinstance(item, DecodedRun):
                raise full

    with pytest.raises(OSError) as ei:
        for _ in pool.run(stream(), reports_pauses=True, collect_here=failing):
            pass
    assert ei.value is full
    assert (reconnects, read_after) == (0, 0)
