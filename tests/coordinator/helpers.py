"""Hand-built batches for the coordinator's example tests."""

from __future__ import annotations

from csnd.coordinator import NodeBatch
from csnd.core.ids import Csn, Lsn, Xid

CLOCK = 848_656_800_000_000  # 2026-11-22T10:00:00+00:00 in µs since 2000-01-01


def batch(
    csn: int,
    gid: str | None = None,
    *,
    cid: int = 0,
    tags: tuple[str, ...] = (),
    last: bool = True,
    xid: int = 700,
    lsn: int = 0x16B3600,
    time: int = CLOCK,
) -> NodeBatch:
    """A batch of `csn` whose changes' bodies are `"tag": "<tag>"` (one change per tag)."""
    gid = f"g-{csn}" if gid is None else gid
    changes = [(cid, lsn + 0x10 * j, f'"tag": "{t}"') for j, t in enumerate(tags)]
    return NodeBatch(Csn(csn), gid, Xid(xid), Lsn(lsn + 0x100), Lsn(lsn + 0x130), time, cid, changes, last)


def tags(txn: object) -> list[str]:
    """The tags of a GlobalTxn's changes, in output order."""
    from csnd.coordinator import GlobalTxn

    assert isinstance(txn, GlobalTxn)
    return [body.split('"')[3] for _, _, _, body in txn.changes]
