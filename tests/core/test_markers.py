"""The csn marker grammar (csnd.core.markers): one strict reading for writers and the sender.

Oracle: a marker is well formed exactly when it matches the docs/design.md section 2
table read strictly -- ASCII, single spaces, a gid of visible characters, a
number of decimal digits within range.  The regular expression below is that
reading written independently of the parser; Hypothesis throws well-formed
markers, mutated ones and arbitrary text at both and they must agree.
"""

from __future__ import annotations

import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.core import markers
from csnd.core.errors import MalformedMarker, MarkerError, ProtocolError
from csnd.core.markers import CID_MAX, CSN_MAX, Marker, format_marker, parse_marker
from csnd.sender import NodeSender

_GID = r"[!-~]+"
_NUM = r"[0-9]+"
_GRAMMAR = re.compile(
    rf"(?:(committing|commit) ({_GID}) ({_NUM})|(abort) ({_GID})|(cid|tick) ({_NUM}))\Z", re.ASCII
)


def _oracle(text: str) -> Marker | None:
    """What the table says `text` is, or None if it is not a marker."""
    m = _GRAMMAR.fullmatch(text)
    if m is None:
        return None
    if m.group(1):
        kind, gid, value = m.group(1), m.group(2), int(m.group(3))
    elif m.group(4):
        kind, gid, value = "abort", m.group(5), None
    else:
        kind, gid, value = m.group(6), None, int(m.group(7))
    limit = CID_MAX if kind == "cid" else CSN_MAX
    if value is not None and value > limit:
        return None
    return Marker(kind, gid, value)  # type: ignore[arg-type]


gids = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=20)
csns = st.integers(0, CSN_MAX)


@st.composite
def good_markers(draw: st.DrawFn) -> Marker:
    kind = draw(st.sampled_from(markers.KINDS))
    if kind in ("committing", "commit"):
        return Marker(kind, draw(gids), draw(csns))
    if kind == "abort":
        return Marker(kind, draw(gids), None)
    if kind == "cid":
        return Marker(kind, None, draw(st.integers(0, CID_MAX)))
    return Marker(kind, None, draw(csns))


@given(good_markers())
def test_round_trip(m: Marker) -> None:
    text = format_marker(m)
    assert parse_marker(text) == m
    assert parse_marker(text.encode("ascii")) == m
    assert _oracle(text) == m


# The mutations the two old readings disagreed on, and their relatives.
_MUTATIONS = [
    lambda t: t.replace(" ", "  ", 1),  # an empty field
    lambda t: " " + t,
    lambda t: t + " ",
    lambda t: t + "\n",
    lambda t: t.replace(" ", "\t", 1),
    lambda t: re.sub(r"(\d)$", r"_\1", t),  # 1_000
    lambda t: re.sub(r" (\d+)$", r" -\1", t),  # a sign
    lambda t: re.sub(r" (\d+)$", r" +\1", t),
    lambda t: re.sub(r" (\d+)$", r" ١\1", t),  # noqa: RUF001 (a non-ascii digit, on purpose)
    lambda t: re.sub(r" (\d+)$", r" 0x\1", t),
    lambda t: t.split(" ")[0],  # fields missing
    lambda t: t + " 1",  # one too many
    lambda t: t.upper(),
    lambda t: t.replace(" ", " é", 1),
]


@given(good_markers(), st.sampled_from(_MUTATIONS))
def test_every_malformed_variant_is_refused(m: Marker, mutate: object) -> None:
    text = mutate(format_marker(m))  # type: ignore[operator]
    want = _oracle(text)
    if want is not None:  # (a mutation that happens to give another valid marker)
        assert parse_marker(text) == want
        return
    with pytest.raises(MalformedMarker) as ei:
        parse_marker(text, node="dn1", lsn=0x16B3748, xid=745)
    err = ei.value
    assert repr(text[:120]) in str(err)  # the content is named
    assert str(err).startswith("node dn1: malformed csn marker")
    assert (err.node, err.lsn, err.xid) == ("dn1", 0x16B3748, 745)
    assert isinstance(err, MarkerError) and isinstance(err, ProtocolError) and isinstance(err, ValueError)
    assert str(pickle.loads(pickle.dumps(err))) == str(err)


@given(st.text(max_size=40) | st.from_regex(_GRAMMAR, fullmatch=True))
def test_parser_agrees_with_the_table(text: str) -> None:
    want = _oracle(text)
    if want is None:
        with pytest.raises(MalformedMarker):
            parse_marker(text)
    else:
        assert parse_marker(text) == want


@given(st.binary(max_size=30))
def test_bytes_that_are_not_a_marker_are_refused(raw: bytes) -> None:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        with pytest.raises(MalformedMarker, match="not ascii"):
            parse_marker(raw)
        return
    want = _oracle(text)
    if want is None:
        with pytest.raises(MalformedMarker):
            parse_marker(raw)
    else:
        assert parse_marker(raw) == want


@pytest.mark.parametrize(
    "text",
    ["commit  5", "tick -5", "tick 1_000", "tick 18446744073709551616", "cid 4294967296", "abort g 1"],
)
def test_what_the_two_readings_disagreed_on(text: str) -> None:
    """The writer's helpers took these (Python's int()), the sender did not: now neither does."""
    with pytest.raises(MalformedMarker):
        parse_marker(text)


@pytest.mark.parametrize(
    "write",
    [
        lambda: markers.commit("", 5),
        lambda: markers.commit("g 1", 5),
        lambda: markers.committing("g\n", 5),
        lambda: markers.tick(-5),
        lambda: markers.tick(CSN_MAX + 1),
        lambda: markers.cid(CID_MAX + 1),
        lambda: markers.abort("é"),
        lambda: markers.tick(True),
    ],
)
def test_writer_cannot_write_what_the_reader_refuses(write: object) -> None:
    with pytest.raises(MalformedMarker):
        write()  # type: ignore[operator]


def test_writer_and_sender_use_the_one_grammar() -> None:
    import csnd.gtm.writer as writer
    import csnd.sender.markers as sender_markers

    assert vars(writer)["markers"] is markers

    assert vars(sender_markers)["parse_fields"] is markers.parse_fields  # (parse_marker's tuple form)
    NodeSender("dn1", "gtm")  # (imports fine with it)
