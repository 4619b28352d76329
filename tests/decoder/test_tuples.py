"""TupleData splitting: round trips against the one encoder, and corrupt input.

`reader.pgoutput.encode_tuple` defines the wire form; splitting must be its
exact inverse, and anything short of a whole, well-formed tuple must be a
`DecodeError` -- never a short value or another exception.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import DecodeError
from csnd.decoder.tuples import UNCHANGED, TupleValue, split_delete, split_insert, split_tuple, split_update
from csnd.reader import pgoutput as p

text_values = st.text(st.characters(codec="utf-8")).filter(lambda s: s != UNCHANGED)
column = st.one_of(st.none(), st.just(UNCHANGED), st.binary(max_size=40), text_values)
columns = st.lists(column, max_size=12)


def _data(message: bytes) -> bytes:
    """A change's tuple data, as the reader hands it over."""
    m = p.parse_message(message, False)
    assert isinstance(m, p.Change)
    return m.data


def _same(got: list[TupleValue], want: list[TupleValue]) -> None:
    assert got == want
    assert [type(v) for v in got] == [type(v) for v in want]
    assert [v is UNCHANGED for v in got] == [v is UNCHANGED for v in want]


@given(columns, st.binary(max_size=8))
def test_split_tuple_inverts_encode_tuple(values: list[TupleValue], prefix: bytes) -> None:
    data = prefix + p.encode_tuple(values) + b"trailing"
    got, end = split_tuple(data, len(prefix))
    _same(got, values)
    assert data[end:] == b"trailing"


@given(columns)
def test_insert(new: list[TupleValue]) -> None:
    _same(split_insert(_data(p.encode_insert(16384, new))), new)


@given(columns, st.none() | columns, st.sampled_from("KO"))
def test_update(new: list[TupleValue], old: list[TupleValue] | None, kind: str) -> None:
    old_kind, got_old, got_new = split_update(_data(p.encode_update(16384, new, old, kind)))
    _same(got_new, new)
    if old is None:
        assert old_kind is None and got_old is None
    else:
        assert old_kind == kind and got_old is not None
        _same(got_old, old)


@given(columns, st.sampled_from("KO"))
def test_delete(old: list[TupleValue], kind: str) -> None:
    old_kind, got = split_delete(_data(p.encode_delete(16384, old, kind)))
    assert old_kind == kind
    _same(got, old)


@settings(max_examples=200)
@given(st.lists(column, min_size=1, max_size=6), st.data())
def test_every_truncation_is_an_error(values: list[TupleValue], data: st.DataObject) -> None:
    whole = b"N" + p.encode_tuple(values)
    cut = data.draw(st.integers(0, len(whole) - 1))
    with pytest.raises(DecodeError):
        split_insert(whole[:cut])


@settings(max_examples=500)
@given(st.binary(max_size=64), st.sampled_from([split_insert, split_update, split_delete]))
def test_garbage_raises_only_decode_error(data: bytes, split: object) -> None:
    with contextlib.suppress(DecodeError):
        split(data)  # type: ignore[operator]


def test_values_are_slices_of_the_right_kind() -> None:
    data = p.encode_tuple([b"\x00\x01", "é", None, UNCHANGED, b"", ""])
    got, end = split_tuple(data, 0)
    assert end == len(data)
    assert got == [b"\x00\x01", "é", None, UNCHANGED, b"", ""]
    assert got[3] is UNCHANGED


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated at offset 0: expected 'N'"),
        (b"X\x00\x00", "expected 'N' at offset 0, found 'X'"),
        (b"N\x00", "no column count"),
        (b"N\xff\xff", "negative column count -1"),
        (b"N\x00\x02n", "truncated after 1 of 2 columns"),
        (b"N\x00\x01t\x00\x00", "truncated in the length of column 1"),
        (b"N\x00\x01t\x00\x00\x00\x05abc", "column 1 of 1 needs 5 bytes at offset 8, 3 left"),
        (b"N\x00\x01b\xff\xff\xff\xff", "needs -1 bytes"),
        (b"N\x00\x01x", "column 1 of 1 has unknown kind 'x' (0x78)"),
        (b"N\x00\x01t\x00\x00\x00\x01\xff", "text value of column 1 is not valid utf-8"),
        (b"N\x00\x00extra", "5 bytes after the last tuple"),
    ],
)
def test_insert_errors(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError) as info:
        split_insert(data)
    assert message in str(info.value)
    assert str(info.value)[0].islower()


def test_update_and_delete_errors() -> None:
    with pytest.raises(DecodeError, match="update data truncated at offset 3: expected 'N'"):
        split_update(b"K\x00\x00")
    with pytest.raises(DecodeError, match="corrupt update data: expected 'N' at offset 0, found 'Q'"):
        split_update(b"Q\x00\x00")
    with pytest.raises(DecodeError, match="corrupt delete data: expected 'K' or 'O' at offset 0, found 'N'"):
        split_delete(b"N\x00\x00")
    with pytest.raises(DecodeError, match="found nothing"):
        split_delete(b"")
    with pytest.raises(DecodeError, match="1 bytes after the last tuple"):
        split_delete(b"O\x00\x00N")
