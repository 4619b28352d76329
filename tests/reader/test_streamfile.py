"""Recorded stream files: round trip and every kind of bad input."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.core.errors import CsndError, StreamFormatError, TruncatedFrame
from csnd.core.ids import lsn_to_str
from csnd.reader import pgoutput as p
from csnd.reader import streamfile
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import MAGIC, MAGIC_V1, StreamFileReader, StreamHeader, StreamWriter


def _write(path: Path, frames: list[bytes], header: StreamHeader | None = None, version: int = 2) -> None:
    with StreamWriter(str(path), header or StreamHeader(node="dn1", mode="gtm"), version=version) as w:
        for f in frames:
            w.write_frame(f)


def _first_frame(version: int, header: StreamHeader | None = None) -> int:
    """The byte offset of a file's first frame: magic, length, JSON, and in format 2 the header CRC."""
    raw = (header or StreamHeader(node="dn1", mode="gtm")).to_json()
    return 12 + len(raw) + (4 if version == 2 else 0)


def _framed(frame: bytes, version: int = 2) -> int:
    """The bytes a frame takes in a file: its head (length, and in format 2 its CRC) and payload."""
    return (8 if version == 2 else 4) + len(frame)


def _raw_file(header: bytes, version: int = 2) -> bytes:
    """The start of a file with `header` as its JSON, by hand (and right: its CRC matches)."""
    head = (MAGIC if version == 2 else MAGIC_V1) + struct.pack("!I", len(header)) + header
    return head + struct.pack("!I", crc32c(head)) if version == 2 else head


FRAMES = [
    p.encode_xlogdata(0x100, 0x100, 1, p.encode_begin(0x200, 5, 700)),
    p.encode_xlogdata(0, 0, 1, p.encode_relation(16384, "public", "t", "d", [p.Column(1, "id", 23, -1)])),
    p.encode_xlogdata(0x100, 0x100, 1, p.encode_insert(16384, [b"\x00\x00\x00\x01"])),
    p.encode_xlogdata(0x228, 0x228, 1, p.encode_commit(0x200, 0x228, 5)),
    p.encode_keepalive(0x228, 7, False),
]


@pytest.mark.parametrize("version", [1, 2])
def test_round_trip(tmp_path: Path, version: int) -> None:
    path = tmp_path / "a.pgstream"
    header = StreamHeader(node="dn7", binary=False, mode="single", extra={"slot": "s"})
    _write(path, FRAMES, header, version)
    with StreamFileReader(str(path)) as r:
        assert r.version == version
        assert r.header.node == "dn7" and r.header.binary is False and r.header.mode == "single"
        assert r.header.extra == {"slot": "s"}
        got = [payload for _, payload in r]
    assert got == FRAMES
    src = RecordedSource(str(path), name="other")
    events = list(src.events())
    assert src.node == "other"
    kinds = [type(m).__name__ for _, m in events]
    assert kinds == ["Begin", "Relation", "Change", "Commit", "Keepalive"]
    assert [lsn for lsn, _ in events] == [0x100, 0, 0x100, 0x228, 0x228]


def test_header_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "a.pgstream"
    _write(path, [], StreamHeader(node="dn1", binary=True, mode="gtm"))
    raw = path.read_bytes()
    assert raw.startswith(b"CSNDSTR2")
    (n,) = struct.unpack("!I", raw[8:12])
    assert raw[12 : 12 + n] == b'{"node": "dn1", "proto_version": 2, "binary": true, "mode": "gtm"}'
    assert struct.unpack("!I", raw[12 + n :]) == (crc32c(raw[: 12 + n]),)


