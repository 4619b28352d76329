"""changelog: the service's durable, CSN-ordered log of transactions (docs/design.md section 5).

    CsnMerge ─► json_line ─► Changelog.append(csn, line) ... sync() ─► durable_csn ─► confirm slots
                                      │
                  DIR/0000000000000001-0000000000000001.log  (+ .idx)   segments, oldest first
                  DIR/0000000000000002-00000000000003e8.log  (+ .idx)   ... the active one last
                  DIR/LOCK                                              one service per DIR (flock)
                  DIR/subscriptions.json                                SubscriptionStore
                  DIR/relations.jsonl                                   RelationStore
                                      │
    Changelog.read(after_csn) ◄───────┘  bisect the segments' first CSNs, then the segment's index

Modelled on etcd's WAL (segments named by sequence and first index, framed
and CRC-checked records, a torn tail found and cut on open) and Kafka's log
(a sparse offset index beside each segment, rebuilt when damaged; retention
drops whole segments by size and age; consumer offsets stored durably).

File format (record.py has the details, and why the CRC is chained as it is):
a segment is a 40-byte header (b"CSNDCLOG", version 2, sequence, first CSN,
the CSN before it, CRC) followed by records: a 32-byte head (mark, CRC-32 of
the rest, the CRC of the record before it, payload length, CSN, append time
in microseconds) and the payload, the docs/design.md section 7 JSON line.
Version-1 segments (a 28-byte head naming no predecessor) are still read.  Its index `.idx` is b"CSNDIDX1" and
(csn, offset) pairs, one per 4 KiB of segment.

record.py        pure: frames, headers, names, index entries, tail scans
segment.py       one segment file: open and repair, verify, read records
log.py           Changelog: the one class callers hold, each job handed to a part:
  lock.py          the directory's flock
  opening.py       the segments found on open, checked as a chain, made durable
  writer.py        SegmentWriter: frames placed in segments, rolled, written
  pieces.py        PiecedRecords: a record too large to hold, appended in pieces
  sync.py          SyncPoint: what one group commit's fsync covers, and the fsync
  view.py          ReaderView: reads, lag counts and waits on the durable segments
  retainer.py      Retainer: retention.py's plan carried out
  guard.py         WriteGuard: after one failed write or fsync, every later one is refused
retention.py     pure: which old segments retention drops, and which holders hold
subscriptions.py SubscriptionStore: durable named offsets
relations.py     RelationStore: every relation version (column names and types), durable

Public API: the names in `__all__`, and the modules that name the
directory's files (`clock`, `lock`, `record`, `relations`, `subscriptions`:
`csnd changelog` reads a directory by them).  The other modules are the
parts of Changelog, its own.
"""

from csnd.changelog.behind import SyncBehind
from csnd.changelog.log import DEFAULT_INDEX_INTERVAL, DEFAULT_SEGMENT_BYTES, Changelog
from csnd.changelog.relations import RelationEntry, RelationStore
from csnd.changelog.segment import RecordPieces
from csnd.changelog.subscriptions import SubscriptionStore

__all__ = [
    "DEFAULT_INDEX_INTERVAL",
    "DEFAULT_SEGMENT_BYTES",
    "Changelog",
    "RecordPieces",
    "RelationEntry",
    "RelationStore",
    "SubscriptionStore",
    "SyncBehind",
    "clock",
    "lock",
    "record",
    "relations",
    "subscriptions",
]
