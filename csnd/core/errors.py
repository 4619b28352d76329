"""The one error tree of csnd.

Every error carries the node, LSN and xid it concerns (when known) and a
lowercase message that says what happened, where, and what to do.  Errors are
picklable -- they cross process boundaries from decoder workers -- so every
constructor argument is kept in `args` (`__reduce__` below).

    CsndError
    ├── ConfigError            bad command line or service configuration
    │   └── UsageError         a flag or CSND_* variable of the wrong type (exit 2, as argparse)
    ├── StreamFormatError      a recorded stream file that cannot be read
    │   └── TruncatedFrame     it ends inside a frame, or a frame claims more than it holds
    ├── ProtocolError          a message sequence that breaks the protocol
    │   ├── DecodeError        tuple data that cannot be turned into values
    │   ├── TimestampError     a commit time outside the dates the output can write
    │   ├── FrameError         a CopyData payload or pgoutput message that does not parse
    │   ├── MessageOutOfPlace  a message where the protocol allows none (Begin inside a
    │   │                      transaction, a change outside one, a batch after the end)
    │   ├── TruncatedStream    the stream ended inside a transaction or with one committing
    │   ├── LsnOrderViolation  positions that go backwards, or lie beyond their commit
    │   ├── CsnOrderViolation  csns that break the gtm's order (backwards, reused, two for a gid)
    │   ├── MarkerError        a csn marker in the wrong place, mode or transaction
    │   │   └── MalformedMarker  one that does not follow the marker grammar
    │   └── AckError           a client acknowledged what it was never sent (a csn, a confirm lsn)
    ├── SourceError            a live source failed (connection, slot, server)
    │   ├── ConnectionLost     the connection dropped; the reader may reconnect
    │   ├── SlotLost           the slot is gone (dropped, or invalidated): its WAL cannot be read
    │   └── SnapshotError      an initial snapshot cannot be taken, or one was cut short
    ├── WorkerError            a decoder worker died or failed
    ├── OutputError            the output could not be written (disk full, I/O error)
    │   └── SpillError         a big transaction's spill file (csnd.sender.txnbuf)
    ├── InternalError          a bug in csnd: an invariant broke, an exception nobody expected
    ├── ChangelogCorrupt       a changelog damaged before its tail (names file and offset)
    │   └── IndexMismatch      an index entry that misses its record (the index is rebuilt)
    ├── CsnOutOfRange          a read from a CSN that retention has dropped
    ├── GlobalCommitError      a global transaction the gtm writer could not see through (csnd.gtm.writer)
    │   ├── CommitInDoubt      its commit decision may or may not have reached the gtm
    │   └── CommitIncomplete   COMMIT PREPARED ran on some of its nodes but not on the others
    └── ChangefeedError        a changefeed consumer cannot go on (csnd.consumers.client)
        ├── ChangefeedUnavailable      nothing answers at the service's address
        ├── ChangefeedUnauthenticated  the service refused the token (or its absence)
        └── ChangefeedRejected         the service refused the request as malformed

Errors cross two boundaries.  Between processes (decoder workers) they are
pickled, with the worker's traceback attached as `__cause__` on arrival
(`RemoteTraceback`, the pattern of CPython's concurrent.futures.process).
Over gRPC (node agent -> coordinator) they travel as plain fields:
`to_wire` / `from_wire` keep the class (by name), node, LSN, xid and message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from csnd.core.ids import lsn_to_str


class CsndError(Exception):
    """Base of every error csnd raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        lsn: int | None = None,
        xid: int | None = None,
    ) -> None:
        self.message = message
        self.node = node
        self.lsn = lsn
        self.xid = xid
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.node is not None:
            where.append(f"node {self.node}")
        text = self.message
        if self.xid is not None and "xid" not in text and "transaction" not in text:
            text = f"{text} (xid {self.xid})"
        if self.lsn is not None and lsn_to_str(self.lsn) not in text:
            text = f"{text} at {lsn_to_str(self.lsn)}"
        return ": ".join([*where, text])

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.node, self.lsn, self.xid, self.__dict__))

    def where(self, *, node: str | None = None, lsn: int | None = None, xid: int | None = None) -> CsndError:
        """A copy of this error (same class) with the node, LSN and xid it did not know filled in."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("message", "node", "lsn", "xid")}
        return _rebuild(
            type(self),
            self.message,
            self.node if self.node is not None else node,
            self.lsn if self.lsn is not None else lsn,
            self.xid if self.xid is not None else xid,
            state,
        )


def _rebuild(
    cls: type[CsndError],
    message: str,
    node: str | None,
    lsn: int | None,
    xid: int | None,
    state: dict[str, Any],
) -> CsndError:
    err = cls.__new__(cls)
    CsndError.__init__(err, message, node=node, lsn=lsn, xid=xid)
    err.__dict__.update(state)
    return err


class ConfigError(CsndError):
    """The command line or configuration cannot work; nothing was started."""


class UsageError(ConfigError):
    """The command was called wrong: a value of a flag or `CSND_*` variable it cannot take.

    Found after argparse is done (an environment variable standing in for a
    flag), it ends the command as argparse's own usage errors do: exit 2.
    """


class StreamFormatError(CsndError):
    """A recorded stream file is malformed: bad magic, bad header, truncated frame."""

    # (class defaults: an error rebuilt by `from_wire` has only the rendered message)
    path: str | None = None
    offset: int | None = None

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        node: str | None = None,
        lsn: int | None = None,
        xid: int | None = None,
    ) -> None:
        self.path = path
        self.offset = offset
        if path is not None:
            message = f"{path}: {message}"
        if offset is not None:
            message = f"{message} (frame at byte offset {offset})"
        super().__init__(message, node=node, lsn=lsn, xid=xid)


class TruncatedFrame(StreamFormatError):
    """The file ends inside a frame (a torn last write), or a frame claims more than the file holds."""


class ProtocolError(CsndError):
    """The stream breaks the replication, pgoutput or csn marker protocol (or a client the changefeed's)."""


class DecodeError(ProtocolError):
    """Tuple data that cannot be decoded into values (or a type we cannot read)."""


class TimestampError(ProtocolError):
    """A commit timestamp outside years 1-9999 (`csnd.core.ids.PG_TIME_MIN_US`..`PG_TIME_MAX_US`): a corrupt stream."""

    def __init__(
        self,
        us: int,
        *,
        node: str | None = None,
        lsn: int | None = None,
        xid: int | None = None,
        path: str | None = None,
    ) -> None:
        self.us = us
        self.path = path
        where = f"{path}: " if path else ""
        what = f"transaction {xid}" if xid is not None else "a transaction"
        super().__init__(
            f"{where}commit timestamp of {what} is {us} microseconds from 2000-01-01, outside the "
            "years 1-9999 the output can write; the stream is corrupt",
            node=node,
            lsn=lsn,
            xid=xid,
        )


class FrameError(ProtocolError):
    """A CopyData payload or pgoutput message that cannot be parsed."""


class MessageOutOfPlace(ProtocolError):
    """A message the protocol does not allow where it came: a Begin inside a transaction,
    a change outside one, a stream block that never started, a batch after its node ended."""


class TruncatedStream(ProtocolError):
    """The stream ended inside a transaction, a stream block, or with a transaction committing."""


class LsnOrderViolation(ProtocolError):
    """Positions that break the WAL's order: a change's dataStart going backwards inside its
    transaction or lying beyond its commit, a commit LSN other than its Begin announced."""


class CsnOrderViolation(ProtocolError):
    """CSNs that break the gtm protocol: going backwards, below a promised watermark,
    one CSN for two transactions, two CSNs for one gid."""


class MarkerError(ProtocolError):
    """A csn marker that breaks the gtm protocol: in single-node mode, outside a transaction,
    a second commit marker, a transaction without one, cids going backwards."""


class MalformedMarker(MarkerError, ValueError):
    """A csn marker whose content does not follow the grammar of docs/design.md section 2.

    Also a ValueError: the marker helpers raised ValueError for bad text
    before the grammar had its own error, and callers may still catch that.
    """


class AckError(ProtocolError):
    """A client acknowledged what it was never sent (INVALID_ARGUMENT): a changefeed client a CSN,
    a coordinator a node agent's confirm LSN (which would move the slot over WAL nobody read)."""


class SourceError(CsndError):
    """A live source failed in a way a reconnect will not fix."""


class ConnectionLost(SourceError):
    """The replication connection dropped; the live reader reconnects with backoff."""


class SlotLost(SourceError):
    """The replication slot a node is read through is gone: dropped, or invalidated by the server.

    The WAL after the slot's confirmed position may already be removed, so
    no reconnect and no new slot can deliver what committed after it: the
    source fails for good (never a silent gap, never a reconnect loop).
    `lsn` is the last position confirmed to the slot.
    """


class SnapshotError(SourceError):
    """An initial snapshot (`csnd.snapshot`) could not be taken or completed, or a changelog holds one cut short.

    Names the node and the table (`table`, "schema.table", when one is
    concerned) and the LSN of the slot's consistent point.  Never retried: an
    exported snapshot cannot be imported again once its connection is gone.
    """

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        lsn: int | None = None,
        xid: int | None = None,
        table: str | None = None,
    ) -> None:
        self.table = table
        if table is not None and table not in message:
            message = f"table {table}: {message}"
        super().__init__(message, node=node, lsn=lsn, xid=xid)