def test_frames_are_exact(tmp_path: Path) -> None:
    """Format 2 as the module docstring gives it: length, CRC chained from the one before, payload."""
    path = tmp_path / "a.pgstream"
    _write(path, FRAMES[:2])
    raw = path.read_bytes()
    pos = _first_frame(2)
    crc = struct.unpack("!I", raw[pos - 4 : pos])[0]  # the header's
    for frame in FRAMES[:2]:
        crc = crc32c(frame, crc)
        assert raw[pos : pos + 8 + len(frame)] == struct.pack("!II", len(frame), crc) + frame
        pos += 8 + len(frame)
    assert pos == len(raw)
    assert crc32c(b"123456789") == 0xE3069283  # (the CRC-32C of the docstring, not another CRC-32)


def test_a_format_1_file_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "v1.pgstream"
    path.write_bytes(
        _raw_file(StreamHeader(node="dn1", mode="gtm").to_json(), 1)
        + b"".join(struct.pack("!I", len(f)) + f for f in FRAMES)
    )
    with StreamFileReader(str(path)) as r:
        assert r.version == 1 and [payload for _, payload in r] == FRAMES
    assert len(list(RecordedSource(str(path)).events(raw_changes=True))) == len(FRAMES)


def test_bad_magic(tmp_path: Path) -> None:
    path = tmp_path / "bad.pgstream"
    path.write_bytes(b"NOTCSND!" + b"\x00" * 10)
    with pytest.raises(StreamFormatError, match=r"bad.pgstream: not a csnd stream file: magic"):
        StreamFileReader(str(path))


@pytest.mark.parametrize(
    "header, match",
    [
        (b"{not json", "not valid UTF-8 JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"mode": "gtm"}', 'no "node"'),
        (b'{"node": "a", "mode": "weird"}', '"mode" is'),
        (b'{"node": "a", "proto_version": 3}', "protocol version 3"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),  # (was a RecursionError)
        (b'{"node": "d\\ud800"}', "not printable"),  # (was a UnicodeEncodeError writing the output)
        (b'{"node": "d\\n1"}', "not printable"),
    ],
)
@pytest.mark.parametrize("version", [1, 2])
def test_bad_header(tmp_path: Path, header: bytes, match: str, version: int) -> None:
    path = tmp_path / "h.pgstream"
    path.write_bytes(_raw_file(header, version))
    with pytest.raises(StreamFormatError, match=match):
        StreamFileReader(str(path))


def test_header_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "h.pgstream"
    path.write_bytes(MAGIC + struct.pack("!I", 100) + b"{}")
    with pytest.raises(StreamFormatError, match=r"ends inside the header"):
        StreamFileReader(str(path))


def test_a_damaged_header_fails_its_crc(tmp_path: Path) -> None:
    path = tmp_path / "h.pgstream"
    raw = bytearray(_raw_file(b'{"node": "dn1"}'))
    raw[14] ^= 0x20  # "node" -> "Node": still JSON, but not what was written
    path.write_bytes(bytes(raw))
    with pytest.raises(StreamFormatError, match=r"h.pgstream: the header fails its CRC .*byte offset 0"):
        StreamFileReader(str(path))


def test_an_impossible_header_length_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "h.pgstream"
    path.write_bytes(MAGIC + struct.pack("!I", 0xFFFFFFF0) + b"{}")
    with pytest.raises(StreamFormatError, match=r"impossible header length 4294967280"):
        StreamFileReader(str(path))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("raw_changes", [False, True])
@pytest.mark.parametrize("cut", [1, 2, 5, 20])
def test_truncated_last_frame_names_file_offset_and_lsn(
    tmp_path: Path, cut: int, raw_changes: bool, version: int
) -> None:
    path = tmp_path / "t.pgstream"
    _write(path, FRAMES, version=version)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - cut)
    last_offset = size - _framed(FRAMES[-1], version)
    with pytest.raises(StreamFormatError) as info:
        list(RecordedSource(str(path)).events(raw_changes=raw_changes))
    msg = str(info.value)
    assert "t.pgstream" in msg and "truncated last frame" in msg
    assert f"byte offset {last_offset}" in msg and f"frame {len(FRAMES)}:" in msg
    assert "0/228" in msg  # the last LSN read


