"""The decoder's output unit: one decoded row change (decoder -> sender contract).

A decoder worker turns each raw `reader.pgoutput.Change` / `Truncate` into one
`DecodedChange` per affected table.  The change's user-facing fields are
serialised *in the worker* (that is the CPU-heavy step we parallelise), as the
JSON text that follows `"cid": N, ` in a change object of docs/design.md section 7,
without its closing brace:

    '"lsn": "0/16B3600", "op": "insert", "schema": "public", "table": "acct", "key": ["id"], "old": null,
     "new": {"id": 7}'

(plus `, "unchanged": ["doc"]` when TOAST columns were left unchanged).  The
coordinator only joins bodies with `}, {"node": .., "cid": .., ` -- it never
re-serialises values, nor formats an LSN per change.

`DecodedItem` (at the end) names the whole contract: every kind of item the
decoder pool yields and the sender takes.
"""

from __future__ import annotations

from typing import TypeAlias, final

from csnd.core.ids import Lsn, Xid
from csnd.reader.pgoutput import (
    Begin,
    Commit,
    Keepalive,
    LogicalMessage,
    Origin,
    Relation,
    ScannedTxn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    TypeMsg,
)


# final: the sender dispatches on `type(item) is DecodedChange`, which a subclass
# would slip past; being final also lets mypy narrow on that test both ways.
@final
class DecodedChange:
    __slots__ = ("lsn", "xid", "op", "body")

    def __init__(self, lsn: Lsn, xid: Xid | None, op: str, body: str) -> None:
        self.lsn = lsn  # dataStart of the XLogData frame that carried the change
        self.xid = xid  # the (sub)transaction xid inside a stream block, else None
        self.op = op  # "insert" | "update" | "delete" | "truncate"
        self.body = body

    def __reduce__(self) -> tuple[object, ...]:
        return (DecodedChange, (self.lsn, self.xid, self.op, self.body))

    def __repr__(self) -> str:
        return f"DecodedChange({self.lsn}, {self.xid}, {self.op!r}, {self.body!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecodedChange) and (self.lsn, self.xid, self.op, self.body) == (
            other.lsn,
            other.xid,
            other.op,
            other.body,
        )

    def __hash__(self) -> int:
        return hash((self.lsn, self.xid, self.op, self.body))


@final  # (as DecodedChange)
class DecodedRun:
    """Consecutive decoded row changes of one (sub)transaction, in stream order.

    What the decoder pool hands the sender on its hot path: one object per
    run of changes between two other stream events instead of one
    `DecodedChange` each, so the coordinator's process spends a few list
    operations per run, not a Python call per change.  `xid` is as in
    `DecodedChange` (the subtransaction inside a stream block, else None);
    `lsns[i]` and `bodies[i]` belong to the i-th change.  `op` is "truncate"
    for the tables of one TRUNCATE (one body each, all at its LSN), else
    "row": a run's row changes keep no op of their own (their bodies say it).
    """

    __slots__ = ("xid", "lsns", "bodies", "op")

    def __init__(self, xid: Xid | None, lsns: list[Lsn], bodies: list[str], op: str = "row") -> None:
        if len(lsns) != len(bodies):
            raise ValueError(f"a run of {len(lsns)} changes with {len(bodies)} bodies")
        self.xid = xid
        self.lsns = lsns
        self.bodies = bodies
        self.op = op

    def changes(self) -> list[DecodedChange]:
        """The run as single changes (for the message of an error about one)."""
        return [
            DecodedChange(lsn, self.xid, self.op, b) for lsn, b in zip(self.lsns, self.bodies, strict=True)
        ]

    def __len__(self) -> int:
        return len(self.lsns)

    def __repr__(self) -> str:
        return f"DecodedRun(xid={self.xid}, n={len(self.lsns)}, first={self.lsns[0] if self.lsns else None})"


# A complete non-streamed transaction of row changes, as far as its stream says:
# Begin, positions, Commit -- a `reader.pgoutput.ScannedTxn` (a NamedTuple), so
# that the transactions a live reader scanned go on to the sender with no object
# per transaction.  When its node is the only one (and in
# single-node CSN mode, where the commit LSN is the CSN), the decoder pool
# hands a transaction whose Begin, row changes and Commit fell in one batch,
# with nothing else between them, to a worker whole, and the worker writes its
# transaction line (`csnd.core.lines`) where it decoded the changes.  Its
# `lsns` are the changes' positions (as in `DecodedRun`), never empty; its
# `blob` is not read past the pool (it may be None).
WholeTxn: TypeAlias = ScannedTxn


@final  # (as DecodedChange)
class WholeTxns:
    """Consecutive whole transactions (`WholeTxn`) of one batch, and their lines, written by the workers.

    One item for all of them, so the sender orders a run of them in one
    call and the coordinator appends their lines in one: neither builds an
    object per change, nor per transaction, nor formats a line.
    """

    __slots__ = ("txns", "lines")

    def __init__(self, txns: list[WholeTxn], lines: list[str]) -> None:
        if len(txns) != len(lines):
            raise ValueError(f"{len(txns)} whole transactions with {len(lines)} lines")
        self.txns = txns
        self.lines = lines

    def __len__(self) -> int:
        return len(self.txns)

    def __repr__(self) -> str:
        first = f"xid {self.txns[0].xid}" if self.txns else None
        return f"WholeTxns(n={len(self.txns)}, first={first})"


# What the decoder pool hands on as the reader framed it: every pgoutput
# message but the row changes (Change, ChangeFrames) and truncates, which it
# decodes, and keepalives (which carry the server's WAL end).
PassThroughItem: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | TypeMsg
    | LogicalMessage
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | Keepalive
)

# One item of a node's decoded stream, in stream order: what `DecoderPool.run`
# yields (besides its batch marks) and `NodeSender.feed` takes.  Decoded changes
# come in runs only: a run of row changes, a TRUNCATE's tables, or whole
# transactions with their lines.
DecodedItem: TypeAlias = DecodedRun | WholeTxns | PassThroughItem
