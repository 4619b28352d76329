"""Power loss, not kill -9: the changelog's durable files at every crash point of a recorded history.

tests/fixtures/powerloss.py records every write, fsync, creation, rename,
unlink and directory fsync of a workload over the changelog directory, and
builds what a power loss at each point may leave (unsynced bytes dropped,
torn at a sector or left as zeroes; unsynced directory changes undone).
Each built directory is opened the way the service opens it, and must:

- open without manual repair (a torn tail is cut, in whichever segment a
  roll left it);
- hold every record that `sync()` reported durable before the crash point,
  byte for byte, and every named subscription's mark stored before it;
- invent nothing: every record it holds was appended, in CSN order;
- take appends again after the open.

The workload exercises what a service does: group commits of records of
many sizes across segment rolls, records larger than a segment appended in
pieces, one given up mid-record, retention dropping segments, subscription
marks and relation versions, and a close and reopen in the middle.
`CSND_POWERLOSS_POINTS=all` (as `make faults` sets) tries every point of the
history; by default an evenly spread sample of points, so `make test` stays
quick.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import tempfile
from pathlib import Path

import pytest

from csnd.changelog import Changelog, SubscriptionStore
from csnd.core.errors import StreamFormatError, TruncatedFrame
from csnd.reader.streamfile import StreamFileReader, StreamHeader, StreamWriter
from tests.fixtures.powerloss import CrashState, Recorder, crash_states, recording

SEGMENT_BYTES = 4096
# Points tried in `make test` (every point with CSND_POWERLOSS_POINTS=all).
SAMPLE_POINTS = 120


def _line(csn: int, size: int) -> bytes:
    body = f'{{"csn":{csn},"pad":"'.encode()
    return body + b"x" * max(0, size - len(body) - 2) + b'"}'


def _workload(directory: str, rec: Recorder, rng: random.Random) -> dict[int, bytes]:
    """Appends, syncs and claims as a service does; returns every record ever appended."""
    appended: dict[int, bytes] = {}
    csn = 0
    subs = SubscriptionStore(directory)
    log = Changelog(directory, segment_bytes=SEGMENT_BYTES, index_interval=256)
    relations_added = 0
    for step in range(60):
        if step == 30:  # a clean restart in the middle: the reopen's own writes are recorded too
            log.close()
            log = Changelog(directory, segment_bytes=SEGMENT_BYTES, index_interval=256)
        kind = rng.random()
        if kind < 0.12:
            # a record larger than a segment, appended in pieces
            csn += rng.randint(1, 3)
            payload = _line(csn, rng.randint(5000, 9000))
            log.start_record(csn)
            for i in range(0, len(payload), 1500):
                log.write_record(payload[i : i + 1500])
            if rng.random() < 0.25:
                log.abort_record()  # given up: never appended
            else:
                log.end_record()
                appended[csn] = payload
        else:
            for _ in range(rng.randint(1, 6)):
                csn += rng.randint(1, 3)
                appended[csn] = _line(csn, rng.randint(30, 1400))
                log.append(csn, appended[csn])
        if rng.random() < 0.1:
            log.relations.add(
                csn, "dn1", f'"schema":"public","table":"t{relations_added}","columns":[{{"name":"id"}}]'
            )
            relations_added += 1
            rec.claim(("relations", relations_added))
        durable = log.sync()
        rec.claim(("changelog", durable))
        if rng.random() < 0.2:
            subs.set("reader", durable)
            rec.claim(("subscription", durable))
    log.close()
    return appended


def _check(state: CrashState, appended: dict[int, bytes], scratch: str) -> None:
    where = f"power loss after operation {state.point} ({state.how})"
    durable = max((c[1] for c in state.claims if c[0] == "changelog"), default=0)
    mark = max((c[1] for c in state.claims if c[0] == "subscription"), default=None)
    relations = max((c[1] for c in state.claims if c[0] == "relations"), default=0)
    shutil.rmtree(scratch, ignore_errors=True)
    state.write_to(scratch)
    try:
        log = Changelog(scratch, segment_bytes=SEGMENT_BYTES, index_interval=256)
    except Exception as e:
        raise AssertionError(f"{where}: the changelog does not open: {e}") from e
    try:
        got = list(log.read(0))
        csns = [c for c, _ in got]
        assert csns == sorted(set(csns)), f"{where}: records out of order or doubled: {csns}"
        for c, payload in got:
            assert appended.get(c) == payload, f"{where}: csn {c} was never appended with these bytes"
        kept = set(csns)
        lost = [c for c in appended if c <= durable and c not in kept]
        assert not lost, f"{where}: csns {lost} were reported durable (up to {durable}) and are gone"
        assert log.durable_csn >= durable
        assert len(log.relations) >= relations, f"{where}: relation versions reported durable are gone"
        # it takes appends again
        nxt = max(csns, default=0) + 1
        log.append(nxt, _line(nxt, 100))
        assert log.sync() == nxt
    finally:
        log.close()
    if mark is not None:
        stored = SubscriptionStore(scratch).get("reader")
        assert stored is not None and stored >= mark, (
            f"{where}: the subscription mark {mark} went back to {stored}"
        )


def _points(rec: Recorder) -> list[int]:
    n = len(rec.ops)
    if os.environ.get("CSND_POWERLOSS_POINTS") == "all" or n <= SAMPLE_POINTS:
        return list(range(n + 1))
    # an even spread, and every point right before and after an fsync (where claims change)
    step = n / SAMPLE_POINTS
    points = {round(i * step) for i in range(SAMPLE_POINTS)} | {n}
    return sorted(points)


@pytest.mark.parametrize("seed", [1, 2])
def test_every_power_loss_point_keeps_what_was_durable_and_invents_nothing(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "log"
    directory.mkdir()
    rec = Recorder(str(directory))
    with recording(rec):
        appended = _workload(str(directory), rec, rng)
    assert any(op.kind == "dirsync" for op in rec.ops) and any(op.kind == "fsync" for op in rec.ops)
    scratch_root = tempfile.mkdtemp(
        prefix="csnd-powerloss-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    tried = 0
    try:
        for point in _points(rec):
            for state in crash_states(rec, point, rng):
                _check(state, appended, os.path.join(scratch_root, "d"))
                tried += 1
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    assert tried >= min(len(rec.ops), SAMPLE_POINTS)


def test_the_recorder_sees_what_the_file_system_holds(tmp_path: Path) -> None:
    """The harness itself: replaying everything recorded gives the directory as it is on disk."""
    directory = tmp_path / "log"
    directory.mkdir()
    rec = Recorder(str(directory))
    with recording(rec):
        _workload(str(directory), rec, random.Random(7))
    states = list(crash_states(rec, len(rec.ops), random.Random(0), randomized=0))
    everything = states[1]
    on_disk = {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file() and p.name != "LOCK"}
    built = {k: v for k, v in everything.files.items() if k != "LOCK"}
    assert built == on_disk


# -- the recorded-stream writer (`csnd record`) -------------------------------------


def _frame(rng: random.Random, most: int) -> bytes:
    """An XLogData frame holding a logical message ('M') of random bytes: what the reader takes whole."""
    lsn = rng.randint(1 << 24, 1 << 40)
    return b"w" + struct.pack("!QQQ", lsn, lsn, 0) + b"M" + rng.randbytes(rng.randint(1, most))


def _record_workload(path: str, rec: Recorder, rng: random.Random) -> list[bytes]:
    """Frames written and synced as `csnd record` does, then appended to after a reopen."""
    frames: list[bytes] = []
    header = StreamHeader(node="dn1")
    with StreamWriter(path, header, "create") as writer:
        for _ in range(25):
            for _ in range(rng.randint(1, 8)):
                frames.append(_frame(rng, 1500))
                writer.write_frame(frames[-1])
            writer.sync()
            rec.claim(("frames", len(frames)))
    with StreamFileReader(path) as reader:
        end = max((offset + reader.frame_head + len(p) for offset, p in reader), default=0)
        chain = {"version": reader.version, "crc": reader.crc}
    with StreamWriter(path, header, "append", end, **chain) as writer:
        for _ in range(10):
            frames.append(_frame(rng, 3000))
            writer.write_frame(frames[-1])
            writer.sync()
            rec.claim(("frames", len(frames)))
    return frames


def _check_recording(state: CrashState, name: str, frames: list[bytes], scratch: str) -> None:
    """What `csnd record --append` finds: the synced frames, then at most a torn tail it may cut."""
    where = f"power loss after operation {state.point} ({state.how})"
    synced = max((c[1] for c in state.claims), default=0)
    if name not in state.files:
        assert synced == 0, f"{where}: the recording is gone after {synced} frames were synced"
        return
    shutil.rmtree(scratch, ignore_errors=True)
    state.write_to(scratch)
    path = os.path.join(scratch, name)
    got: list[bytes] = []
    try:
        with StreamFileReader(path) as reader:
            got.extend(p for _, p in reader)
    except TruncatedFrame:
        pass  # a torn last frame: `csnd record --append` cuts it
    except StreamFormatError as e:
        if synced == 0 and not got:
            return  # (a file whose header never reached the disk: nothing was confirmed from it)
        # anything else is damage, which --append refuses: only unsynced bytes may be lost
        raise AssertionError(f"{where}: the recording reads as damaged after frame {len(got)}: {e}") from e
    assert got == frames[: len(got)], f"{where}: a frame the writer never wrote"
    assert len(got) >= synced, f"{where}: {synced} frames were synced, {len(got)} are there"


@pytest.mark.parametrize("seed", [1, 2])
def test_a_recording_keeps_every_synced_frame_at_every_power_loss_point(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    directory = tmp_path / "rec"
    directory.mkdir()
    rec = Recorder(str(directory))
    with recording(rec):
        frames = _record_workload(str(directory / "dn1.pgstream"), rec, rng)
    scratch_root = tempfile.mkdtemp(
        prefix="csnd-powerloss-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    try:
        for point in _points(rec):
            for state in crash_states(rec, point, rng):
                _check_recording(state, "dn1.pgstream", frames, os.path.join(scratch_root, "d"))
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
