"""A transaction of one node between its Begin (or first Stream Start) and its commit.

The node sender keeps one `OpenTxn` per transaction it has begun and not
yet committed or aborted: the non-streamed one between Begin and Commit, and
every streamed one by its top-level xid (their changes interleave with other
transactions', block by block).  It buffers the changes (`TxnBuffer`,
spilling beyond a memory bound) and what the csn markers said of it.
"""

from __future__ import annotations

from csnd.core.errors import TruncatedStream
from csnd.core.ids import Csn, Lsn, Xid, lsn_to_str
from csnd.sender.txnbuf import TxnBuffer


class OpenTxn:
    """An open transaction: its buffer, its command id, its commit marker, where it began."""

    __slots__ = ("xid", "buf", "cid", "gid", "csn", "marker_sub", "first_lsn", "final_lsn")

    def __init__(self, xid: Xid, buf: TxnBuffer, first_lsn: Lsn, final_lsn: Lsn | None) -> None:
        self.xid = xid
        self.buf = buf
        self.cid = 0  # command id of the following changes (0 before any cid marker)
        self.gid: str | None = None  # from the commit marker
        self.csn = Csn(0)
        self.marker_sub: Xid | None = None  # subtransaction that carried the commit marker
        self.first_lsn = first_lsn
        self.final_lsn = final_lsn  # Begin's final LSN (non-streamed only)


def open_at_end(
    node: str, last_lsn: Lsn, cur: OpenTxn | None, block: OpenTxn | None, streams: dict[int, OpenTxn]
) -> TruncatedStream | None:
    """The error for a stream that ended with a transaction open (None: nothing was open).

    `cur`: the non-streamed transaction, `block` the transaction of the open
    stream block, `streams` every streamed one; `last_lsn` the last position
    the stream reached.
    """
    if cur is not None:
        return TruncatedStream(
            f"stream ended inside transaction {cur.xid} (begun at {lsn_to_str(cur.first_lsn)}, "
            f"{cur.buf.n_changes} changes so far); the stream is truncated",
            node=node,
            lsn=last_lsn or cur.first_lsn,
            xid=cur.xid,
        )
    if block is not None:
        return TruncatedStream(
            f"stream ended inside a stream block of transaction {block.xid} (streaming since "
            f"{lsn_to_str(block.first_lsn)}); the stream is truncated",
            node=node,
            lsn=last_lsn or block.first_lsn,
            xid=block.xid,
        )
    if streams:
        t = min(streams.values(), key=lambda o: o.first_lsn)
        more = len(streams) - 1
        return TruncatedStream(
            f"stream ended with streamed transaction {t.xid} (streaming since "
            f"{lsn_to_str(t.first_lsn)}) neither committed nor aborted"
            + (f", and {more} more" if more else "")
            + "; the stream is truncated",
            node=node,
            lsn=last_lsn or t.first_lsn,
            xid=t.xid,
        )
    return None