@pytest.mark.parametrize("raw_changes", [False, True])
def test_unknown_message_type_names_file_offset_lsn(tmp_path: Path, raw_changes: bool) -> None:
    path = tmp_path / "u.pgstream"
    bad = p.encode_xlogdata(0x300, 0x300, 1, b"Z" + b"\x00" * 8)
    _write(path, [*FRAMES[:3], bad])
    offset = _first_frame(2) + sum(_framed(f) for f in FRAMES[:3])
    with pytest.raises(StreamFormatError) as info:
        list(RecordedSource(str(path)).events(raw_changes=raw_changes))
    msg = str(info.value)
    assert "unknown pgoutput message type 'Z'" in msg
    assert f"byte offset {offset}" in msg and "node dn1" in msg and "0/300" in msg


def test_unknown_frame_kind(tmp_path: Path) -> None:
    path = tmp_path / "k.pgstream"
    _write(path, [FRAMES[0], b"q12345678"])
    with pytest.raises(StreamFormatError, match=r"unknown frame type 'q'.*at 0/100"):
        list(StreamFileReader(str(path)))


def test_corrupt_frame_length(tmp_path: Path) -> None:
    path = tmp_path / "l.pgstream"
    _write(path, [FRAMES[0]])
    with open(path, "ab") as f:
        f.write(struct.pack("!II", 0, 0) + b"\x01")
    with pytest.raises(StreamFormatError, match="frame 2: corrupt frame length 0"):
        list(StreamFileReader(str(path)))


@pytest.mark.parametrize("whole_frame", [True, False])
def test_a_tail_of_zero_bytes_is_a_torn_tail_not_damage(tmp_path: Path, whole_frame: bool) -> None:
    """A power loss may leave a file's unsynced tail as zeroes (its blocks allocated, never written).

    Whether the zeroes start at a frame (length 0) or after a frame's head
    (its CRC fails on them), it is a torn last frame that `csnd record
    --append` cuts, as it cuts one cut short; zeroes followed by anything
    else stay damage.
    """
    path = tmp_path / "z.pgstream"
    _write(path, [FRAMES[0]])
    with open(path, "ab") as f:
        f.write((b"" if whole_frame else struct.pack("!II", 100, 12345)) + bytes(4096))
    with pytest.raises(TruncatedFrame, match="frame 2: truncated last frame: the file ends in zero bytes"):
        list(StreamFileReader(str(path)))


def _damaged(raw: bytes, how: str, i: int) -> bytes:
    """`raw` (a format-2 file of RUN) with frame `i` (from 0) damaged: a byte flipped, or moved whole."""
    at = [_first_frame(2)]
    for f in RUN:
        at.append(at[-1] + _framed(f))
    a, b, c = at[i], at[i + 1], at[i + 2] if i + 2 < len(at) else None
    if how == "flip":
        return raw[: b - 1] + bytes([raw[b - 1] ^ 1]) + raw[b:]  # the frame's last byte
    if how == "dup":
        return raw[:b] + raw[a:b] + raw[b:]
    if how == "delete":
        return raw[:a] + raw[b:]
    assert how == "swap" and c is not None
    return raw[:a] + raw[b:c] + raw[a:b] + raw[c:]