class BarrierError(SnapshotError):
    """A GTM commit barrier (`csnd.gtm.barrier`) could not finish: released, naming what held it.

    `gid`: the global transaction it waited for, when one did (a writer stuck
    between taking its CSN and committing); `node`: the node that failed.
    """

    def __init__(self, message: str, *, node: str | None = None, gid: str | None = None) -> None:
        self.gid = gid
        super().__init__(message, node=node)


class WorkerError(CsndError):
    """A decoder worker process died or raised; the run stops."""


class ChangelogCorrupt(CsndError):
    """A changelog file is damaged somewhere a torn write cannot explain; nothing is skipped."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None) -> None:
        self.path = path
        self.offset = offset
        if path is not None:
            message = f"{path}: {message}"
        if offset is not None:
            message = f"{message} (at byte offset {offset})"
        super().__init__(message)


class IndexMismatch(ChangelogCorrupt):
    """An index entry points at bytes that are not its record.

    Caught inside the changelog, which rebuilds the segment's index from the
    segment and seeks again; only a mismatch the rebuild does not cure reaches
    a reader, as ChangelogCorrupt.
    """


class CsnOutOfRange(CsndError):
    """Records after the CSN asked for were dropped by retention (gRPC OUT_OF_RANGE)."""

    def __init__(self, message: str, *, csn: int | None = None, oldest_csn: int | None = None) -> None:
        self.csn = csn
        self.oldest_csn = oldest_csn
        super().__init__(message)


class SubscriptionError(CsndError):
    """A named subscription cannot be changed as asked."""


class SubscriptionNotFound(SubscriptionError):
    """The service stores no named subscription of that name (gRPC NOT_FOUND)."""


class SubscriptionBusy(SubscriptionError):
    """A stream holds the subscription now: its consumer must stop first (gRPC FAILED_PRECONDITION)."""


class GlobalCommitError(CsndError):
    """A global transaction the gtm writer side (`csnd.gtm.writer`) could not see through its commit.

    Names the gid and its commit CSN; the transaction is left prepared for
    `csnd gtm recover` or an operator, never half forgotten.
    """

    # (class defaults: an error rebuilt by `from_wire` has only the rendered message)
    gid: str | None = None
    csn: int | None = None


class CommitInDoubt(GlobalCommitError):
    """Recording the commit decision failed: it may or may not be durable.

    The txn is prepared on every node and left so; `csnd gtm recover`
    commits it if the decision reached the GTM and rolls it back otherwise.
    """

    reason: str = ""

    def __init__(self, gid: str, csn: int, reason: str) -> None:
        self.gid = gid
        self.csn = csn
        self.reason = reason
        super().__init__(
            f"global transaction {gid} (csn {csn}) is in doubt: its commit decision may not have "
            f"reached the gtm ({reason}); it stays prepared on every node until csnd gtm recover runs"
        )


class CommitIncomplete(GlobalCommitError):
    """COMMIT PREPARED failed on some nodes after it succeeded on others.

    The txn is committed where `committed` says and still prepared (with its
    commit marker) on `pending`; run `COMMIT PREPARED '<gid>@<node>'` there.
    The error's node is the first of `pending`, where COMMIT PREPARED failed.
    """

    committed: Sequence[str] = ()
    pending: Sequence[str] = ()

    def __init__(self, gid: str, csn: int, committed: list[str], pending: list[str]) -> None:
        self.gid = gid
        self.csn = csn
        self.committed = committed
        self.pending = pending
        super().__init__(
            f"global transaction {gid} (csn {csn}) is committed on {committed or 'no node'} but still "
            f"prepared on {pending}; run COMMIT PREPARED '{gid}@<node>' there",
            node=pending[0] if pending else None,
        )


class ChangefeedError(CsndError):
    """A consumer of the changefeed cannot go on; reconnecting would not help."""


class ChangefeedUnavailable(ChangefeedError):
    """Nothing answers at the service's address (at the first connect, or for too long after)."""


