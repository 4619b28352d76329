"""What the decoder pool and its worker processes send each other, typed in one place.

    pool ──► a worker's inbox (a bounded Queue):  DecodeBatch | ApplyMeta | Sync | Stop
    pool ◄── its result pipe:                     Decoded | Failed

A message crosses per batch, not per change: a `DecodeBatch` carries a
batch's work as `Wire` entries, plain tuples of five tagged by their second
field, because a class per entry would cost a Python-level call per change
(or per transaction) to pickle in the pool's process -- the one serial step
-- and another to unpickle in the worker, where a tuple crosses as fast as
anything can.  The tags and the layout of each entry are here; the pool
builds the entries inline on its hot path (`decoder.pool`) and
`decoder.worker.decode_batch` reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, final

from csnd.core.errors import CsndError
from csnd.core.ids import Lsn, Xid
from csnd.reader.pgoutput import Relation, Truncate, TypeMsg

# The tags of a `Wire` entry besides a single change's own kind ('I', 'U', 'D').
RUN: Final = "F"  # a run of change frames (`reader.pgoutput.ChangeFrames`)
WHOLE: Final = "W"  # a scanned whole transaction, all its changes in one run: decoded into its line
LINE: Final = "L"  # after a whole transaction's changes: they become its line
TRUNCATE: Final = "T"

# One entry of a `DecodeBatch`, by its tag:
#   (lsn, 'I' | 'U' | 'D', xid, relid, tuple data)      one row change (`Change`)
#   (lsn, RUN, xid, (in_stream, head), blob)             the frames of a `ChangeFrames` run
#   (commit_lsn, WHOLE, xid, commit_time, blob)          a whole transaction (4-byte head frames)
#   (n, LINE, xid, commit_lsn, commit_time)              the last n bodies are one transaction's
#   (lsn, TRUNCATE, xid, options, relids)                a Truncate
# `xid` is a change's (sub)transaction inside a stream block, else None; a
# transaction's own xid in WHOLE and LINE.
ChangeWire: TypeAlias = tuple[Lsn, str, Xid | None, int, bytes]
RunWire: TypeAlias = tuple[Lsn, Literal["F"], Xid | None, tuple[bool, int], bytes]
WholeWire: TypeAlias = tuple[Lsn, Literal["W"], Xid, int, bytes]
LineWire: TypeAlias = tuple[int, Literal["L"], Xid, Lsn, int]
TruncateWire: TypeAlias = tuple[Lsn, Literal["T"], Xid | None, int, tuple[int, ...]]
Wire: TypeAlias = ChangeWire | RunWire | WholeWire | LineWire | TruncateWire


def truncate_wire(lsn: Lsn, msg: Truncate) -> TruncateWire:
    """A Truncate's entry (the others are built inline on the hot path)."""
    return (lsn, TRUNCATE, msg.xid, msg.options, msg.relids)


# --- to a worker --------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class DecodeBatch:
    """The changes of one batch, in stream order; answered with `Decoded` (or `Failed`)."""

    wires: list[Wire]


@final
@dataclass(frozen=True, slots=True)
class ApplyMeta:
    """A Relation or Type message, broadcast to every worker in stream order; no answer.

    Each inbox is FIFO, so a worker takes it in before any later change of
    the table (docs/design.md section 1).
    """

    lsn: Lsn
    message: Relation | TypeMsg


@final
@dataclass(frozen=True, slots=True)
class Sync:
    """The end of the stream: answered with an empty `Decoded` once all before it is applied, or `Failed`."""


@final
@dataclass(frozen=True, slots=True)
class Stop:
    """Leave now: the pool is closing."""


ToWorker: TypeAlias = DecodeBatch | ApplyMeta | Sync | Stop

# --- from a worker ------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Decoded:
    """A batch's results, in the order of its entries: a body (str) per change, a list per Truncate, a line per whole transaction."""

    bodies: list[str | list[str]]


@final
@dataclass(frozen=True, slots=True)
class Failed:
    """The worker's error, in place of its next answer; it decodes nothing more and waits to be stopped.

    `traceback` is the worker's, which the pool raises the error from.
    """

    error: CsndError
    traceback: str


FromWorker: TypeAlias = Decoded | Failed
