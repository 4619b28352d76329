"""csnd.core.durable: the writeback hint behind `csnd replay --output FILE` (asked once per stretch, harmless to the bytes), and durable names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from csnd.core import durable as writeback
from csnd.core.durable import WRITEBACK_BYTES, Writeback
from csnd.core.ids import Csn
from csnd.reader import streamwriter
from csnd.reader.streamfile import StreamHeader, StreamWriter
from csnd.runtime.jsonsink import JsonLinesSink as _Output


def test_sync_file_range_is_found_on_this_linux() -> None:
    """Without it the hint is silently a no-op; CI runs on Linux, where libc has it."""
    assert writeback._sync_file_range is not None


def test_the_hint_succeeds_on_a_real_file(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 4096)
        assert writeback._sync_file_range is not None
        assert writeback._sync_file_range(fd, 0, 4096, writeback._SYNC_FILE_RANGE_WRITE) == 0
    finally:
        os.close(fd)


def test_writeback_is_asked_for_each_stretch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int, int]] = []

    def record(*args: int) -> int:
        calls.append(args)  # type: ignore[arg-type]
        return 0

    monkeypatch.setattr(writeback, "_sync_file_range", record)
    wb = Writeback(7)
    step = WRITEBACK_BYTES // 3 + 1  # stretches end between writes, not on them
    for _ in range(10):
        wb.wrote(step)
    assert wb.written == 10 * step
    # Consecutive, non-overlapping ranges from offset 0, each at least WRITEBACK_BYTES long.
    assert [c[0] for c in calls] == [7] * len(calls)
    starts = [c[1] for c in calls]
    assert starts[0] == 0
    assert all(s + n == nxt for (_, s, n, _), nxt in zip(calls[:-1], starts[1:], strict=True))
    assert all(c[2] >= WRITEBACK_BYTES for c in calls)
    assert all((s + n) % writeback._PAGE == 0 for _, s, n, _ in calls)  # whole pages only
    assert len(calls) == 10 * step // WRITEBACK_BYTES
    assert calls[-1][1] + calls[-1][2] <= wb.written


def test_output_through_the_hint_is_every_byte_in_order(tmp_path: Path) -> None:
    """Lines well past several writeback stretches, through csnd replay's own output writer."""
    path = tmp_path / "out.jsonl"
    out = _Output(str(path))
    lines = [f'{{"n":{i},"pad":"{"y" * (i % 5000)}"}}' for i in range(12_000)]
    for i, line in enumerate(lines):
        out.end_transaction(Csn(i), line)
    out.commit()
    data = path.read_bytes()
    assert len(data) > 3 * WRITEBACK_BYTES
    assert data == "".join(f"{ln}\n" for ln in lines).encode()
    assert out._writeback is not None and out._writeback.written == len(data)


def test_sync_directory_syncs_the_directory_holding_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    writeback.sync_directory(str(tmp_path / "not-yet-there.jsonl"))
    assert synced == [str(tmp_path)]


def test_replay_output_and_recordings_make_their_names_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recording's name once, at its first sync (a slot is confirmed after a sync); a replay's after its rename."""
    named: list[str] = []
    monkeypatch.setattr(streamwriter, "sync_directory", named.append)
    rec = tmp_path / "r.pgstream"
    with StreamWriter(str(rec), StreamHeader(node="dn1", binary=False, mode="single")) as w:
        w.sync()
        w.sync()
    assert named == [str(rec)]

    import csnd.runtime.jsonsink

    named.clear()
    monkeypatch.setattr(csnd.runtime.jsonsink, "sync_directory", named.append)
    out = _Output(str(tmp_path / "o.jsonl"))
    out.end_transaction(Csn(1), "{}")
    assert named == []
    out.commit()
    assert named == [str(tmp_path / "o.jsonl")] and (tmp_path / "o.jsonl").exists()


def test_a_failed_fsync_of_the_output_is_a_clear_error_and_keeps_the_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from csnd.core.errors import CsndError

    out = _Output(str(tmp_path / "o.jsonl"))
    out.end_transaction(Csn(1), "{}")

    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(
        CsndError, match=rf"cannot write the output to {tmp_path}/o.jsonl.partial: fsync failed"
    ):
        out.commit()
    assert not (tmp_path / "o.jsonl").exists() and (tmp_path / "o.jsonl.partial").exists()
