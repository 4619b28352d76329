"""One CSN names one global transaction, and a global transaction has one CSN on every node.

The merge checks both as each node's transaction arrives (its first batch):
against the transactions buffered now (waiting or being assembled) and
against the gids it emitted recently (`RecentGids`, bounded), which catches
a second node's part that arrives after the first node's was emitted.  A
breach is a `CsnOrderViolation` naming both nodes: the GTM or the commit
markers are wrong.  Pure bookkeeping, no I/O.
"""

from __future__ import annotations

from csnd.coordinator.batch import NodeBatch
from csnd.coordinator.gids import RecentGids
from csnd.core.errors import CsnOrderViolation
from csnd.core.ids import Csn, lsn_to_str


class TxnIdentities:
    """Which global transaction each buffered CSN and gid names, and the gids emitted recently."""

    __slots__ = ("by_csn", "by_gid", "_recent")

    def __init__(self, recent_gids: int) -> None:
        # Transactions buffered in the merge: csn -> (gid, node index), gid -> (csn, node index).
        # (The merge adds to them itself, once per transaction, on its hot path.)
        self.by_csn: dict[int, tuple[str | None, int]] = {}
        self.by_gid: dict[str, tuple[int, int]] = {}
        # Recently emitted gids -> (csn, node name).
        self._recent: RecentGids[tuple[int, str]] = RecentGids(recent_gids)

    def check_new(self, node: str, batch: NodeBatch, names: list[str]) -> None:
        """`batch`, the first of a transaction of `node`, must agree with the others on its CSN and gid.

        `names`: the merge's node names by index.
        """
        csn, gid = batch.csn, batch.gid
        other = self.by_csn.get(csn)
        if other is not None and other[0] != gid:
            raise CsnOrderViolation(
                f"csn {csn} is transaction {gid} on node {node} (xid {batch.xid}, commit "
                f"{lsn_to_str(batch.commit_lsn)}) but transaction {other[0]} on node {names[other[1]]}; "
                "one csn must name one global transaction: check the gtm",
                node=node,
                lsn=batch.commit_lsn,
                xid=batch.xid,
            )
        if gid is None:
            return
        seen = self.by_gid.get(gid)
        if seen is not None:
            other_csn, other_node = seen[0], names[seen[1]]
        else:
            emitted = self._recent.get(gid)
            if emitted is None:
                return
            other_csn, other_node = emitted
        if other_csn != csn:
            raise CsnOrderViolation(
                f"global transaction {gid} has csn {csn} on node {node} (xid {batch.xid}, commit "
                f"{lsn_to_str(batch.commit_lsn)}) but csn {other_csn} on node {other_node}; a global "
                "transaction commits with one csn on every node: check the gtm and the commit markers",
                node=node,
                lsn=batch.commit_lsn,
                xid=batch.xid,
            )

    def emitted(self, csn: Csn, gid: str | None, first_node: str) -> None:
        """The transaction at `csn` left the merge; `first_node`: its first participant's name."""
        del self.by_csn[csn]
        if gid is not None:
            del self.by_gid[gid]
            self._recent.add(gid, (csn, first_node))

    def _check(self, buffered: set[int]) -> None:
        """Assert the invariants; `buffered`: the CSNs of every transaction the merge holds."""
        assert set(self.by_csn) == buffered, (sorted(self.by_csn), sorted(buffered))
        assert {g for g, _ in self.by_csn.values() if g is not None} == set(self.by_gid)
        for gid, (csn, _i) in self.by_gid.items():
            assert self.by_csn[csn][0] == gid
        self._recent._check()
