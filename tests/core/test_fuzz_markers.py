"""Fuzzing the csn marker parser (csnd.core.markers) with what a damaged or hostile WAL may hold.

`tests/core/test_markers.py` checks the grammar against its table; this throws
bytes at it -- long numbers, long gids, mutated markers, arbitrary bytes --
and asks one thing: a `Marker` the table agrees with, or `MalformedMarker`
naming the content, the node, the LSN and the xid.  Never another exception.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.core.errors import MalformedMarker
from csnd.core.markers import format_marker, parse_fields, parse_marker
from tests.core.test_markers import _GRAMMAR, _oracle, good_markers

FUZZ = settings(max_examples=300, deadline=None)

# Numbers longer than any CSN, up to past Python's int-from-text limit (4300 digits).
long_numbers = st.integers(0, 6000).flatmap(
    lambda n: st.sampled_from(["0" * n + "1", "1" * n, "9" * n, "1" + "0" * n])
)


def _table(text: str) -> object:
    """`tests.core.test_markers._oracle`, for numbers too long for int() too: more than 20 digits is past any limit."""
    m = _GRAMMAR.fullmatch(text)
    if m is not None and m.group(4) is None:  # (a marker with a number)
        head, number = text.rsplit(" ", 1)
        if len(number.lstrip("0")) > 20:
            return None
        text = f"{head} {number.lstrip('0') or '0'}"  # (the same value, short enough for int())
    return _oracle(text)


def _parse(content: bytes | str) -> None:
    """`parse_marker` and `parse_fields` agree with the table, or refuse with a named MalformedMarker."""
    text = content.decode("latin-1") if isinstance(content, bytes) else content
    want = _table(text) if isinstance(content, str) or content.isascii() else None
    try:
        got = parse_marker(content, node="dn1", lsn=0x16B3748, xid=745)
    except MalformedMarker as e:
        assert want is None, (content, want)
        assert (e.node, e.lsn, e.xid) == ("dn1", 0x16B3748, 745)
        assert str(e).startswith("node dn1: malformed csn marker")
        return
    assert got == want
    assert tuple(got) == parse_fields(content)
    assert format_marker(got).split(" ")[:-1] == text.split(" ")[:-1]  # (numbers may lose leading zeros)


@FUZZ
@given(kind=st.sampled_from(["committing g", "commit g", "cid", "tick", "abort"]), number=long_numbers)
def test_a_number_of_any_length_is_a_value_or_refused(kind: str, number: str) -> None:
    """A marker number of thousands of digits used to raise a bare ValueError from int()."""
    _parse(f"{kind} {number}")
    _parse(f"{kind} {number}".encode("ascii"))


@FUZZ
@given(m=good_markers(), at=st.integers(0, 200), junk=st.binary(min_size=1, max_size=8), cut=st.booleans())
def test_a_mutated_marker_is_a_marker_or_refused(m: object, at: int, junk: bytes, cut: bool) -> None:
    raw = format_marker(m).encode("ascii")  # type: ignore[arg-type]
    at %= len(raw) + 1
    _parse(raw[:at] if cut else raw[:at] + junk + raw[at:])


@FUZZ
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_anything_is_a_marker_or_refused(content: bytes | str) -> None:
    _parse(content)
