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

from csnd.coordinator.gids import RecentGids, txn_name
from csnd.coordinator.merge import DEFAULT_RECENT_GIDS
from csnd.core.errors import CsnOrderViolation
from csnd.core.ids import Csn, Lsn, Xid


class AloneOrder:
    """The order checks for the transactions of `node`, the only one; `recent_gids` as in `CsnMerge`."""

    __slots__ = ("node", "last_csn", "_recent")

    def __init__(self, node: str, recent_gids: int = DEFAULT_RECENT_GIDS) -> None:
        self.node = node
        self.last_csn = Csn(-1)
        self._recent: RecentGids[int] = RecentGids(recent_gids)  # gid -> csn

    def check(self, csn: Csn, gid: str | None, xid: Xid, commit_lsn: Lsn) -> None:
        """Take the next transaction of the node; raises CsnOrderViolation if it breaks the order."""
        if csn <= self.last_csn:
            raise CsnOrderViolation(
                f"{txn_name(gid, xid, csn, commit_lsn)} was released after csn {self.last_csn}; "
                "a node must send its transactions in strictly increasing csn order",
                node=self.node,
                lsn=commit_lsn,
                xid=xid,
            )
        if gid is not None:
            earlier = self._recent.get(gid)
            if earlier is not None:
                raise CsnOrderViolation(
                    f"{txn_name(gid, xid, csn, commit_lsn)}: global transaction {gid} already committed "
                    f"on this node with csn {earlier}; a gid names one transaction: check the gtm and the "
                    "commit markers",
                    node=self.node,
                    lsn=commit_lsn,
                    xid=xid,
                )
            self._recent.add(gid, csn)
        self.last_csn = csn

    def take_run(self, csns: list[Csn]) -> bool:
        """Take the next transactions of the node, without gids (single-node mode), if they are in order.

        False, with nothing taken, if one of them breaks the order: then
        `check` them one by one, which raises at that one.
        """
        last = self.last_csn
        for csn in csns:
            if csn <= last:
                return False
            last = csn
        self.last_csn = last
        return True
