"""Planning on the driver: where a micro-batch ends and how its CSN range is split.

    latestOffset(start, limit) ─► end = newest durable, or the csn of the
                                   N-th transaction after start (limit N)
    partitions(start, end)      ─► (start, b1] (b1, b2] ... (bk, end]

Offsets are CSNs (`{"csn": N}`): everything with csn <= N is in earlier
micro-batches.  A transaction has one csn, so any half-open CSN range holds
whole transactions, and a micro-batch's end is always the csn of a
transaction (or the newest durable csn): a transaction larger than the limit
is still delivered whole -- the unit is a transaction, as the unit of Spark's
Kafka source is a record.

Transactions are not dense in CSN (in single-node mode a CSN is a commit
LSN), so splitting by arithmetic can leave partitions empty or uneven; when
the driver has seen CSNs of the range (while counting for a limit), it cuts
at those instead, so every partition holds about as many transactions.
Either way the partitions cover (start, end] exactly, without overlap.

Pure: no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def offset(csn: int) -> dict[str, int]:
    return {"csn": csn}


def offset_csn(value: object) -> int:
    """The csn of an offset as Spark hands it back (a dict from JSON); ValueError otherwise."""
    if isinstance(value, dict):
        csn = value.get("csn")
        if isinstance(csn, int) and not isinstance(csn, bool) and csn >= 0:
            return csn
    raise ValueError(
        f"{value!r} is not a csnd offset ({{'csn': N}}); was the checkpoint written by another source?"
    )


def split_range(
    start: int, end: int, parts: int, seen: Sequence[int] = (), floor: int = 0
) -> list[tuple[int, int]]:
    """(start, end] as up to `parts` consecutive half-open ranges (lo, hi], none empty by arithmetic.

    `seen`: ascending csns of transactions known to lie in (start, end]; cuts
    are taken at evenly spaced ones.  Without them the span is cut evenly,
    beginning at `floor` when start is below it (start 0 means "from the
    oldest retained", whose csn the caller passes as floor - 1 ... end).
    """
    if end <= start:
        return []
    parts = max(1, parts)
    cuts: list[int] = []
    if seen:
        inside = [c for c in seen if start < c <= end]
        n = len(inside)
        if n:
            k = min(parts, n)
            # The i-th range ends at the transaction that completes its share.
            cuts = [inside[(n * i) // k - 1] for i in range(1, k)]
    else:
        lo = max(start, floor)
        span = end - lo
        k = min(parts, span)
        cuts = [lo + (span * i) // k for i in range(1, k)]
    bounds = [start, *sorted(set(c for c in cuts if start < c < end)), end]
    return list(itertools.pairwise(bounds))


def end_after(start: int, csns: Sequence[int], limit: int | None, newest: int) -> int:
    """The end offset of a micro-batch starting after `start`.

    csns: ascending csns of the transactions after `start` that the driver
    counted (at least `limit` of them when that many exist, else all up to
    `newest`).  With a limit, the end is the csn of the limit-th transaction;
    otherwise (or with fewer) the newest durable csn.  Never before `start`.
    """
    if limit is not None and len(csns) >= limit:
        return max(start, csns[limit - 1])
    return max(start, newest)
