"""Whole transactions cut into batches under a size bound (pure: no I/O, no clock).

One gRPC message per transaction costs a syscall-ish round of framing and a
Python call on each side, which caps a stream of one-row transactions well
below what the changelog can read; one message per backlog would hold
megabytes in memory at both ends and delay the first transaction.  A batch
holds whole transactions, in CSN order, until the next one would pass the
bound; a transaction larger than the bound travels alone (the channels allow
messages far larger than any bound used here).
"""

from __future__ import annotations

from typing import Final

# Size of one batch message.  Larger: fewer messages per transaction (more
# throughput for one-row transactions); smaller: less memory per subscriber
# and an earlier first transaction.  1 MiB holds ~2,000 one-row transactions.
MAX_BATCH_BYTES: Final = 1 << 20
# Framing of one transaction inside a batch message: the field tag and length
# of the Transaction, of its csn and of its line (at most 1 + 5 + 1 + 10 + 1 + 5).
TXN_OVERHEAD: Final = 24

Record = tuple[int, bytes]


def record_size(line: bytes) -> int:
    """What one transaction adds to a batch message, an upper bound."""
    return len(line) + TXN_OVERHEAD


class BatchBuilder:
    """Collects (csn, line) records; hands back a batch when the next one would not fit.

    `add` returns the finished batch (or None); `flush` returns what is
    pending -- the caller flushes when its source has nothing more for now,
    so a batch never waits for a record that has not arrived.  Every record
    handed in comes out exactly once, in order.
    """

    __slots__ = ("max_bytes", "_records", "_bytes")

    def __init__(self, max_bytes: int = MAX_BATCH_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self._records: list[Record] = []
        self._bytes = 0

    @property
    def pending(self) -> int:
        return len(self._records)

    def add(self, csn: int, line: bytes) -> list[Record] | None:
        size = record_size(line)
        done = None
        if self._records and self._bytes + size > self.max_bytes:
            done = self.flush()
        self._records.append((csn, line))
        self._bytes += size
        return done

    def flush(self) -> list[Record] | None:
        if not self._records:
            return None
        done = self._records
        self._records = []
        self._bytes = 0
        return done

    def _check(self) -> None:
        assert self._bytes == sum(record_size(line) for _, line in self._records)
        assert len(self._records) <= 1 or self._bytes <= self.max_bytes
        assert all(a[0] < b[0] for a, b in zip(self._records, self._records[1:], strict=False))
