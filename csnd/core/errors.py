"""The one error tree of csnd.

Every error carries the node, LSN and xid it concerns (when known) and a
lowercase message that says what happened, where, and what to do.  Errors are
picklable -- they cross process boundaries from decoder workers -- so every
constructor argument is kept in `args` (`__reduce__` below).

    CsndError
    ├── ConfigError          bad command line or service configuration
    ├── StreamFormatError    a recorded stream file that cannot be read
    ├── ProtocolError        a message sequence that breaks the protocol
    │   ├── DecodeError      tuple data that cannot be turned into values
    │   └── TimestampError   a commit time outside the dates the output can write
    ├── SourceError          a live source failed (connection, slot, server)
    │   └── ConnectionLost   the connection dropped; the reader may reconnect
    ├── WorkerError          a decoder worker died or failed
    ├── ChangelogCorrupt     a changelog damaged before its tail (names file and offset)
    ├── CsnOutOfRange        a read from a CSN that retention has dropped
    └── ChangefeedError      a changefeed consumer cannot go on (csnd.consumers.client)
        ├── ChangefeedUnavailable      nothing answers at the service's address
        ├── ChangefeedUnauthenticated  the service refused the token (or its absence)
        └── ChangefeedRejected         the service refused the request as malformed
"""

from __future__ import annotations

from typing import Any

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


class StreamFormatError(CsndError):
    """A recorded stream file is malformed: bad magic, bad header, truncated frame."""

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


class ProtocolError(CsndError):
    """The stream breaks the replication, pgoutput or csn marker protocol."""


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


class SourceError(CsndError):
    """A live source failed in a way a reconnect will not fix."""


class ConnectionLost(SourceError):
    """The replication connection dropped; the live reader reconnects with backoff."""


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


class CsnOutOfRange(CsndError):
    """Records after the CSN asked for were dropped by retention (gRPC OUT_OF_RANGE)."""

    def __init__(self, message: str, *, csn: int | None = None, oldest_csn: int | None = None) -> None:
        self.csn = csn
        self.oldest_csn = oldest_csn
        super().__init__(message)


class ChangefeedError(CsndError):
    """A consumer of the changefeed cannot go on; reconnecting would not help."""


class ChangefeedUnavailable(ChangefeedError):
    """Nothing answers at the service's address (at the first connect, or for too long after)."""


class ChangefeedUnauthenticated(ChangefeedError):
    """The service wants a bearer token this consumer does not have (gRPC UNAUTHENTICATED)."""


class ChangefeedRejected(ChangefeedError):
    """The service refused the request itself, e.g. a malformed table filter (INVALID_ARGUMENT)."""


def os_error_text(e: OSError) -> str:
    """An OSError that none of our own errors covers, as one plain line: `cannot use PATH: reason`."""
    what = f"cannot use {e.filename}: " if e.filename else ""
    return f"{what}{e.strerror or e}"