@pytest.mark.parametrize("raw_changes", [False, True])
@pytest.mark.parametrize(
    "how, i, bad",
    [
        ("flip", 0, 0),  # the Begin
        ("flip", 2, 2),  # the first change of a run
        ("flip", 3, 3),  # inside a run: the run before it still comes
        ("dup", 2, 3),  # a whole valid frame written twice: the copy fails (its CRC chains from itself)
        ("delete", 2, 2),  # the frame after the missing one fails
        ("swap", 2, 2),  # two changes exchanged: the first of them fails
    ],
)
def test_a_damaged_frame_fails_its_crc_naming_file_frame_offset_and_lsn(
    tmp_path: Path, raw_changes: bool, how: str, i: int, bad: int
) -> None:
    """Before format 2, each of these gave a replay with exit 0 and a wrong transaction."""
    path = tmp_path / "d.pgstream"
    _write(path, RUN)
    path.write_bytes(_damaged(path.read_bytes(), how, i))
    offset = _first_frame(2) + sum(_framed(f) for f in RUN[:bad])
    got: list[tuple[int, object]] = []
    with pytest.raises(StreamFormatError) as info:
        got.extend(_expanded(RecordedSource(str(path)).events(raw_changes=raw_changes)))
    msg = str(info.value)
    assert f"d.pgstream: frame {bad + 1} (" in msg and "fails its CRC" in msg
    assert f"byte offset {offset}" in msg
    lsns = [0x100, 0, 0x110, 0x120, 0x130]
    if bad > 0:  # the LSN of the last good frame read (frames before the first have none)
        assert f"after {lsn_to_str(max(lsns[:bad]))})" in msg
    assert len(got) == bad  # every good frame before the bad one, nothing from it on


def test_appending_continues_the_crc_chain(tmp_path: Path) -> None:
    """`csnd record --append`: the writer takes the format and the last CRC from the file it continues."""
    path = tmp_path / "a.pgstream"
    _write(path, RUN[:3])
    with StreamFileReader(str(path)) as r:
        list(r)
        version, crc = r.version, r.crc
    with StreamWriter(
        str(path),
        StreamHeader(node="dn1", mode="gtm"),
        "append",
        os.path.getsize(path),
        version=version,
        crc=crc,
    ) as w:
        for f in RUN[3:]:
            w.write_frame(f)
    with StreamFileReader(str(path)) as r:
        assert [payload for _, payload in r] == RUN and r.frames == len(RUN)


def test_appending_to_a_format_1_file_writes_format_1(tmp_path: Path) -> None:
    path = tmp_path / "a.pgstream"
    _write(path, RUN[:3], version=1)
    with StreamWriter(
        str(path), StreamHeader(node="dn1", mode="gtm"), "append", os.path.getsize(path), version=1
    ) as w:
        for f in RUN[3:]:
            w.write_frame(f)
    with StreamFileReader(str(path)) as r:
        assert r.version == 1 and [payload for _, payload in r] == RUN


def test_corrupt_message_inside_frame(tmp_path: Path) -> None:
    path = tmp_path / "c.pgstream"
    _write(path, [FRAMES[0], p.encode_xlogdata(0x150, 0x150, 1, p.encode_commit(1, 2, 3)[:4])])
    with pytest.raises(StreamFormatError, match=r"corrupt Commit message"):
        list(RecordedSource(str(path)).events())


def _insert(lsn: int, n: int, xid: int | None = None) -> bytes:
    return p.encode_xlogdata(lsn, lsn, 1, p.encode_insert(16384, [b"\x00\x00\x00\x01"] * n, xid=xid))


RUN = [FRAMES[0], FRAMES[1], _insert(0x110, 1), _insert(0x120, 2), _insert(0x130, 3)]


@pytest.mark.parametrize("raw_changes", [False, True])
def test_file_cut_inside_a_run_of_changes_names_the_cut_frame(tmp_path: Path, raw_changes: bool) -> None:
    path = tmp_path / "r.pgstream"
    _write(path, RUN)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 3)
    src = RecordedSource(str(path))
    got: list[tuple[int, object]] = []
    with pytest.raises(StreamFormatError) as info:
        got.extend(_expanded(src.events(raw_changes=raw_changes)))
    assert f"byte offset {size - _framed(RUN[-1])}" in str(info.value)
    assert "0/120" in str(info.value)  # the last whole change
    assert [lsn for lsn, _ in got] == [0x100, 0, 0x110, 0x120]  # everything before the cut frame


