"""Fuzzing the recorded-stream reader (csnd.reader.streamfile, .recorded) with damaged files.

A recording is changed the ways disks, copies and people change files: a
byte flipped anywhere (header included), a frame written twice, two frames
swapped, a frame removed, bytes inserted, the file cut at any byte.  Then it
is read both ways a replay reads it (message by message, and in runs of raw
change frames, at small read sizes so frames straddle the buffer) and:

- a format-2 file (per-frame CRC-32C, chained) must give a
  `StreamFormatError` naming the file and a byte offset -- unless the
  damage left exactly the file of a shorter recording (cut at a frame
  boundary), whose frames it must then give, and nothing else;
- a format-1 file (no CRCs) must give events or one csnd error, never
  another exception, and both ways of reading it must agree.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from csnd.core.errors import CsndError, StreamFormatError
from csnd.reader import pgoutput as p
from csnd.reader import streamfile
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import StreamFileReader
from tests.reader.test_streamfile import _expanded, _first_frame, _raw_file, _stream_of, _write

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

RELATION = p.encode_xlogdata(
    0, 0, 1, p.encode_relation(16384, "public", "t", "d", [p.Column(1, "id", 23, -1)])
)
plans = st.lists(
    st.tuples(st.sampled_from(["txn", "block", "keepalive"]), st.integers(1, 2**31), st.integers(0, 5)),
    min_size=1,
    max_size=5,
)


def _read(path: Path, raw_changes: bool, chunk: int) -> list[tuple[int, object]]:
    with mock.patch.object(streamfile, "READ_CHUNK_BYTES", chunk):
        return list(_expanded(RecordedSource(str(path)).events(raw_changes=raw_changes)))


def _boundaries(version: int, frames: list[bytes]) -> list[int]:
    """Where each frame of a file ends (the first entry: where the first starts)."""
    at = [_first_frame(version)]
    for f in frames:
        at.append(at[-1] + (8 if version == 2 else 4) + len(f))
    return at


@st.composite
def _damage(draw: st.DrawFn, raw: bytes, at: list[int]) -> bytes:
    """`raw` changed once: a byte, whole frames, inserted bytes, or a cut."""
    how = draw(st.sampled_from(["flip", "dup", "swap", "delete", "insert", "cut"]))
    n = len(at) - 1  # frames
    if how == "flip":
        i = draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1 :]
    if how == "insert":
        i = draw(st.integers(0, len(raw)))
        return raw[:i] + draw(st.binary(min_size=1, max_size=12)) + raw[i:]
    if how == "cut":
        return raw[: draw(st.integers(0, len(raw) - 1))]
    i = draw(st.integers(0, n - 1))
    a, b = at[i], at[i + 1]
    if how == "dup":
        return raw[:b] + raw[a:b] + raw[b:]
    if how == "delete":
        return raw[:a] + raw[b:]
    j = draw(st.integers(0, n - 1))  # swap frames i and j (any two)
    (i, j) = sorted((i, j))
    if i == j:
        return raw
    a, b, c, d = at[i], at[i + 1], at[j], at[j + 1]
    return raw[:a] + raw[c:d] + raw[b:c] + raw[a:b] + raw[d:]


@FUZZ
@given(plan=plans, data=st.data(), chunk=st.integers(8, 300))
def test_damage_to_a_format_2_recording_is_an_error_naming_file_and_offset(
    tmp_path: Path, plan: list[tuple[str, int, int]], data: st.DataObject, chunk: int
) -> None:
    frames = [RELATION, *_stream_of(plan)]
    path = tmp_path / "f.pgstream"
    _write(path, frames)
    raw = path.read_bytes()
    at = _boundaries(2, frames)
    damaged = data.draw(_damage(raw, at))
    path.write_bytes(damaged)
    # The one damage that cannot be told from a whole file: a cut between frames.
    kept = next((k for k, end in enumerate(at) if damaged == raw[:end]), None)
    for raw_changes in (False, True):
        try:
            got = _read(path, raw_changes, chunk)
        except StreamFormatError as e:
            assert kept is None, f"a shorter whole recording refused: {e}"
            assert str(path) in str(e) and "byte offset" in str(e)
            continue
        assert kept is not None, "damage read as a whole recording"
        shorter = tmp_path / "g.pgstream"
        _write(shorter, frames[:kept])
        assert got == _read(shorter, raw_changes, 1 << 20)


@FUZZ
@given(plan=plans, data=st.data(), chunk=st.integers(8, 300))
def test_a_damaged_format_1_recording_reads_or_is_one_csnd_error(
    tmp_path: Path, plan: list[tuple[str, int, int]], data: st.DataObject, chunk: int
) -> None:
    """Without CRCs damage may read as other frames; but never another exception, and both paths agree."""
    frames = [RELATION, *_stream_of(plan)]
    path = tmp_path / "f.pgstream"
    _write(path, frames, version=1)
    path.write_bytes(data.draw(_damage(path.read_bytes(), _boundaries(1, frames))))
    outcomes: list[list[tuple[int, object]] | None] = []
    for raw_changes in (False, True):
        try:
            outcomes.append(_read(path, raw_changes, chunk))
        except CsndError as e:
            assert str(path) in str(e) or "node dn1" in str(e)
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]


@FUZZ
@given(noise=st.binary(max_size=200), version=st.sampled_from([1, 2]))
def test_noise_after_a_header_reads_or_is_one_csnd_error(tmp_path: Path, noise: bytes, version: int) -> None:
    path = tmp_path / "n.pgstream"
    _write(path, [], version=version)
    with open(path, "ab") as f:
        f.write(noise)
    for raw_changes in (False, True):
        with contextlib.suppress(CsndError):
            _read(path, raw_changes, 64)
    path.write_bytes(noise[:7] + b"!" + noise[8:])  # the noise as a whole file (never a magic: byte 8)
    with pytest.raises(StreamFormatError, match=r"magic|header"):
        RecordedSource(str(path))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
headers = st.one_of(
    st.dictionaries(
        st.sampled_from(["node", "mode", "binary", "proto_version", "enums", "x"]), json_values, max_size=5
    ).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"node": st.text(max_size=6)}).map(lambda d: json.dumps(d).encode()),
    st.integers(0, 20_000).map(lambda n: b"[" * n + b"]" * n),  # (deep enough to exhaust the recursion)
    st.binary(max_size=40),
)


@FUZZ
@given(header=headers, version=st.sampled_from([1, 2]))
def test_any_header_is_a_recording_or_one_stream_format_error(
    tmp_path: Path, header: bytes, version: int
) -> None:
    """A header nested thousands deep raised RecursionError, and a node name with a lone surrogate
    was taken and failed only when the output was written (UnicodeEncodeError)."""
    path = tmp_path / "h.pgstream"
    path.write_bytes(_raw_file(header, version) + b"")
    try:
        with StreamFileReader(str(path)) as r:
            list(r)
            RecordedSource(str(path)).enum_types()
    except StreamFormatError as e:
        assert str(path) in str(e)
        return
    assert r.header.node.isprintable()
    r.header.node.encode("utf-8")
    assert r.header.mode in ("gtm", "single") and isinstance(r.header.binary, bool)
