"""What the changefeed's streams carry, as the client hands it on: lines, relation lines, large lines.

A transaction's line too large for one message comes in pieces (docs/design.md
section 8, `more`): `Joining` gathers them, in memory or spooled to a
temporary file, and `WholeLines` joins them for Fetch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import IO, Final, NamedTuple

from csnd.core.errors import ChangefeedError
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb

Record = tuple[int, bytes]
# Pieces of a large line are joined in memory up to this size; past it (in
# `next_spooled`) they go on in a temporary file.
SPOOL_MEMORY_BYTES: Final = 8 << 20

__all__ = ["SPOOL_MEMORY_BYTES", "LargeLine", "Record", "RelationRecord", "WholeLines"]


class Piece(NamedTuple):
    """A piece of a line too large for one message (docs/design.md section 8, `more`)."""

    csn: int
    data: bytes
    more: bool


class LargeLine:
    """A line that came in pieces, spooled (`ChangefeedClient.next_spooled`): read it as a binary file.

    It is read once, before the next call to the changefeed, which closes it.
    """

    def __init__(self, file: IO[bytes], size: int) -> None:
        self.file = file
        self.size = size

    def read(self, n: int = -1) -> bytes:
        return self.file.read(n)

    def close(self) -> None:
        self.file.close()


class Joining:
    """The pieces of one large line received so far: in memory, or spooled to a temporary file."""

    def __init__(self, csn: int, spool: bool) -> None:
        self.csn = csn
        self.size = 0
        self.parts: list[bytes] | None = None if spool else []
        self.file = tempfile.SpooledTemporaryFile(SPOOL_MEMORY_BYTES) if spool else None  # noqa: SIM115

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.parts is not None:
            self.parts.append(data)
        else:
            assert self.file is not None
            self.file.write(data)

    def line(self) -> bytes | LargeLine:
        if self.parts is not None:
            return b"".join(self.parts)
        assert self.file is not None
        self.file.seek(0)
        return LargeLine(self.file, self.size)

    def drop(self) -> None:
        if self.file is not None:
            self.file.close()


class RelationRecord(NamedTuple):
    """A relation line (not a transaction): the version of a table in force from the transaction at `csn` on."""

    csn: int
    line: bytes


class Relations(list[RelationRecord]):
    """(inbox item: a batch of relation lines)"""


class WholeLines:
    """The lines of Fetch's batches, a line sent in pieces (`more`, docs/design.md section 8) once it is whole.

    A piece of another csn before a line's last piece is a ChangefeedError
    naming `sender` (the service, as the caller calls it).
    """

    def __init__(self, sender: str) -> None:
        self.sender = sender
        self.csn: int | None = None  # the line whose pieces are being joined
        self.pieces: list[bytes] = []

    def of(self, batch: pb.TransactionBatch) -> Iterator[Record]:
        for t in batch.transactions:
            if self.csn is None and not t.more:
                yield t.csn, t.line
                continue
            if self.csn is not None and t.csn != self.csn:
                raise ChangefeedError(
                    f"{self.sender} sent csn {t.csn} before the last piece of csn {self.csn}"
                )
            self.csn = t.csn
            self.pieces.append(t.line)
            if not t.more:
                line = b"".join(self.pieces)
                self.csn, self.pieces = None, []
                yield t.csn, line
