"""csnd record when something fails: the first error is the one reported, and the slot is never confirmed past the file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from csnd.core.errors import ConnectionLost, CsndError
from csnd.reader import pgoutput as pg
from csnd.reader.events import QuietListener
from csnd.reader.record_cmd import record


class FakeSource:
    """Enough of a LiveSource for record(): a few frames, then the given failure."""

    node = "dn1"
    binary = False
    mode = "single"
    reconnects = 0

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure
        self.confirmed_lsn = 0x1000
        self.confirmed: list[int] = []
        self.filter = SimpleNamespace(open_transactions=0)
        self.closed = False

    def frames(self, quiet: QuietListener | None = None) -> Iterator[tuple[int, object, bytes]]:
        begin = pg.encode_begin(0x2000, 5, 700)
        commit = pg.encode_commit(0x2000, 0x2008, 5)
        yield 0x1F00, pg.parse_message(begin, False), pg.encode_xlogdata(0x1F00, 0x1F00, 1, begin)
        yield 0x2000, pg.parse_message(commit, False), pg.encode_xlogdata(0x2000, 0x2000, 1, commit)
        raise self.failure

    def user_types(self) -> list[tuple[int, str, int, int]]:
        return []

    def confirm(self, lsn: int) -> None:
        self.confirmed.append(lsn)

    def close(self) -> None:
        self.closed = True


def test_a_lost_connection_is_reported_and_what_is_on_disk_is_confirmed(tmp_path: Path) -> None:
    src = FakeSource(ConnectionLost("connection lost and not back after 1s", node="dn1"))
    with pytest.raises(ConnectionLost):
        record(src, str(tmp_path / "r.pgstream"), progress=None)  # type: ignore[arg-type]
    assert src.confirmed == [0x2008] and src.closed  # the commit it holds, synced first


def test_a_disk_that_fails_under_a_lost_connection_does_not_hide_it_and_confirms_nothing() -> None:
    """The final sync fails (/dev/full): the connection error is still the one raised; nothing is confirmed."""
    src = FakeSource(ConnectionLost("connection lost and not back after 1s", node="dn1"))
    with pytest.raises(ConnectionLost):
        record(src, "/dev/full", progress=None)  # type: ignore[arg-type]
    assert src.confirmed == [] and src.closed


def test_ctrl_c_stays_ctrl_c_when_the_final_sync_fails() -> None:
    src = FakeSource(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        record(src, "/dev/full", progress=None)  # type: ignore[arg-type]
    assert src.confirmed == []


def test_a_disk_error_alone_is_the_error() -> None:
    src = FakeSource(StopIteration())  # (never reached: the writes fail first or at the end)
    src.frames = lambda quiet=None: iter([(0x1F00, None, b"w" + bytes(100_000))])  # type: ignore[method-assign]
    with pytest.raises(CsndError, match=r"^node dn1: cannot (write to|sync) the recording /dev/full"):
        record(src, "/dev/full", progress=None)  # type: ignore[arg-type]
    assert src.confirmed == []


class IdleSource(FakeSource):
    """Frames with quiet spells between them, as LiveSource reports them to the stream's quiet listener."""

    def __init__(self) -> None:
        super().__init__(StopIteration())
        self.finished = 0

    def frames(self, quiet: QuietListener | None = None) -> Iterator[tuple[int, object, bytes]]:
        assert quiet is not None, "record() gives its stream a quiet listener"
        begin = pg.encode_begin(0x2000, 5, 700)
        commit = pg.encode_commit(0x2000, 0x2008, 5)
        yield 0x1F00, pg.parse_message(begin, False), pg.encode_xlogdata(0x1F00, 0x1F00, 1, begin)
        yield 0x2000, pg.parse_message(commit, False), pg.encode_xlogdata(0x2000, 0x2000, 1, commit)
        quiet.idle()  # a lull after a transaction: synced and confirmed now
        quiet.idle()  # nothing new since: nothing to do
        ka = pg.encode_keepalive(0x3000, 0, False)
        yield 0x3000, pg.parse_frame(ka), ka
        quiet.idle()  # only a keepalive since: no sync for that (under load this would be every keepalive)

    def finish(self) -> None:
        self.finished += 1


def test_a_lull_after_changes_is_synced_and_confirmed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from csnd.reader import record_cmd as record_module

    monkeypatch.setattr(record_module, "SYNC_INTERVAL_S", 3600.0)  # only the lulls sync
    src = IdleSource()
    record(src, str(tmp_path / "r.pgstream"), progress=None)  # type: ignore[arg-type]
    # one confirm at the first lull, then the final one at the end of the stream
    assert src.confirmed == [0x2008, 0x3000]


def test_an_interrupted_recording_tells_the_server_what_it_holds(tmp_path: Path) -> None:
    """Ctrl-C / SIGTERM: the file is synced, then finish() sends the last status update (before: never sent)."""
    src = IdleSource()
    src.frames = FakeSource(KeyboardInterrupt()).frames  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        record(src, str(tmp_path / "r.pgstream"), progress=None)  # type: ignore[arg-type]
    assert src.confirmed[-1] == 0x2008 and src.finished == 1


def test_a_frame_cut_between_its_writes_never_reaches_the_disk(tmp_path: Path) -> None:
    from csnd.reader.recorded import RecordedSource
    from csnd.reader.streamfile import StreamHeader, StreamWriter

    path = tmp_path / "r.pgstream"
    w = StreamWriter(str(path), StreamHeader(node="dn1", binary=False, mode="single"))
    begin = pg.encode_xlogdata(0x1F00, 0x1F00, 1, pg.encode_begin(0x2000, 5, 700))
    w.write_frame(begin)
    real_write = w._f.write
    calls = []

    def interrupted_after_the_head(data: bytes) -> int:
        calls.append(data)
        if len(calls) == 2:  # the payload of the second frame
            raise KeyboardInterrupt
        return real_write(data)

    w._f.write = interrupted_after_the_head  # type: ignore[method-assign, assignment]
    with pytest.raises(KeyboardInterrupt):
        w.write_frame(begin)
    w._f.write = real_write  # type: ignore[method-assign]
    w.close()  # syncs: the cut frame's length prefix must not stay behind
    assert [lsn for lsn, _ in RecordedSource(str(path)).events()] == [0x1F00]