@pytest.mark.parametrize("raw_changes", [False, True])
def test_change_too_short_to_be_one_inside_a_run_is_reported(tmp_path: Path, raw_changes: bool) -> None:
    path = tmp_path / "s.pgstream"
    short = p.encode_xlogdata(0x140, 0x140, 1, b"I\x00\x00")  # relid cut short
    _write(path, [*RUN, short, _insert(0x150, 1)])
    offset = _first_frame(2) + sum(_framed(f) for f in RUN)
    with pytest.raises(StreamFormatError, match=rf"corrupt Insert message.*byte offset {offset}"):
        list(RecordedSource(str(path)).events(raw_changes=raw_changes))


def _expanded(events: Iterator[tuple[int, object]]) -> Iterator[tuple[int, object]]:
    """Events with each `ChangeFrames` run parsed into its changes, as `events()` gives them."""
    for lsn, msg in events:
        if isinstance(msg, p.ChangeFrames):
            assert msg.lsns[0] == lsn and len(msg.lsns) <= streamfile.MAX_RUN_FRAMES
            for lsn_i, kind, xid, relid, data in p.iter_change_frames(msg.blob, msg.in_stream, msg.head):
                assert xid == msg.xid  # one (sub)transaction a run
                yield lsn_i, (kind, xid, relid, data)
        elif isinstance(msg, p.Change):
            yield lsn, (msg.kind, msg.xid, msg.relid, msg.data)
        else:  # a message as its class and fields, to compare by value
            fields = getattr(msg, "__slots__", None)
            fields = vars(msg) if fields is None else fields
            yield lsn, (type(msg).__name__, *(getattr(msg, f) for f in fields))


def _stream_of(plan: list[tuple[str, int, int]]) -> list[bytes]:
    """Frames for a plan of (what, xid, size): plain transactions and stream blocks with subxacts."""
    frames = []
    lsn = 0x1000
    for what, xid, size in plan:
        lsn += 0x10
        if what == "txn":
            frames.append(p.encode_xlogdata(lsn, lsn, 1, p.encode_begin(lsn + 0x800, 5, xid)))
            for i in range(size):
                kind = (p.encode_insert, p.encode_delete)[i % 2]
                frames.append(p.encode_xlogdata(lsn + i, lsn, 1, kind(16384, [b"x" * (i % 7)] * (1 + i % 3))))
            frames.append(
                p.encode_xlogdata(lsn + 0x800, lsn, 1, p.encode_commit(lsn + 0x800, lsn + 0x900, 5))
            )
        elif what == "block":
            frames.append(p.encode_xlogdata(lsn, lsn, 1, p.encode_stream_start(xid, True)))
            for i in range(size):
                sub = xid + (i // 3) % 2  # runs of three changes, alternating two subxids
                frames.append(p.encode_xlogdata(lsn + i, lsn, 1, p.encode_insert(16384, [b"y" * i], xid=sub)))
            frames.append(p.encode_xlogdata(0, 0, 1, p.encode_stream_stop()))
        else:
            frames.append(p.encode_keepalive(lsn, 7, False))
    return frames


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    plan=st.lists(
        st.tuples(st.sampled_from(["txn", "block", "keepalive"]), st.integers(1, 2**31), st.integers(0, 12)),
        max_size=12,
    ),
    chunk=st.integers(8, 400),
    max_run=st.integers(1, 5),
    version=st.sampled_from([1, 2]),
)
def test_runs_of_raw_change_frames_are_the_parsed_changes(
    tmp_path: Path, plan: list[tuple[str, int, int]], chunk: int, max_run: int, version: int
) -> None:
    """Whatever the read size and run bound, the runs hold exactly the changes `events()` parses, in order."""
    path = tmp_path / "h.pgstream"
    _write(path, _stream_of(plan), version=version)
    with (
        mock.patch.object(streamfile, "READ_CHUNK_BYTES", chunk),
        mock.patch.object(streamfile, "MAX_RUN_FRAMES", max_run),
    ):
        raw = list(_expanded(RecordedSource(str(path)).events(raw_changes=True)))
        parsed = list(_expanded(RecordedSource(str(path)).events()))
    assert raw == parsed
    changes = [m for _, m in raw if isinstance(m, tuple) and m[0] in ("I", "D")]
    assert len(changes) == sum(size for what, _, size in plan if what != "keepalive")


