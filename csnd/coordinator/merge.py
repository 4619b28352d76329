"""The coordinator's merge: K node streams in, one CSN-ordered stream of global transactions out.

    dn1 ─ add_batch / add_watermark / node_ended ─┐
    dn2 ─ add_batch / add_watermark / node_ended ─┼─► CsnMerge ── pop_ready() ─► [GlobalTxn, ...]
    dnK ─ add_batch / add_watermark / node_ended ─┘     │           strictly increasing csn
                                                        │  (or pop_events(): the same, streamed)
                                                        └─ wants_more(node): back-pressure

GaussDB's distributed decoding, as docs/design.md section 4 restates and
adapts it.  Each node's sender releases its transactions in its own
commit-CSN order; a transaction arrives here as one or more batches, each of
one command id (cid), the last one flagged.  The merge orders batches by
`<commitcsn, cid, batch_id>`: CSN first (global commit order), cid next
(statement order inside a distributed transaction: a delete on dn1 that
precedes an insert on dn2 is replayed first, so unique keys never collide),
batch_id last (within one CSN and cid, the ready batches of one node do not
wait for another node's late batch).

One key per node.  The merge keeps exactly one key per node that has not
ended in a SortedList of `(csn, cid, batch_id, node index)`:

- a node with batches waiting: the key of its first batch (a *batch key*);
- a node with nothing waiting: a *bound* -- the smallest key anything it may
  still send can have:
  - in the middle of a transaction (its last batch not yet sent):
    `(csn, last cid, TOP, i)`.  It can only continue that transaction at this
    cid or a later one; TOP puts it after the other nodes' ready batches of the
    same csn/cid -- the seed's "bump the batch_id when the node's next batch is
    not there" taken to its limit, so they go first instead of waiting;
  - otherwise `(max(watermark, last csn) + 1, -1, -1, i)`: its CSNs only grow,
    so after a complete transaction at csn c the node is passed c even
    without a watermark (the seed's "the dn's next transaction has a larger
    commitcsn"), and a watermark w says nothing <= w will follow.
- an ended node with nothing waiting has no key: watermark +infinity.

The rule is then one comparison: the smallest key is taken if it is a batch
key; if it is a bound, the merge must wait for that node (only that node can
still send something that sorts first).  So an idle node never stalls the
stream once it sends a watermark, and a slow node is never overtaken.  A
transaction being assembled at csn C is complete when the smallest key has a
CSN > C (or no key is left): every node has passed C, which also means every
participant's last batch was taken (a participant that owes a batch keeps a
key at C).  That is the completion rule, and it emits every transaction as
soon as the delivered batches and watermarks allow, never earlier.

Batch ids.  A node's batch_id counts, within its current (csn, cid), how
often its next batch was missing when one was taken; it restarts at 0 at each
new (csn, cid).  Ties in (csn, cid) between ready batches go to the lower
batch_id, then the lower node index, so when every batch of a transaction is
already here the output is in node order inside each cid (what the
generator's expected.jsonl writes), and when a node is slow the others'
ready batches rotate ahead of it.  docs/design.md invariant 3 promises only cid order
and each node's own order; the order of different nodes' changes inside one
cid depends on arrival timing.

Memory.  `wants_more(node)` turns False once a node has the
configured number of batches or bytes waiting, so the I/O layer stops reading
a node that runs far ahead.  It cannot deadlock: the merge only ever waits
for the node owning the smallest key, which is a bound, so that node has
nothing waiting and always wants more.  Batches taken are handed on at once
(`pop_events()`: TxnStart, TxnPart..., TxnEnd) and not kept, so a transaction
of any size streams through; only `pop_ready()`, which returns whole
transactions, holds one while it is assembled.

Errors.  A ProtocolError names the node(s), gid and CSNs concerned: a
CsnOrderViolation for CSNs that break the gtm's order, MessageOutOfPlace for
batches that break the node -> coordinator contract, TruncatedStream for a
node that ends inside a transaction.  After one the merge is in an undefined
state and the run stops.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from sortedcontainers import SortedList

from csnd.coordinator.batch import MergeStatistics, NodeBatch, NodeStatistics, change_body, change_cid
from csnd.coordinator.gids import txn_name
from csnd.coordinator.globaltxn import GlobalTxn, NodeCommit
from csnd.coordinator.identity import TxnIdentities
from csnd.coordinator.mergestate import Assembly, Key, MergeNode, bound_key, head_key
from csnd.coordinator.txnevents import TxnEnd as TxnEnd
from csnd.coordinator.txnevents import TxnEvent as TxnEvent
from csnd.coordinator.txnevents import TxnJoiner
from csnd.coordinator.txnevents import TxnPart as TxnPart
from csnd.coordinator.txnevents import TxnStart as TxnStart
from csnd.core.errors import (
    CsnOrderViolation,
    InternalError,
    MessageOutOfPlace,
    ProtocolError,
    TruncatedStream,
)
from csnd.core.ids import Csn

# Batches one node may have waiting before wants_more() says stop.  Larger: a
# node can run further ahead while another catches up (more decoding overlap,
# fewer stalls of fast nodes); smaller: less memory.  Byte size is the real
# memory guard (below); this bounds the per-batch bookkeeping of many tiny
# transactions.
DEFAULT_MAX_PENDING_BATCHES: Final = 4096
# Approximate bytes of change text one node may have waiting.  Larger: more
# slack for nodes of uneven speed; smaller: a tighter memory ceiling of
# K x this (plus the transaction being assembled).
DEFAULT_MAX_PENDING_BYTES: Final = 64 << 20
# Gids of emitted transactions remembered to catch "same gid, different CSN"
# when the second node's part arrives after the first was already emitted.
# Larger: catches such a bug across a wider distance; smaller: less memory
# (about 100 bytes a gid).  Parts that are buffered at the same time are always
# checked, whatever this is.
DEFAULT_RECENT_GIDS: Final = 65536

# Rough CPython cost of a waiting batch and of one change tuple besides its
# body text, for the byte count.
_BATCH_OVERHEAD: Final = 200
_CHANGE_OVERHEAD: Final = 100


def _where(batch: NodeBatch) -> str:
    return txn_name(batch.gid, batch.xid, batch.csn, batch.commit_lsn)


def _error(
    n: MergeNode, batch: NodeBatch, message: str, cls: type[ProtocolError] = MessageOutOfPlace
) -> ProtocolError:
    return cls(message, node=n.name, lsn=batch.commit_lsn, xid=batch.xid)


class CsnMerge:
    """Merge node streams into global transactions in strictly increasing CSN order (pure, no I/O).

    Push batches, watermarks and ends in each node's own order, then call
    `pop_ready()` for every transaction that is now safe to emit.  Not
    thread-safe: one thread owns it.
    """

    __slots__ = (
        "_nodes",
        "_names",
        "_by_name",
        "_keys",
        "_asm",
        "_joiner",
        "_ids",
        "_by_csn",
        "_by_gid",
        "_last_emitted",
        "_emitted",
        "max_pending_batches",
        "max_pending_bytes",
        "recent_gids",
    )

    def __init__(
        self,
        nodes: Iterable[str],
        *,
        max_pending_batches: int = DEFAULT_MAX_PENDING_BATCHES,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        recent_gids: int = DEFAULT_RECENT_GIDS,
    ) -> None:
        names = list(nodes)
        if not names:
            raise ValueError("a merge needs at least one node")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"node name {dup[0]!r} is given more than once")
        if max_pending_batches < 1 or max_pending_bytes < 1 or recent_gids < 0:
            raise ValueError("max_pending_batches and max_pending_bytes must be >= 1, recent_gids >= 0")
        self.max_pending_batches = max_pending_batches
        self.max_pending_bytes = max_pending_bytes
        self.recent_gids = recent_gids
        self._nodes = [MergeNode(name, i) for i, name in enumerate(names)]
        self._by_name = {n.name: n for n in self._nodes}
        self._keys: Any = SortedList()
        for n in self._nodes:
            n.key = bound_key(n)
            self._keys.add(n.key)
        self._names = names
        self._asm: Assembly | None = None
        self._joiner = TxnJoiner()  # pop_ready's
        # Which transaction each buffered CSN and gid names (their dicts at hand: once a transaction).
        self._ids = TxnIdentities(recent_gids)
        self._by_csn = self._ids.by_csn
        self._by_gid = self._ids.by_gid
        self._last_emitted = Csn(-1)
        self._emitted = 0

    # -- keys ---------------------------------------------------------------------------------

    def _rekey(self, n: MergeNode, key: Key | None) -> None:
        if key == n.key:
            return
        if n.key is not None:
            self._keys.remove(n.key)
        if key is not None:
            self._keys.add(key)
        n.key = key

    def _node(self, name: str) -> MergeNode:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"unknown node {name!r}; the merge has {list(self._by_name)}") from None

    # -- input --------------------------------------------------------------------------------

    def add_batch(self, node: str, batch: NodeBatch) -> None:
        """Accept the next batch of `node`; raises ProtocolError if it breaks the node's order."""
        n = self._node(node)
        csn, gid, xid, cid = batch.csn, batch.gid, batch.xid, batch.cid
        if n.ended:
            raise _error(n, batch, f"{_where(batch)} arrived after the node's stream ended")
        if csn < 0 or cid < 0:
            raise _error(n, batch, f"{_where(batch)} has a negative csn or cid {cid}")
        if n.open:
            if (csn, gid, xid) != (n.last_csn, n.last_gid, n.last_xid):
                raise _error(
                    n,
                    batch,
                    f"{_where(batch)} began before the last batch of "
                    f"{txn_name(n.last_gid, n.last_xid, n.last_csn)}; a node's transactions must not interleave",
                )
            if cid < n.last_cid:
                raise _error(
                    n,
                    batch,
                    f"{_where(batch)} went back from cid {n.last_cid} to cid {cid}; cids never decrease",
                )
        else:
            self._check_new_txn(n, batch)
        changes = batch.changes
        # C-level passes: this runs once per change of the whole cluster, in one thread
        if changes and set(map(change_cid, changes)) != {cid}:
            stray = next(c for c, _, _ in changes if c != cid)
            raise _error(
                n,
                batch,
                f"a batch of cid {cid} of {_where(batch)} holds a change of cid {stray}; one cid a batch",
            )
        nbytes = _BATCH_OVERHEAD + sum(map(len, map(change_body, changes))) + _CHANGE_OVERHEAD * len(changes)

        if not n.open:
            self._by_csn.setdefault(csn, (gid, n.index))
            if gid is not None:
                self._by_gid.setdefault(gid, (csn, n.index))
        q = n.queue
        q.append((batch, nbytes))
        n.pending_bytes += nbytes
        if len(q) > n.peak_batches:
            n.peak_batches = len(q)
        if n.pending_bytes > n.peak_bytes:
            n.peak_bytes = n.pending_bytes
        n.last_csn, n.last_gid, n.last_xid, n.last_cid = csn, gid, xid, cid
        n.open = not batch.last_of_txn
        if len(q) == 1:
            self._rekey(n, head_key(n))

    def _check_new_txn(self, n: MergeNode, batch: NodeBatch) -> None:
        """The first batch of a node's transaction: its CSN must be new here and agree with other nodes."""
        csn = batch.csn
        if csn <= n.last_csn:
            raise _error(
                n,
                batch,
                f"{_where(batch)} arrived after {txn_name(n.last_gid, n.last_xid, n.last_csn)} on this node; "
                f"csn {csn} <= {n.last_csn}: a node must send its transactions in strictly increasing csn order",
                CsnOrderViolation,
            )
        if csn <= n.watermark:
            raise _error(
                n,
                batch,
                f"{_where(batch)} arrived after this node's watermark {n.watermark} promised no csn <= "
                f"{n.watermark} would follow; its tick or committing markers are wrong",
                CsnOrderViolation,
            )
        self._ids.check_new(n.name, batch, self._names)

    def add_watermark(self, node: str, csn: Csn) -> None:
        """`node` will send nothing with a CSN <= `csn` any more (a smaller one than before is ignored)."""
        n = self._node(node)
        if n.ended:
            return
        if n.open and csn >= n.last_csn:
            raise CsnOrderViolation(
                f"watermark {csn} passes {txn_name(n.last_gid, n.last_xid, n.last_csn)} whose last batch "
                f"has not arrived; csn {n.last_csn} <= {csn}",
                node=node,
                xid=n.last_xid,
            )
        if csn <= n.watermark:
            return
        n.watermark = csn
        if not n.queue:
            self._rekey(n, bound_key(n))

    def node_ended(self, node: str) -> None:
        """`node` sends nothing more: it counts as watermark +infinity once its waiting batches are taken."""
        n = self._node(node)
        if n.ended:
            return
        if n.open:
            raise TruncatedStream(
                f"stream ended inside {txn_name(n.last_gid, n.last_xid, n.last_csn)} before its last batch; "
                "the node's output is truncated",
                node=node,
                xid=n.last_xid,
            )
        n.ended = True
        if not n.queue:
            self._rekey(n, None)

    # -- output -------------------------------------------------------------------------------

    def pop_ready(self) -> list[GlobalTxn]:
        """Every transaction that is complete and safe to emit now, whole, in increasing CSN order.

        Built on `pop_events()`; holds a transaction's parts until its end, so
        for very large transactions prefer `pop_events()`.  Use one or the
        other on a merge, not both.
        """
        return self._joiner.join(self.pop_events())

    def pop_events(self) -> list[TxnEvent]:
        """The output that is safe to emit now, as a stream: TxnStart, TxnPart..., TxnEnd.

        A transaction starts as soon as its first batch is the smallest key;
        its parts follow as their batches are taken, and the merge keeps none
        of them, so a transaction of any size passes through in bounded
        memory.  Its header is complete at the start: when the first batch at
        csn C is the smallest key, every other node's key is either a batch
        key at C (a participant, whose first waiting batch carries its xid,
        commit LSN and time) or has a CSN above C -- a node that could still
        send something at C would hold a bound (C, -1, -1, i), which sorts
        first and makes the merge wait for it.
        """
        out: list[TxnEvent] = []
        keys = self._keys
        nodes = self._nodes
        head = head_key
        bound = bound_key
        asm = self._asm
        while True:
            if not keys:
                if asm is not None:
                    out.append(self._finish(asm))
                    asm = None
                break
            key = keys[0]
            if asm is not None and key[0] > asm.csn:
                out.append(self._finish(asm))
                asm = None
                continue
            n = nodes[key[3]]
            q = n.queue
            if not q:
                break  # a bound: only this node can still send what sorts first
            batch, nbytes = q.popleft()
            n.pending_bytes -= nbytes
            i = n.index
            if asm is None:
                asm = self._begin(batch, n)
                out.append(asm.start)
            elif i not in asm.commits:
                raise InternalError(
                    f"{_where(batch)} arrived after the transaction at csn {asm.csn} began without it; "
                    "this breaks the merge's ordering rule and is a bug",
                    node=n.name,
                    lsn=batch.commit_lsn,
                    xid=batch.xid,
                )
            if batch.changes:
                out.append(TxnPart(n.name, batch.changes))
            if batch.last_of_txn:
                asm.unfinished.discard(i)
            else:
                asm.unfinished.add(i)
            new: Key | None
            if q:
                new = head(n)
            else:
                if not batch.last_of_txn:
                    n.bid += 1  # its next batch is late: let the others' ready ones go first
                new = bound(n)
            keys.pop(0)
            if new is not None:
                keys.add(new)
            n.key = new
        self._asm = asm
        return out

    def _begin(self, batch: NodeBatch, first: MergeNode) -> Assembly:
        """The transaction at batch.csn begins: its participants are the nodes with a batch there now."""
        csn = batch.csn
        commits = {first.index: (batch.xid, batch.commit_lsn, batch.commit_time, batch.end_lsn)}
        latest = batch.commit_time  # the line's commit time: the latest of the participants'
        relations = {first.index: batch.relations} if batch.relations else None  # (each node's first batch)
        for m in self._nodes:
            if m is not first and m.queue:
                b = m.queue[0][0]
                if b.csn == csn:
                    commits[m.index] = (b.xid, b.commit_lsn, b.commit_time, b.end_lsn)
                    latest = max(latest, b.commit_time)
                    if b.relations:
                        relations = relations or {}
                        relations[m.index] = b.relations
        order = sorted(commits)
        nodes = self._nodes
        start = TxnStart(
            csn,
            batch.gid,
            {nodes[i].name: NodeCommit(*commits[i][:3]) for i in order},
            {nodes[i].name: commits[i][3] for i in order},
            latest,
            [(nodes[i].name, body) for i in sorted(relations) for body in relations[i]] if relations else (),
        )
        return Assembly(csn, batch.gid, commits, start)

    def _finish(self, asm: Assembly) -> TxnEnd:
        assert not asm.unfinished and asm.csn > self._last_emitted, (asm.csn, asm.unfinished)
        nodes = self._nodes
        names = [nodes[i].name for i in sorted(asm.commits)]
        self._ids.emitted(asm.csn, asm.gid, names[0])
        self._last_emitted = asm.csn
        self._emitted += 1
        return TxnEnd(asm.csn, names)

    # -- back-pressure and statistics ------------------------------------------------------------

    def wants_more(self, node: str) -> bool:
        """False while `node` has more waiting than the limits allow (or has ended): stop reading it."""
        n = self._node(node)
        return (
            not n.ended
            and len(n.queue) < self.max_pending_batches
            and n.pending_bytes < self.max_pending_bytes
        )

    def pending_batches(self, node: str) -> int:
        return len(self._node(node).queue)

    def pending_bytes(self, node: str) -> int:
        return self._node(node).pending_bytes

    def has_pending(self) -> bool:
        """Batches are waiting or a transaction is half assembled."""
        return self._asm is not None or any(n.queue for n in self._nodes)

    def statistics(self) -> MergeStatistics:
        return MergeStatistics(
            nodes={
                n.name: NodeStatistics(
                    len(n.queue),
                    n.pending_bytes,
                    n.peak_batches,
                    n.peak_bytes,
                    n.watermark if n.watermark >= 0 else None,
                    n.ended,
                )
                for n in self._nodes
            },
            emitted=self._emitted,
            last_csn=self._last_emitted if self._emitted else None,
            assembling_csn=self._asm.csn if self._asm is not None else None,
        )

    # -- invariants -------------------------------------------------------------------------------

    def _check(self) -> None:
        """Assert every internal invariant (tests call this after each step)."""
        keys = self._keys
        keys._check()
        assert list(keys) == sorted({n.key for n in self._nodes if n.key is not None})
        asm = self._asm
        buffered: set[int] = set() if asm is None else {asm.csn}
        for n in self._nodes:
            q = n.queue
            assert n.pending_bytes == sum(b for _, b in q), n.name
            assert len(q) <= n.peak_batches
            assert n.pending_bytes <= n.peak_bytes
            assert not (n.open and n.ended), n.name
            if q:
                b0 = q[0][0]
                assert (n.bid_csn, n.bid_cid) == (b0.csn, b0.cid), n.name
                assert n.key == (b0.csn, b0.cid, n.bid, n.index), (n.name, n.key)
            else:
                assert n.key == bound_key(n), (n.name, n.key)
            if n.open:
                assert n.watermark < n.last_csn, n.name
            prev: NodeBatch | None = None
            for b, nbytes in q:
                assert nbytes >= _BATCH_OVERHEAD
                assert all(c == b.cid for c, _, _ in b.changes)
                buffered.add(b.csn)
                if prev is not None:
                    if prev.last_of_txn:
                        assert b.csn > prev.csn, n.name
                    else:
                        assert (b.csn, b.gid, b.xid) == (prev.csn, prev.gid, prev.xid), n.name
                        assert b.cid >= prev.cid, n.name
                prev = b
            if prev is not None:
                assert prev.csn == n.last_csn and prev.last_of_txn != n.open, n.name
        for key in keys:
            # Nothing waiting or still to come sorts at or below what was emitted ...
            assert key[0] > self._last_emitted, key
            # ... nor below the transaction being assembled.
            assert asm is None or key[0] >= asm.csn, (key, asm.csn)
        if asm is not None:
            assert asm.csn > self._last_emitted
            assert asm.start.commit_time == max(c.commit_time for c in asm.start.nodes.values())
            assert asm.unfinished <= set(asm.commits)
            for i in asm.unfinished:
                k = self._nodes[i].key
                assert k is not None and k[0] == asm.csn, (i, k)
        self._ids._check(buffered)
