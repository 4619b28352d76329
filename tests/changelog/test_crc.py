"""The changelog's CRC-32 of a large buffer is zlib's, whichever library computes it."""

from __future__ import annotations

import os
import zlib

from hypothesis import given
from hypothesis import strategies as st

from csnd.changelog.crc import LARGE, crc32


@given(
    size=st.sampled_from([0, 1, LARGE - 1, LARGE, LARGE + 1, 3 * LARGE + 7]),
    seed=st.binary(min_size=1, max_size=64),
    value=st.integers(0, 2**32 - 1),
)
def test_equals_zlibs_for_every_size_and_start(size: int, seed: bytes, value: int) -> None:
    data = (seed * (size // len(seed) + 1))[:size]
    assert crc32(data, value) == zlib.crc32(data, value)
    assert crc32(memoryview(data), value) == zlib.crc32(data, value)


def test_a_large_buffer_in_parts_equals_it_whole() -> None:
    data = os.urandom(5 * LARGE + 3)
    running = 0
    for at in range(0, len(data), LARGE + 1000):
        running = crc32(data[at : at + LARGE + 1000], running)
    assert running == zlib.crc32(data) == crc32(data)
