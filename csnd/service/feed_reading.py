"""Where a stream starts reading the changelog: a start out of range or damaged fails before any answer.

Subscribe and a subscription's reset open the changelog here, with the
first record read ahead: a start that retention dropped ends the call with
OUT_OF_RANGE, and damage with DATA_LOSS, before the stream says where it
starts, never half-way through it.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from csnd.core.errors import ChangelogCorrupt, CsnOutOfRange
from csnd.service.feed_aborts import damaged, out_of_range
from csnd.service.feed_messages import chain
from csnd.service.feed_ports import RecordReader, StoredRecord


def read_from(log: RecordReader, after: int, max_bytes: int) -> Iterator[StoredRecord]:
    """The records after `after`, a record over `max_bytes` in pieces; csn 0 is csn 0 (strict)."""
    return log.read_pieced(after, whole_up_to=max_bytes, strict=True)


def open_at(
    log: RecordReader, after: int, max_bytes: int, context: grpc.ServicerContext, name: str = ""
) -> Iterator[StoredRecord]:
    """`log.read(after)` with its first record already read, so a start out of range fails here.

    csn 0 is csn 0 here, not "the oldest retained" (`open_oldest`):
    `name`'s mark at 0 with records after 0 dropped is a gap, OUT_OF_RANGE.
    """
    try:
        records = read_from(log, after, max_bytes)
        first = next(records, None)
    except CsnOutOfRange as e:
        out_of_range(context, after, e, name)
    except ChangelogCorrupt as e:
        damaged(context, e)
    if first is None:
        return iter(())
    return chain(first, records)


def open_oldest(
    log: RecordReader, max_bytes: int, context: grpc.ServicerContext
) -> tuple[int, Iterator[StoredRecord]]:
    """A start at the oldest retained: where that is (the csn before it), and the records after it."""
    for attempt in (0, 1):
        after = log.oldest_after_csn
        try:
            records = read_from(log, after, max_bytes)
            first = next(records, None)
        except CsnOutOfRange as e:
            if attempt:  # (retention ran between the look and the read, twice)
                out_of_range(context, after, e)
            continue
        except ChangelogCorrupt as e:
            damaged(context, e)
        return after, iter(()) if first is None else chain(first, records)
    raise AssertionError("unreachable: the second attempt returns or aborts")
