"""`_feedwire.batch_message` against protobuf's own serialization of the same batch."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service import feed_messages
from csnd.service.feed_messages import batch_of
from csnd.service.server import _bytes_or

try:
    from csnd.service._feedwire import batch_message
except ImportError:  # (reported by test_the_compiled_batch_writer_is_built)
    batch_message = None  # type: ignore[assignment]

records = st.lists(
    st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 300), st.binary(max_size=300) | st.just(b"")),
    max_size=20,
)


def test_the_compiled_batch_writer_is_built() -> None:
    assert batch_message is not None, "csnd.service._feedwire was not built (is a C compiler installed?)"
    if os.environ.get("CSND_IMPL", "").lower() != "python":
        assert feed_messages._feedwire is not None


@given(batch=records)
def test_the_bytes_are_protobufs_own_for_both_responses(batch: list[tuple[int, bytes]]) -> None:
    assert batch_message is not None
    got = batch_message(batch)
    assert got == batch_of(batch, pb.SubscribeResponse).SerializeToString()
    assert got == batch_of(batch, pb.FetchResponse).SerializeToString()
    back = pb.SubscribeResponse.FromString(got)
    assert [(t.csn, t.line, t.more) for t in back.batch.transactions] == [
        (c, line, False) for c, line in batch
    ]


def test_what_is_no_record_is_a_clear_error() -> None:
    assert batch_message is not None
    with pytest.raises(OverflowError):
        batch_message([(-1, b"x")])
    with pytest.raises(OverflowError):
        batch_message([(2**64, b"x")])
    with pytest.raises(TypeError, match=r"\(csn, line bytes\) tuple"):
        batch_message([(1, "text")])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"\(csn, line bytes\) tuple"):
        batch_message([[1, b"x"]])  # type: ignore[list-item]


def test_the_served_methods_pass_bytes_through_and_serialize_messages() -> None:
    serialize = _bytes_or(pb.SubscribeResponse.SerializeToString)
    keepalive = pb.SubscribeResponse(keepalive=pb.FeedKeepalive(send_time_us=5))
    assert serialize(b"\x0a\x00") == b"\x0a\x00"
    assert serialize(keepalive) == keepalive.SerializeToString()
