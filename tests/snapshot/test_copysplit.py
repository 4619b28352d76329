"""The compiled binary COPY splitter (`_copysplit.split_rows`) against its Python twin, for any bytes."""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.snapshot import _copysplit
from csnd.snapshot.copyrows import _split_rows_py

_field = st.one_of(
    st.none(),
    st.binary(max_size=10),
    st.integers(min_value=-5, max_value=40).map(lambda n: struct.pack("!i", n)),  # (a length that lies)
)


def _rows(draw_rows: list[list[bytes | None]]) -> bytes:
    out = []
    for row in draw_rows:
        out.append(struct.pack("!h", len(row)))
        for v in row:
            out.append(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v)
    return b"".join(out)


@given(
    rows=st.lists(st.lists(_field, max_size=5), max_size=6),
    tail=st.binary(max_size=12),
    start=st.integers(min_value=0, max_value=8),
    cut=st.integers(min_value=0, max_value=400),
)
@settings(max_examples=2000)
def test_split_rows_is_its_twin_on_any_bytes(
    rows: list[list[bytes | None]], tail: bytes, start: int, cut: int
) -> None:
    data = _rows(rows) + tail
    pos = min(start, len(data))
    end = max(pos, len(data) - cut) if cut <= len(data) else pos
    assert _copysplit.split_rows(data, pos, end) == _split_rows_py(data, pos, end)
    assert _copysplit.split_rows(bytearray(data), pos, end) == _split_rows_py(bytearray(data), pos, end)


@given(trailer=st.sampled_from([b"\xff\xff", b"\xff\xfe", b"\x80\x00", b"\x00"]))
def test_split_rows_reports_the_trailer_and_a_bad_count_as_its_twin(trailer: bytes) -> None:
    data = _rows([[b"ab", None]]) + trailer + b"zz"
    assert _copysplit.split_rows(data, 0, len(data)) == _split_rows_py(data, 0, len(data))