def test_error_is_picklable(tmp_path: Path) -> None:
    import pickle

    err = StreamFormatError("boom", path="x.pgstream", offset=12, node="dn1", lsn=0x10)
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and back.offset == 12 and back.path == "x.pgstream"


def test_a_recording_that_cannot_be_created_names_node_and_file(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "r.pgstream"
    with pytest.raises(CsndError, match=rf"^node dn1: cannot create the recording {path}: No such file"):
        StreamWriter(str(path), StreamHeader(node="dn1", binary=False, mode="single"))


def test_a_recording_that_cannot_be_written_fails_once_and_syncs_nothing_after() -> None:
    """Disk full: the error names node and file; later syncs refuse (so nothing is confirmed); close is quiet."""
    w = StreamWriter("/dev/full", StreamHeader(node="dn1", binary=False, mode="single"))
    with pytest.raises(
        CsndError, match=r"^node dn1: cannot (write to|sync) the recording /dev/full: No space left"
    ):
        for _ in range(1000):  # past the write buffer, or else at the sync
            w.write_frame(b"w" + bytes(200))
        w.sync()
    assert w.failed
    with pytest.raises(CsndError, match="failed before; it is not synced"):
        w.sync()
    with pytest.raises(CsndError, match="failed before; nothing more is written"):
        w.write_frame(b"w")
    w.close()  # no second error: the first was already raised
    w.close()


class _CountingFile:
    """A file object that remembers the largest read asked of it."""

    def __init__(self, f: object) -> None:
        self._f = f
        self.largest = 0

    def read(self, n: int = -1) -> bytes:
        self.largest = max(self.largest, n)
        return self._f.read(n)  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._f, name)


@pytest.mark.parametrize("raw_changes", [False, True])
@pytest.mark.parametrize("claimed", [(1 << 30) - 16, 100_000])
def test_an_impossible_frame_length_is_reported_without_reading_on(
    tmp_path: Path, raw_changes: bool, claimed: int
) -> None:
    """A corrupt length prefix (~1 GiB) used to make the reader pull in and copy the rest of the file."""
    path = tmp_path / "l.pgstream"
    _write(path, FRAMES[:2] + [FRAMES[2]] * 400)  # (a few MiB would do as well: this is a few kB)
    size = os.path.getsize(path)
    offset = _first_frame(2) + _framed(FRAMES[0])
    with open(path, "r+b") as f:  # the second frame's length prefix
        f.seek(offset)
        f.write(struct.pack("!I", claimed))
    src = RecordedSource(str(path))
    counting = _CountingFile(src._file._f)
    src._file._f = counting  # type: ignore[assignment]
    with pytest.raises(StreamFormatError) as info:
        list(src.events(raw_changes=raw_changes))
    msg = str(info.value)
    left = size - offset - 8
    assert f"impossible frame length {claimed}: only {left} bytes follow in the file" in msg
    assert "l.pgstream" in msg and f"byte offset {offset}" in msg
    assert counting.largest <= streamfile.READ_CHUNK_BYTES


def test_a_frame_longer_than_any_postgresql_message_is_impossible_in_a_pipe(tmp_path: Path) -> None:
    path = tmp_path / "l.pgstream"
    _write(path, FRAMES[:1])
    with open(path, "ab") as f:
        f.write(struct.pack("!I", 1 << 30) + b"w" * 100)
    r, w = os.pipe()
    with open(path, "rb") as src, os.fdopen(w, "wb") as sink:
        sink.write(src.read())
    with pytest.raises(
        StreamFormatError, match=r"impossible frame length 1073741824: larger than any PostgreSQL"
    ):
        list(StreamFileReader(f"/dev/fd/{r}"))
    os.close(r)
