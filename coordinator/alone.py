"""What the merge checks of one node's transactions, for a node whose transactions skip the merge.

`csnd replay` of a single node writes the sender's released transactions
straight out: the merge of one stream is the identity.  The sender already
guarantees most of what `CsnMerge` re-checks of a node (CSNs above its own
watermark, cids that never decrease inside a transaction), but two checks
are the merge's own and stay here: CSNs strictly increase, and a gid names
one transaction -- the same gid again with another CSN is a GTM or writer
bug, which the sender, once it has released a transaction, no longer sees.
Pure: no I/O.
"""

from __future__ import annotations

from collections import deque

from coordinator.merge import DEFAULT_RECENT_GIDS
from csnd.errors import ProtocolError
from csnd.ids import lsn_to_str


class AloneOrder:
    """The order checks for the transactions of `node`, the only one; `recent_gids` as in `CsnMerge`."""

    __slots__ = ("node", "recent_gids", "last_csn", "_recent", "_recent_order")

    def __init__(self, node: str, recent_gids: int = DEFAULT_RECENT_GIDS) -> None:
        self.node = node
        self.recent_gids = recent_gids
        self.last_csn = -1
        self._recent: dict[str, int] = {}  # gid -> csn, the last `recent_gids` transactions with one
        self._recent_order: deque[str] = deque()

    def check(self, csn: int, gid: str | None, xid: int, commit_lsn: int) -> None:
        """Take the next transaction of the node; raises ProtocolError if it breaks the order."""
        if csn <= self.last_csn:
            raise ProtocolError(
                f"{_what(csn, gid, xid, commit_lsn)} was released after csn {self.last_csn}; a node must send its transactions "
                "in strictly increasing csn order",
                node=self.node,
                lsn=commit_lsn,
                xid=xid,
            )
        if gid is not None and self.recent_gids:
            earlier = self._recent.get(gid)
            if earlier is not None:
                raise ProtocolError(
                    f"{_what(csn, gid, xid, commit_lsn)}: global transaction {gid} already committed on this node with csn {earlier}; "
                    "a gid names one transaction: check the gtm and the commit markers",
                    node=self.node,
                    lsn=commit_lsn,
                    xid=xid,
                )
            self._recent[gid] = csn
            self._recent_order.append(gid)
            if len(self._recent_order) > self.recent_gids:
                del self._recent[self._recent_order.popleft()]
        self.last_csn = csn


def _what(csn: int, gid: str | None, xid: int, commit_lsn: int) -> str:
    return f"transaction {gid + ' ' if gid else ''}(xid {xid}, csn {csn}, commit {lsn_to_str(commit_lsn)})"
