"""The node sender's release rule: committed transactions out in CSN order, each with its confirmable LSN.

    committed (OpenTxn, or a WholeTxn with its line) ──► Releaser ──► [FinishedTxn, ...]
        csn markers: committing / abort / tick / settle ─►  │  CsnOrderer   (may it go yet?)
        idle keepalives                                 ─►  │  ConfirmableLsn (how far may
                                                            │  the slot be confirmed?)
                                                            └► RelationVersions (attached
                                                               to the first released)

The node sender's intake (`sender.node`) follows the stream's structure and
hands over each transaction as it commits; this module decides when it goes.
A transaction already durable downstream (`resume_csn`) is dropped; one
without changes and without a commit marker is skipped; one held back by a
smaller committing CSN waits in `ready` and holds the confirmable LSN back
meanwhile.  Pure: no I/O beyond closing a spilled transaction's buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

from csnd.core.errors import MarkerError, ProtocolError, TruncatedStream
from csnd.core.ids import Csn, Lsn, Xid, lsn_to_str
from csnd.decoder.change import WholeTxn, WholeTxns
from csnd.sender.confirmable import ConfirmableLsn
from csnd.sender.opentxn import OpenTxn
from csnd.sender.ordering import CsnOrderer
from csnd.sender.positions import all_in_place, commit_lsn_of, end_lsn_of, lsns_of, xid_of
from csnd.sender.relations import RelationVersions
from csnd.sender.txn import FinishedTxn, WrittenLines
from csnd.sender.txnbuf import TxnBuffer

Key = str | int  # gid in GTM mode, top-level xid in single-node mode

# Single-node mode's CSN is an LSN.  `int` itself, typed: `Csn(lsn)` would add a
# Python-level call per transaction for what is the same number.
as_csn: Final[Callable[[int], Csn]] = int  # type: ignore[assignment]


class Releaser:
    """Releases one node's committed transactions in CSN order (see the module docstring).

    `gtm`: CSNs come from commit markers (else a transaction's CSN is its
    commit LSN); `resume_csn`: every transaction with a CSN at or below it is
    durable downstream already; `settling`: release nothing until `settle`.
    """

    def __init__(
        self, node: str, gtm: bool, resume_csn: Csn | None, settling: bool, relations: RelationVersions
    ) -> None:
        self.node = node
        self._gtm = gtm
        self.resume_csn = resume_csn
        self.orderer: CsnOrderer[Key] = CsnOrderer(node, settling=settling)
        self.ready: dict[Key, FinishedTxn] = {}  # committed, waiting in the orderer
        self.confirm = ConfirmableLsn()
        self._relations = relations
        self._new_relations = relations.new  # (the same list: one truth test per release)
        self.finished = 0  # transactions finished so far (their `seq`)
        # statistics
        self.released = 0
        self.skipped_empty = 0
        self.dropped_resumed = 0
        self.spilled_txns = 0
        self.spilled_bytes = 0

    # --- committed transactions ------------------------------------------------------------

    def finish(self, txn: OpenTxn, commit_lsn: Lsn, end_lsn: Lsn, commit_time: int) -> list[FinishedTxn]:
        """`txn` committed at `commit_lsn`: what it releases (it, others waiting, or nothing yet)."""
        buf = txn.buf
        orderer = self.orderer
        gid = txn.gid
        seq = self.finished
        self.finished = seq + 1
        if self._gtm:
            if gid is None:
                if buf.n_changes:
                    n = buf.n_changes
                    buf.close()
                    raise MarkerError(
                        f"transaction {txn.xid} committed at {lsn_to_str(commit_lsn)} with {n} changes but "
                        "no commit marker; in gtm mode every writing transaction must log "
                        "'commit <gid> <csn>' (transactional) before it commits",
                        node=self.node,
                        lsn=commit_lsn,
                        xid=txn.xid,
                    )
                return self._skip(buf, end_lsn)
            key: Key = gid
            csn = txn.csn
        else:
            if not buf.n_changes and not txn.watermark:
                return self._skip(buf, end_lsn)
            key = txn.xid
            csn = as_csn(commit_lsn)  # single-node mode: the commit LSN is the CSN
        if self.resume_csn is not None and csn <= self.resume_csn:
            self.dropped_resumed += 1
            released: list[Key] = []
            if gid is not None and orderer.is_committing(gid):
                self.confirm.resolved(gid)
                released = orderer.abort(gid, lsn=commit_lsn)
            buf.close()
            self.confirm.passed(end_lsn)
            return self.take(released)
        try:
            # A commit ticks: every later transaction gets a larger CSN (gtm) or commits later (single).
            released = orderer.commit(
                key, csn, lsn=commit_lsn, xid=txn.xid, tick=csn if self._gtm else as_csn(end_lsn - 1)
            )
        except ProtocolError:
            buf.close()
            raise
        if buf.spilled:
            self.spilled_txns += 1
            self.spilled_bytes += buf.spilled_bytes
        n = buf.n_changes
        finished = FinishedTxn(self.node, csn, gid, txn.xid, commit_lsn, end_lsn, commit_time, buf.drain(), n)
        finished.seq = seq
        return self._release(key, gid, finished, released)

    def whole(self, w: WholeTxn, lsns: list[Lsn], line: str) -> list[FinishedTxn]:
        """A whole transaction whose line a decoder wrote (single-node mode), its positions checked."""
        xid, commit_lsn, end_lsn = w.xid, w.commit_lsn, w.end_lsn
        seq = self.finished
        self.finished = seq + 1
        csn = as_csn(commit_lsn)
        if self.resume_csn is not None and csn <= self.resume_csn:
            self.dropped_resumed += 1
            self.confirm.passed(end_lsn)
            return []
        released = self.orderer.commit(xid, csn, lsn=commit_lsn, xid=xid, tick=as_csn(end_lsn - 1))
        finished = FinishedTxn(self.node, csn, None, xid, commit_lsn, end_lsn, w.commit_time, (), len(lsns))
        finished.written = WrittenLines([csn], [xid], [commit_lsn], [line])
        finished.seq = seq
        return self._release(xid, None, finished, released)

    def together(self, run: WholeTxns) -> FinishedTxn | None:
        """All of `run` (single-node mode, nothing open) released as one `FinishedTxn` carrying their lines, or None (nothing changed) if they may not be.

        They may when nothing waits, no relation versions are to attach and
        no restart is to skip past, and their positions are as their Begins
        and Commits say: then one pass of checks and one call of the orderer
        release them all (`FinishedTxn.written`).
        """
        if self._new_relations or self.ready:
            return None
        txns = run.txns
        commit_lsns: list[Lsn] = list(map(commit_lsn_of, txns))
        lsns_each: list[list[Lsn]] = list(map(lsns_of, txns))
        if not all_in_place(txns, commit_lsns, lsns_each):
            return None
        csns = cast("list[Csn]", commit_lsns)  # (single-node mode: the commit LSN is the CSN)
        ticks = cast("list[Csn]", [end - 1 for end in map(end_lsn_of, txns)])
        resume = self.resume_csn
        if (resume is not None and csns[0] <= resume) or not self.orderer.commit_run(csns, ticks):
            return None  # (a restart's re-sent ones are dropped one by one)
        n = len(txns)
        last = txns[-1]
        self.finished += n
        xids: list[Xid] = list(map(xid_of, txns))
        finished = FinishedTxn(
            self.node,
            csns[-1],
            None,
            xids[-1],
            last.commit_lsn,
            last.end_lsn,
            last.commit_time,
            (),
            sum(map(len, lsns_each)),
        )
        finished.written = WrittenLines(csns, xids, commit_lsns, run.lines)
        finished.seq = self.finished - 1
        confirm = self.confirm
        confirm.passed(last.end_lsn)
        finished.confirmable = confirm.value
        self.released += n
        return finished

    def _release(
        self, key: Key, gid: str | None, finished: FinishedTxn, released: list[Key]
    ) -> list[FinishedTxn]:
        """`finished` has committed and the orderer released `released` with it: hand them on."""
        # Released at once, the common case: no round trip through `ready`
        # and the confirmable LSN's holds (`take` would leave both as they
        # are now, and the confirmable LSN where `passed` puts it).
        confirm = self.confirm
        end_lsn = finished.end_lsn
        at_once = len(released) == 1 and released[0] == key
        if not at_once:
            self.ready[key] = finished
            confirm.hold(end_lsn)
        confirm.passed(end_lsn)
        if not at_once:
            return self.take(released)
        if gid is not None:
            confirm.resolved(gid)
        finished.confirmable = confirm.value
        if self._new_relations:
            self._relations.attach(finished)
        self.released += 1
        return [finished]

    def take(self, keys: list[Key]) -> list[FinishedTxn]:
        """Release the waiting transactions `keys`, in order, each with its own confirmable LSN.

        One event can release several (a commit that frees those waiting
        behind a committing marker, an abort).  The confirmable LSN after
        the group may lie past the commits of all of them, but the first may
        become durable alone -- the others can still sit in the merge behind
        another node -- so each carries the value as it stands once it, and
        only the ones before it, are released: the holds of the ones after
        it still cap it.
        """
        if not keys:
            return []
        out = []
        ready, confirm = self.ready, self.confirm
        for key in keys:
            txn = ready.pop(key)
            confirm.unhold(txn.end_lsn)
            if isinstance(key, str):
                confirm.resolved(key)
            confirm.update()
            txn.confirmable = confirm.value
            if self._new_relations:
                self._relations.attach(txn)
            out.append(txn)
        self.released += len(out)
        return out

    def _skip(self, buf: TxnBuffer, end_lsn: Lsn) -> list[FinishedTxn]:
        buf.close()
        self.skipped_empty += 1
        self.confirm.passed(end_lsn)
        return []

    # --- what the markers and keepalives say -----------------------------------------------

    def committing(self, gid: str, csn: Csn, lsn: Lsn) -> None:
        """A `committing` marker: `gid` takes a CSN of at least `csn`, and holds larger ones back."""
        self.orderer.committing(gid, csn, lsn=lsn)
        self.confirm.committing(gid, lsn)
        self.orderer.tick(csn)

    def abort(self, gid: str, lsn: Lsn, unseen_ok: bool) -> list[FinishedTxn]:
        """An `abort` marker; `unseen_ok`: one never seen committing is nothing (its `committing` lay before the stream's start)."""
        if unseen_ok and not self.orderer.is_committing(gid):
            return []
        self.confirm.resolved(gid)
        return self.take(self.orderer.abort(gid, lsn=lsn))

    def tick(self, csn: Csn) -> None:
        """No transaction not yet committing takes a CSN at or below `csn`."""
        self.orderer.tick(csn)

    def settle(self) -> list[FinishedTxn]:
        """The stream's start is settled: what waited for it goes, in CSN order."""
        return self.take(self.orderer.settle())

    def idle(self, wal_end: Lsn) -> None:
        """A keepalive while no transaction is open: the stream has passed `wal_end`."""
        self.confirm.passed(wal_end)
        if not self._gtm:
            # (single-node mode: CSNs are commit LSNs, and the next commit may start at the WAL end)
            self.orderer.tick(as_csn(wal_end - 1))

    # --- the end ---------------------------------------------------------------------------

    def check_end(self, last_lsn: Lsn, start_token: str | None) -> None:
        """The stream ended at `last_lsn`: it must not end with a transaction committing or its start unsettled."""
        node = self.node
        orderer = self.orderer
        if orderer.settling and orderer.n_waiting:
            # (with nothing gathered, nothing is lost: the slot was confirmed no further, and
            # the next run's start is settled anew)
            held = orderer.waiting()
            raise TruncatedStream(
                f"stream ended at {lsn_to_str(last_lsn)} before its start was settled (the "
                f"csnd.start message {start_token} never came); {len(held)} committed transactions "
                f"wait unreleased (the first: global transaction {held[0][0]}, csn {held[0][1]})"
                ": a transaction committing since before the stream's start may be missing its "
                "committing marker, so nothing can be ordered yet; run again without --until-lsn, "
                "or with one past the start message",
                node=node,
                lsn=last_lsn or None,
            )
        open_ = orderer.open_committing()
        if open_:
            gid, csn = open_[0]
            marker_lsn = (self.confirm.marker_lsn(gid) if isinstance(gid, str) else None) or 0
            waiting = orderer.n_waiting
            raise TruncatedStream(
                f"stream ended with global transaction {gid} committing (committing csn {csn}, logged at "
                f"{lsn_to_str(marker_lsn)}) but neither committed nor aborted"
                + (f"; {len(open_) - 1} more committing" if len(open_) > 1 else "")
                + (f"; {waiting} committed transactions wait behind it, unreleased" if waiting else "")
                + "; the stream is truncated or the writer lost the transaction",
                node=node,
                lsn=marker_lsn or None,
            )
        assert not self.ready, "committed transactions left without a committing one to wait for"

    def _check(self) -> None:
        """Assert every invariant of the release bookkeeping (tests call it after each step)."""
        self.orderer._check()
        assert set(self.ready) == {k for k, _ in self.orderer.waiting()}
        committing = {k for k, _ in self.orderer.open_committing() if isinstance(k, str)}
        self.confirm._check(
            holding=[t.end_lsn for t in self.ready.values()],
            capping=committing | {k for k in self.ready if isinstance(k, str)},
        )
