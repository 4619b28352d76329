"""`encode_frames` and `walk`: the compiled run encoding and segment walk against their Python twins.

The encoding's twin is held to `encode`, and a walk's result to `scan`'s.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.changelog import record as rec

encode_frames_c: Callable[..., Any] | None
try:
    from csnd.changelog._frames import encode_frames as encode_frames_c
except ImportError:  # (reported by test_the_compiled_encoding_is_built)
    encode_frames_c = None

IMPLEMENTATIONS = [rec.encode_frames_py] + ([] if encode_frames_c is None else [encode_frames_c])

# CSNs around the edges: 0 and negatives are no CSN, nor is anything above 2^64-1.
csn_values = st.one_of(
    st.integers(min_value=-3, max_value=40),
    st.integers(min_value=rec.MAX_U64 - 3, max_value=rec.MAX_U64 + 3),
    st.integers(min_value=-(2**70), max_value=2**70),
)
runs = st.lists(st.tuples(csn_values, st.binary(max_size=64)), max_size=12)


def test_the_compiled_encoding_is_built() -> None:
    """`make test` installs with a C compiler: the changelog must not fall back unnoticed."""
    assert encode_frames_c is not None, "csnd.changelog._frames was not built (is a C compiler installed?)"
    if os.environ.get("CSND_IMPL", "").lower() == "python":  # (asked for the twin)
        assert rec.FRAMES_IMPLEMENTATION == "python" and rec.encode_frames is rec.encode_frames_py
    else:
        assert rec.FRAMES_IMPLEMENTATION == "c" and rec.encode_frames is encode_frames_c


@given(
    run=runs,
    after=st.integers(min_value=0, max_value=rec.MAX_U64),
    most=st.integers(0, 80),
    time_us=st.integers(min_value=0, max_value=rec.MAX_U64),
    prev_crc=st.integers(min_value=0, max_value=0xFFFF_FFFF),
)
def test_the_twins_encode_the_same_records_and_stop_at_the_same_one(
    run: list[tuple[int, bytes]], after: int, most: int, time_us: int, prev_crc: int
) -> None:
    csns, payloads = [c for c, _ in run], [p for _, p in run]
    results = [f(csns, payloads, time_us, after, most, prev_crc) for f in IMPLEMENTATIONS]
    assert all(r == results[0] for r in results[1:])


@given(
    run=runs,
    after=st.integers(min_value=0, max_value=50),
    most=st.integers(0, 80),
    prev_crc=st.integers(min_value=0, max_value=0xFFFF_FFFF),
)
def test_a_run_is_the_records_encode_gives_up_to_the_first_that_may_not_follow(
    run: list[tuple[int, bytes]], after: int, most: int, prev_crc: int
) -> None:
    """The oracle: `encode` one record at a time while each may follow the one before, each naming it."""
    csns, payloads = [c for c, _ in run], [p for _, p in run]
    expected: list[bytes] = []
    last, link = after, prev_crc
    for csn, payload in run:
        if not (last < csn <= rec.MAX_U64 and len(payload) <= most):
            break
        expected.append(rec.encode(csn, 99, payload, link))
        last, link = csn, zlib.crc32(expected[-1][8:])
    for f in IMPLEMENTATIONS:
        frames = f(csns, payloads, 99, after, most, prev_crc)
        assert frames == expected
        # and each reads back as the record it is, named by the one after it
        link = prev_crc
        for frame, csn, payload in zip(frames, csns, payloads, strict=False):
            assert rec.frame_at(frame, 0) == (rec.OK, csn, 99, len(frame), rec.frame_crc(frame), link)
            assert frame[rec.FRAME_HEAD :] == payload
            link = rec.frame_crc(frame)
        assert rec.scan(b"".join(frames), 0, after, prev_crc=prev_crc).csns == csns[: len(frames)]


@pytest.mark.parametrize("f", IMPLEMENTATIONS)
def test_bad_arguments_are_clear_errors(f: Callable[..., Any]) -> None:
    with pytest.raises(ValueError, match="2 csns for 1 payloads"):
        f([1, 2], [b"a"], 0, 0, 10, 0)
    with pytest.raises(TypeError, match="csn must be an int, not str"):
        f(["1"], [b"a"], 0, 0, 10, 0)
    with pytest.raises(TypeError, match="payload must be bytes, not str"):
        f([1], ["a"], 0, 0, 10, 0)
    assert f((), (), 0, 0, 10, 0) == []
    one = rec.encode(1, 0, b"x", 7)
    assert f((1, 2), (b"x", b"y"), 0, 0, 10, 7) == [one, rec.encode(2, 0, b"y", rec.frame_crc(one))]


walk_c: Callable[..., Any] | None
try:
    from csnd.changelog._frames import walk as walk_c
except ImportError:
    walk_c = None
WALKS = [rec.walk_py] + ([] if walk_c is None else [walk_c])


@st.composite
def segment_bodies(draw: st.DrawFn) -> tuple[int, bytes]:
    """(version, records) with the changes a damaged file shows: csns out of order, links broken, bytes off."""
    version = draw(st.sampled_from([1, 2]))
    out: list[bytes] = []
    link = draw(st.integers(0, 0xFFFF_FFFF))
    for csn, payload in draw(st.lists(st.tuples(st.integers(1, 60), st.binary(max_size=40)), max_size=12)):
        if version == 1:
            frame = rec.encode_v1(csn, csn * 3, payload)
        else:
            named = link if draw(st.integers(0, 9)) else draw(st.integers(0, 0xFFFF_FFFF))
            frame = rec.encode(csn, csn * 3, payload, named)
        out.append(frame)
        link = rec.frame_crc(frame)
    body = bytearray(b"".join(out))
    how = draw(st.sampled_from(["none", "flip", "cut", "insert"]))
    if body and how == "flip":
        body[draw(st.integers(0, len(body) - 1))] ^= draw(st.integers(1, 255))
    elif how == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif how == "insert":
        k = draw(st.integers(0, len(body)))
        body[k:k] = draw(st.binary(min_size=1, max_size=8))
    return version, bytes(body)


@given(
    body=segment_bodies(),
    start=st.integers(0, 8),
    last=st.integers(0, 30),
    link=st.one_of(st.just(rec.NO_LINK), st.integers(0, 0xFFFF_FFFF)),
)
def test_the_twins_walk_a_segment_alike(body: tuple[int, bytes], start: int, last: int, link: int) -> None:
    version, buf = body
    results = [w(buf, start, last, link, version) for w in WALKS]
    assert all(r == results[0] for r in results[1:]), results
    results = [w(memoryview(buf), 0, 0, rec.NO_LINK, version) for w in WALKS]
    assert all(r == results[0] for r in results[1:]), results


def test_walk_is_the_compiled_twin_when_built() -> None:
    assert walk_c is not None, "csnd.changelog._frames was not built (is a C compiler installed?)"
    if os.environ.get("CSND_IMPL", "").lower() == "python":  # (asked for the twin)
        assert rec.walk is rec.walk_py
    else:
        assert rec.walk is walk_c
