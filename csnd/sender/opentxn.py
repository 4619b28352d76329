"""A transaction of one node between its Begin (or first Stream Start) and its commit.

The node sender keeps one `OpenTxn` per transaction it has begun and not
yet committed or aborted: the non-streamed one between Begin and Commit, and
every streamed one by its top-level xid (their changes interleave with other
transactions', block by block).  It buffers the changes (`TxnBuffer`,
spilling beyond a memory bound) and what the csn markers said of it.
"""

from __future__ import annotations

from csnd.core.errors import InternalError, LsnOrderViolation, TruncatedStream
from csnd.core.ids import MAX_LSN, Csn, Lsn, Xid, lsn_to_str
from csnd.sender.txnbuf import TxnBuffer


class OpenTxn:
    """An open transaction: its buffer, its command id, its commit marker, where it began."""

    __slots__ = (
        "xid",
        "buf",
        "cid",
        "gid",
        "csn",
        "marker_sub",
        "first_lsn",
        "final_lsn",
        "last_lsn",
        "bound",
        "watermark",
    )

    def __init__(self, xid: Xid, buf: TxnBuffer, first_lsn: Lsn, final_lsn: Lsn | None) -> None:
        self.xid = xid
        self.buf = buf
        self.cid = 0  # command id of the following changes (0 before any cid marker)
        self.gid: str | None = None  # from the commit marker
        self.csn = Csn(0)
        self.marker_sub: Xid | None = None  # subtransaction that carried the commit marker
        self.first_lsn = first_lsn
        self.final_lsn = final_lsn  # Begin's final LSN (non-streamed only)
        # The dataStart of its last change (0: none yet), and what none may pass: the
        # commit LSN Begin announced, or for a streamed transaction none known before
        # its Stream Commit (which checks `last_lsn` then).
        self.last_lsn = Lsn(0)
        self.bound = final_lsn if final_lsn is not None else MAX_LSN
        # It carries an incremental snapshot's high watermark (csnd.snapshot.watermark): released
        # even without changes, since the snapshot's rows are attached to it downstream.
        self.watermark = False


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


def position_error(node: str, txn: OpenTxn, lsns: list[Lsn], sub: Xid | None) -> LsnOrderViolation:
    """The error for changes at `lsns` (the next ones of `txn`) whose positions break the WAL's order.

    A change's dataStart is where its WAL record starts: inside one
    transaction they never go backwards (equal is fine: a multi-insert gives
    several rows one LSN), and none lies beyond the transaction's commit
    record.  Either means a corrupt or spliced stream; the output would show
    the change where it cannot have been.
    """
    prev = txn.last_lsn
    of = f"transaction {txn.xid}" + (f" (subtransaction {sub})" if sub is not None and sub != txn.xid else "")
    for lsn in lsns:
        if lsn < prev:
            return LsnOrderViolation(
                f"change at {lsn_to_str(lsn)} in {of} follows a change at {lsn_to_str(prev)}: "
                "a change's position never goes backwards inside its transaction; the stream is corrupt",
                node=node,
                lsn=lsn,
                xid=txn.xid,
            )
        if lsn > txn.bound:
            return LsnOrderViolation(
                f"change at {lsn_to_str(lsn)} in {of} lies beyond the transaction's commit at "
                f"{lsn_to_str(txn.bound)}; the stream is corrupt",
                node=node,
                lsn=lsn,
                xid=txn.xid,
            )
        prev = lsn
    raise InternalError(  # (the caller checked: unreachable)
        f"changes at {', '.join(map(lsn_to_str, lsns))} of {of} reported out of order but are not", node=node
    )
