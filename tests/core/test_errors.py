"""The error tree (csnd.core.errors): classes by cause, pickling, and the trip over the wire."""

from __future__ import annotations

import pickle

import pytest

from csnd.coordinator.wire import end_from_pb, end_to_pb
from csnd.core import errors as E
from csnd.core.errors import (
    CsndError,
    CsnOrderViolation,
    InternalError,
    ProtocolError,
    StreamFormatError,
    TruncatedStream,
    WireError,
    from_wire,
    to_wire,
)
from csnd.proto.agent.v1 import agent_pb2 as pb

BY_CAUSE = [
    E.FrameError,
    E.MessageOutOfPlace,
    E.TruncatedStream,
    E.LsnOrderViolation,
    E.CsnOrderViolation,
    E.MarkerError,
    E.MalformedMarker,
    E.DecodeError,
]


@pytest.mark.parametrize("cls", BY_CAUSE)
def test_protocol_causes_are_protocol_errors(cls: type[CsndError]) -> None:
    """`except ProtocolError` and `except CsndError` keep catching every protocol cause."""
    err = cls("stream ended inside transaction 745", node="dn2", lsn=0x16B3748, xid=745)
    assert isinstance(err, ProtocolError) and isinstance(err, CsndError)
    assert str(err) == "node dn2: stream ended inside transaction 745 at 0/16B3748"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and str(back) == str(err)


def test_output_and_internal_errors_are_not_protocol_errors() -> None:
    assert not issubclass(E.OutputError, ProtocolError) and issubclass(E.OutputError, CsndError)
    assert not issubclass(InternalError, ProtocolError) and issubclass(InternalError, CsndError)


@pytest.mark.parametrize("cls", [*BY_CAUSE, CsndError, InternalError, E.WorkerError, E.ConfigError])
def test_wire_round_trip_keeps_class_node_lsn_xid(cls: type[CsndError]) -> None:
    err = cls("csn 7 went backwards", node="dn3", lsn=0x1_0000_0010, xid=4_000_000_000)
    back = from_wire(to_wire(err))
    assert type(back) is cls
    assert (back.message, back.node, back.lsn, back.xid) == (err.message, "dn3", 0x1_0000_0010, 4_000_000_000)
    assert str(back) == str(err)
    # and through the protobuf End message the node agent sends
    msg = pb.End.FromString(end_to_pb(err).SerializeToString())
    assert msg.error == str(err)
    wired = end_from_pb(msg)
    assert type(wired) is cls and str(wired) == str(err)
    assert (wired.node, wired.lsn, wired.xid) == ("dn3", 0x1_0000_0010, 4_000_000_000)


def test_wire_without_position() -> None:
    back = end_from_pb(pb.End.FromString(end_to_pb(TruncatedStream("cut short")).SerializeToString()))
    assert type(back) is TruncatedStream and (back.node, back.lsn, back.xid) == (None, None, None)


def test_wire_unknown_class_becomes_csnd_error() -> None:
    back = from_wire(WireError("ErrorOfANewerVersion", "something new", "dn1", 5, None))
    assert type(back) is CsndError and str(back) == "node dn1: something new at 0/5"


def test_wire_foreign_exception_is_an_internal_error() -> None:
    back = end_from_pb(end_to_pb(ZeroDivisionError("division by zero")))
    assert type(back) is InternalError
    assert str(back) == "unexpected ZeroDivisionError: division by zero"


def test_wire_end_of_an_older_agent() -> None:
    """An agent without the fields sends only the line: it still ends the run as a CsndError."""
    back = end_from_pb(pb.End(error="node dn1: boom"))
    assert type(back) is CsndError and str(back) == "node dn1: boom"
    assert end_from_pb(pb.End()) is None
    assert end_from_pb(end_to_pb(None)) is None


def test_stream_format_error_over_the_wire() -> None:
    err = StreamFormatError("the recording was cut short", path="/x/dn1.pgstream", offset=96, node="dn1")
    back = from_wire(to_wire(err))
    assert type(back) is StreamFormatError and str(back) == str(err)


def test_where_fills_in_only_what_is_missing() -> None:
    err = CsnOrderViolation("csn 7 after csn 9", lsn=0x10)
    filled = err.where(node="dn2", lsn=0x20, xid=9)
    assert type(filled) is CsnOrderViolation
    assert (filled.node, filled.lsn, filled.xid) == ("dn2", 0x10, 9)
    assert str(filled) == "node dn2: csn 7 after csn 9 (xid 9) at 0/10"


# The errors raised outside csnd.core.errors's own callers: each picklable, in the tree, with its fields.
JOINED = [
    (
        E.TruncatedFrame(
            "frame 7: truncated last frame", path="/x/dn1.pgstream", offset=96, node="dn1", lsn=0x16B3748
        ),
        E.StreamFormatError,
        {"path": "/x/dn1.pgstream", "offset": 96},
    ),
    (
        E.CommitInDoubt("g17", 4321, "server closed the connection"),
        E.GlobalCommitError,
        {"gid": "g17", "csn": 4321, "reason": "server closed the connection"},
    ),
    (
        E.CommitIncomplete("g18", 4322, ["dn1"], ["dn2", "dn3"]),
        E.GlobalCommitError,
        {"gid": "g18", "csn": 4322, "committed": ["dn1"], "pending": ["dn2", "dn3"], "node": "dn2"},
    ),
    (
        E.AckError("acknowledged csn 99, but the newest transaction sent is csn 3"),
        ProtocolError,
        {},
    ),
    (
        E.IndexMismatch("no record of csn 12 where the index puts it", path="/cl/0001.log", offset=4096),
        E.ChangelogCorrupt,
        {"path": "/cl/0001.log", "offset": 4096},
    ),
]


@pytest.mark.parametrize(("err", "parent", "fields"), JOINED, ids=lambda x: type(x).__name__)
def test_joined_errors_pickle_with_their_fields(
    err: CsndError, parent: type[CsndError], fields: dict[str, object]
) -> None:
    assert isinstance(err, parent) and isinstance(err, CsndError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert (back.node, back.lsn, back.xid) == (err.node, err.lsn, err.xid)
    for name, value in fields.items():
        assert getattr(back, name) == value
    assert type(from_wire(to_wire(err))) is type(err)


def test_joined_errors_say_where() -> None:
    assert str(E.CommitIncomplete("g18", 4322, ["dn1"], ["dn2"])).startswith(
        "node dn2: global transaction g18"
    )
    assert str(E.IndexMismatch("no record of csn 12", path="/cl/0001.log", offset=4096)) == (
        "/cl/0001.log: no record of csn 12 (at byte offset 4096)"
    )