class ChangefeedUnauthenticated(ChangefeedError):
    """The service wants a bearer token this consumer does not have (gRPC UNAUTHENTICATED)."""


class ChangefeedRejected(ChangefeedError):
    """The service refused the request itself, e.g. a malformed table filter (INVALID_ARGUMENT)."""


class OutputError(CsndError):
    """The output (a file, a pipe, the changelog, a spill file) could not be written: disk full, I/O error."""


class SpillError(OutputError):
    """A spill file could not be written or read back (full disk, I/O error, truncation)."""


class InternalError(CsndError):
    """A bug in csnd: an invariant broke or an exception nobody expected was raised."""


class RemoteTraceback(Exception):
    """A traceback formatted in another process, attached as `__cause__` of the error it raised.

    As CPython's `concurrent.futures.process._RemoteTraceback`: the error
    stays one clean line; the traceback shows where Python prints causes
    (and with `-v`), not pasted into the message.
    """

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class WireError(NamedTuple):
    """An error as plain fields, for a wire that cannot carry Python objects (gRPC)."""

    error_class: str
    message: str
    node: str | None
    lsn: int | None
    xid: int | None


def to_wire(e: BaseException) -> WireError:
    """`e` as fields `from_wire` rebuilds; an exception that is not ours travels as an InternalError."""
    if isinstance(e, CsndError):
        return WireError(type(e).__name__, e.message, e.node, e.lsn, e.xid)
    return WireError("InternalError", f"unexpected {type(e).__name__}: {e}", None, None, None)


def from_wire(w: WireError) -> CsndError:
    """The error `to_wire` described: its class by name (an unknown name: CsndError), node, LSN, xid."""
    cls = _by_name().get(w.error_class, CsndError)
    return _rebuild(cls, w.message, w.node, w.lsn, w.xid, {})


def _by_name() -> dict[str, type[CsndError]]:
    """Every class of the tree by name, subclasses defined elsewhere included (looked up when used)."""
    found: dict[str, type[CsndError]] = {}
    todo: list[type[CsndError]] = [CsndError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return found


def os_error_text(e: OSError) -> str:
    """An OSError that none of our own errors covers, as one plain line: `cannot use PATH: reason`."""
    what = f"cannot use {e.filename}: " if e.filename else ""
    return f"{what}{e.strerror or e}"
