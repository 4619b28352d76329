"""The synthetic GaussDB-style cluster (docs/design.md section 2.3): `csnd generate`.

    generate_cluster(out_dir, nodes=K, transactions=N, seed=S)
        │
        ├─ scheduler: N global txns, `concurrency` in flight, each a coroutine that
        │  advances one step (a statement on one node, one commit-protocol step)
        │  when picked at random -- this interleaving is what puts commit records
        │  out of CSN order and stream blocks between other txns' output
        │
        ├─ Workload (rows, locks, savepoints)   ──► expected change objects
        ├─ NodeStream per node (WAL, walsender) ──► DIR/dn1.pgstream … dnK.pgstream
        └─ Gtm                                  ──► committing / commit CSNs, ticks
                                                     └► DIR/expected.jsonl (by CSN)

Every global transaction follows the writer protocol of `gtm.writer` exactly:
DML on each node it touches (a `cid <n>` marker before statement n on a node
when it spans several nodes) -> `committing <gid> <gtm.current()>` on each
node -> `csn = gtm.next()` -> transactional `commit <gid> <csn>` and PREPARE on
each node -> COMMIT PREPARED on each node, in a random node order each time.
A share of them fail instead: a plain ROLLBACK before committing (nothing is
logged), or ROLLBACK [PREPARED] plus `abort <gid>` after `committing`, before
or after the CSN was taken.

Tick rule.  `tick <t>` is written on a node with `t = gtm.current()` read at
that moment.  It is valid: a txn that has not yet logged `committing` on this
node has not taken its commit CSN either (committing is logged on every node
before `next()`), so its CSN will be `next()` > `current()` = t.  Txns that
already logged committing here are excluded by the rule and are in the
sender's committing list.  The same argument covers the live writer, where
`current()` is read before the message is written.

expected.jsonl holds one line per committed global txn, sorted by CSN
(strictly increasing: each CSN is handed out once).  "nodes" lists each node's
top-level xid and commit LSN, in node order dn1, dn2, … (by index, so dn10
follows dn9); "commit_time" is the latest of the nodes' commit times.
"changes" are ordered by cid, and within one cid by node order, and within one
node by stream order (the node's own order; cids never decrease along it).
A node whose every change was rolled back to a savepoint still appears in
"nodes": its commit carries the commit marker, so the txn did commit there.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import os
from collections.abc import Iterator
from random import Random
from typing import Any, Final

from csnd.core import markers
from csnd.core.ids import lsn_to_str, pg_time_to_iso
from csnd.gtm.generate_options import GenerateOptions, GenerateSummary
from csnd.gtm.localtxn import NodePart
from csnd.gtm.randvalues import Values
from csnd.gtm.sequencer import Gtm
from csnd.gtm.shapes import evolve_step, table_defs
from csnd.gtm.tables import TableState
from csnd.gtm.walsender import NodeStream
from csnd.gtm.workload import Workload
from csnd.reader.streamfile import StreamHeader, StreamWriter

# 2026-11-22T10:00:00+00:00 in microseconds since 2000-01-01.
CLOCK_START: Final = 848_656_800_000_000
# First WAL positions: dn2 crosses the 32-bit boundary early (1/… LSNs) and
# dn3 starts high, so nothing downstream can assume one LSN range.
START_LSNS: Final = (0x16B3600, 0xFFF00000, 0x2_A0000000)
EXPECTED_FILE: Final = "expected.jsonl"

# Table weights for ordinary statements (acct, wide, audit, item, event_log, evolve).
TABLE_WEIGHTS: Final = (3, 3, 2, 2, 2, 1)
# Large txns write mostly wide rows with TOAST values, updating their own rows.
LARGE_TABLE_WEIGHTS: Final = (2, 5, 2, 1, 0, 0)


class GlobalTxn:
    __slots__ = ("id", "gid", "kind", "nodes", "parts", "markers", "abort")

    def __init__(self, txn_id: int, kind: str, nodes: list[int], abort: str | None) -> None:
        self.id = txn_id
        self.gid = f"g-{txn_id}"
        self.kind = kind  # "ordinary" | "large" | "ddl" | "truncate"
        self.nodes = nodes
        self.parts: dict[int, NodePart] = {}
        self.markers = len(nodes) > 1
        self.abort = abort  # None | "rollback" | "after_committing" | "after_csn"


class Generator:
    """One generation run; see the module docstring."""

    def __init__(self, out_dir: str, nodes: int, seed: int, binary: bool, options: GenerateOptions) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self.out_dir = out_dir
        self.opts = options
        self.rng = Random(seed)
        self.gtm = Gtm()
        self.now = CLOCK_START
        self.k = nodes
        names = [f"dn{i + 1}" for i in range(nodes)]
        self.paths = [os.path.join(out_dir, f"{n}.pgstream") for n in names]
        self.writers = [
            StreamWriter(p, StreamHeader(node=n, proto_version=2, binary=binary, mode="gtm"))
            for p, n in zip(self.paths, names, strict=True)
        ]
        self.streams = [
            NodeStream(n, w, _start_lsn(i), 730 + 17 * i, options.work_mem, self._clock)
            for i, (n, w) in enumerate(zip(names, self.writers, strict=True))
        ]
        values = Values(self.rng, binary, options.toast_bytes)
        self.wl = Workload(
            self.rng, values, names, self.streams, table_defs(options.extra_columns), options.max_rows
        )
        self.wl.seed_rows(options.initial_rows)
        self.ddl_steps = 0
        self.open_csns: dict[int, None] = {}
        self.ready: list[tuple[int, str]] = []  # (csn, line): committed, not yet written
        self.expected_f = open(os.path.join(out_dir, EXPECTED_FILE), "w", encoding="utf-8")  # noqa: SIM115
        self.summary = GenerateSummary(out_dir, self.paths, self.expected_f.name, nodes, 0)

    def _clock(self) -> int:
        return self.now

    # --- the run --------------------------------------------------------------

    def run(self, transactions: int) -> GenerateSummary:
        try:
            self._run(transactions)
        finally:
            for w in self.writers:
                w.close()
            self.expected_f.close()
        s = self.summary
        s.transactions = transactions
        s.frames = sum(w.frames for w in self.writers)
        s.bytes = sum(w.bytes_written for w in self.writers)
        s.per_node_frames = {ns.name: ns.writer.frames for ns in self.streams}
        s.expected_bytes = os.path.getsize(self.expected_f.name)
        s.stream_blocks = sum(ns.stream_blocks for ns in self.streams)
        s.last_csn = self.gtm.current()
        return s

    def _run(self, transactions: int) -> None:
        rng, opts, streams = self.rng, self.opts, self.streams
        kinds = self._plan(transactions)
        for ns in streams:
            ns.keepalive()
        active: list[Iterator[None]] = []
        started = 0
        tick_p, ka_p, gap_p = (
            1 / max(1, opts.tick_every),
            1 / max(1, opts.keepalive_every),
            1 / max(1, opts.gap_every),
        )
        while started < transactions or active:
            if (
                started < transactions
                and len(active) < opts.concurrency
                and (not active or rng.random() < 0.35)
            ):
                active.append(self._start(started + 1, kinds[started]))
                started += 1
            else:
                i = rng.randrange(len(active))
                try:
                    next(active[i])
                except StopIteration:
                    active.pop(i)
            self.now += rng.randint(20, 2500)
            r = rng.random()
            if r < tick_p:
                streams[rng.randrange(self.k)].message(markers.tick(self.gtm.current()))
            elif r < tick_p + ka_p:
                streams[rng.randrange(self.k)].keepalive(reply=rng.random() < 0.2)
            elif r < tick_p + ka_p + gap_p:
                streams[rng.randrange(self.k)].gap(rng.randint(100, 8000))
        assert not self.open_csns and not self.ready
        for ns in streams:  # a final watermark, as an idle cluster would send
            ns.message(markers.tick(self.gtm.current()))
            ns.keepalive()

    def _plan(self, n: int) -> list[str]:
        rng, opts = self.rng, self.opts
        kinds = ["large" if rng.random() < opts.large_ratio else "ordinary" for _ in range(n)]
        if n >= 8:
            if opts.large_ratio > 0:
                kinds[n // 4] = "large"
            if opts.ddl_every > 0:
                for i in [n // 2, *range(opts.ddl_every - 1, n, opts.ddl_every)]:
                    kinds[i] = "ddl"
            if opts.truncate_every > 0:
                for i in [n * 2 // 3, *range(opts.truncate_every - 1, n, opts.truncate_every)]:
                    kinds[i] = "truncate"
        return kinds

    def _start(self, txn_id: int, kind: str) -> Iterator[None]:
        rng, opts, k = self.rng, self.opts, self.k
        if kind == "ddl":
            nodes = list(range(k))  # a cluster-wide DDL
        elif kind == "truncate":
            nodes = sorted(rng.sample(range(k), rng.randint(1, k)))
        elif k > 1 and rng.random() < (opts.distributed_ratio if kind == "ordinary" else 0.3):
            nodes = sorted(rng.sample(range(k), rng.randint(2, min(k, 3))))
        else:
            nodes = [rng.randrange(k)]
        abort = None
        if kind in ("ordinary", "large") and rng.random() < opts.abort_ratio:
            abort = rng.choice(("rollback", "after_committing", "after_committing", "after_csn", "after_csn"))
        g = GlobalTxn(txn_id, kind, nodes, abort)
        if kind == "ddl":
            return self._ddl(g)
        if kind == "truncate":
            return self._truncate(g)
        return self._large(g) if kind == "large" else self._ordinary(g)

    # --- transaction bodies -----------------------------------------------------

    def _part(self, g: GlobalTxn, node: int) -> NodePart:
        part = g.parts.get(node)
        if part is None:
            part = g.parts[node] = NodePart(self.wl, g.id, node)
        return part

    def _table(self, part: NodePart, weights: tuple[int, ...]) -> TableState:
        tables = part.tables
        ts = self.rng.choices(tables, weights)[0]
        return ts if ts.usable_by(part.txn_id) else tables[0]

    def _block(
        self,
        part: NodePart,
        nops: int,
        weights: tuple[int, ...],
        insert_bias: float,
        own_first: float,
        yield_every: int,
    ) -> Iterator[None]:
        """`nops` row changes, maybe inside a savepoint (maybe with an inner one)."""
        rng, wl = self.rng, self.wl
        use_sp = rng.random() < self.opts.savepoint_ratio
        if use_sp:
            part.savepoint()
        nested_at = rng.randrange(nops) if use_sp and rng.random() < 0.4 else -1
        inner = False
        for j in range(nops):
            if j == nested_at:
                part.savepoint()
                inner = True
            wl.random_op(part, self._table(part, weights), insert_bias, own_first)
            if inner and (j == nops - 1 or rng.random() < 0.3):
                part.release() if rng.random() < 0.6 else part.rollback_to()
                inner = False
            if yield_every and j % yield_every == yield_every - 1:
                yield
        if use_sp:
            part.rollback_to() if rng.random() < 0.45 else part.release()

    def _ordinary(self, g: GlobalTxn) -> Iterator[None]:
        rng, opts = self.rng, self.opts
        nstmts = max(len(g.nodes), rng.randint(*opts.statements))
        plan = list(g.nodes) + [rng.choice(g.nodes) for _ in range(nstmts - len(g.nodes))]
        rng.shuffle(plan)
        for cid, node in enumerate(plan):
            targets = [node]
            if g.markers and rng.random() < 0.2:  # one statement on two nodes: same cid on both
                other = rng.choice(g.nodes)
                if other != node:
                    targets = sorted((node, other))
            for n in targets:
                part = self._part(g, n)
                if g.markers:
                    part.set_cid(cid)
                yield from self._block(
                    part, rng.randint(*opts.ops_per_statement), TABLE_WEIGHTS, 0.45, 0.3, 0
                )
                yield
        yield from self._finish(g)

    def _large(self, g: GlobalTxn) -> Iterator[None]:
        rng = self.rng
        target = int(self.opts.large_txn_changes * rng.uniform(0.6, 1.4))
        done = cid = 0
        while done < target:
            part = self._part(g, g.nodes[cid % len(g.nodes)])
            if g.markers:
                part.set_cid(cid)
            batch = rng.randint(20, 60)
            yield from self._block(part, batch, LARGE_TABLE_WEIGHTS, 0.55, 0.7, 4)
            done += batch
            cid += 1
            yield
        yield from self._finish(g)

    def _acquire(self, g: GlobalTxn, tables: list[TableState]) -> Iterator[None]:
        """Exclusive table locks: queue, then wait for the current users to finish."""
        me = g.id
        while any(ts.pending not in (None, me) or ts.excl not in (None, me) for ts in tables):
            yield
        for ts in tables:
            ts.pending = me
        while any(u != me for ts in tables for u in ts.users):
            yield
        for ts in tables:
            ts.excl, ts.pending = me, None

    def _ddl(self, g: GlobalTxn) -> Iterator[None]:
        evolve = self.wl.by_name["evolve"]
        tables = [self.wl.tables[n][evolve] for n in g.nodes]
        yield from self._acquire(g, tables)
        step = evolve_step(self.ddl_steps, tables[0].shape.names)
        self.ddl_steps += 1
        for cid, (node, ts) in enumerate(zip(g.nodes, tables, strict=True)):
            part = self._part(g, node)
            if g.markers:
                part.set_cid(cid)
            part.alter(ts, step)
            for _ in range(self.rng.randint(1, 4)):
                self.wl.random_op(part, ts)
            yield
        yield from self._finish(g)

    def _truncate(self, g: GlobalTxn) -> Iterator[None]:
        rng, wl = self.rng, self.wl
        names = ["event_log", "audit"] if rng.random() < 0.4 else ["event_log"]
        per_node = {n: [wl.tables[n][wl.by_name[t]] for t in names] for n in g.nodes}
        yield from self._acquire(g, [ts for tss in per_node.values() for ts in tss])
        options = rng.choice((0, 0, 1, 2))  # CASCADE = 1, RESTART IDENTITY = 2
        for cid, node in enumerate(g.nodes):
            part = self._part(g, node)
            if g.markers:
                part.set_cid(cid)
            part.truncate(per_node[node], options)
            for _ in range(rng.randint(0, 3)):
                wl.random_op(part, per_node[node][0])
            yield
        yield from self._finish(g)

    # --- the commit protocol ------------------------------------------------------

    def _finish(self, g: GlobalTxn) -> Iterator[None]:
        rng, gtm = self.rng, self.gtm
        parts = [g.parts[n] for n in sorted(g.parts)]
        if g.abort == "rollback":  # fails before its commit: nothing was logged
            for p in parts:
                p.rollback()
                yield
            self.summary.aborted += 1
            return
        for p in rng.sample(parts, len(parts)):
            p.ns.message(markers.committing(g.gid, gtm.current()))
            p.committing_logged = True
            yield
        if g.abort == "after_committing":
            yield from self._abort(g, parts)
            return
        csn = gtm.next()
        self.open_csns[csn] = None
        order = rng.sample(parts, len(parts))
        fail_at = rng.randrange(len(order)) if g.abort == "after_csn" else -1
        for i, p in enumerate(order):
            if i == fail_at:  # PREPARE fails here, maybe after the commit marker went in
                if rng.random() < 0.5:
                    p.message(markers.commit(g.gid, csn))
                break
            p.message(markers.commit(g.gid, csn))
            p.prepare()
            yield
        if fail_at >= 0:
            del self.open_csns[csn]
            yield from self._abort(g, parts)
            return
        for p in rng.sample(order, len(order)):
            p.commit_prepared(self.now)
            yield
        del self.open_csns[csn]
        self._committed(g, csn, parts)

    def _abort(self, g: GlobalTxn, parts: list[NodePart]) -> Iterator[None]:
        for p in parts:
            p.rollback()  # ROLLBACK [PREPARED] first: only then is it certain not to commit
            p.ns.message(markers.abort(g.gid))
            yield
        self.summary.aborted += 1
        self._flush()

    def _committed(self, g: GlobalTxn, csn: int, parts: list[NodePart]) -> None:
        changes = [ch for p in parts for ch in p.changes]
        changes.sort(key=_cid)  # stable: node order, then stream order, within a cid
        line = json.dumps(
            {
                "csn": csn,
                "gid": g.gid,
                "commit_time": pg_time_to_iso(max(p.commit_time for p in parts)),
                "nodes": {p.name: {"xid": p.xid, "commit_lsn": lsn_to_str(p.commit_lsn)} for p in parts},
                "changes": changes,
            },
            ensure_ascii=False,
        )
        heapq.heappush(self.ready, (csn, line))
        self.summary.committed += 1
        self.summary.changes += len(changes)
        self._flush()

    def _flush(self) -> None:
        """Write every ready line no open txn (one holding a smaller CSN) can precede."""
        ready = self.ready
        floor = min(self.open_csns) if self.open_csns else None
        while ready and (floor is None or ready[0][0] < floor):
            self.expected_f.write(heapq.heappop(ready)[1] + "\n")


def _cid(change: dict[str, object]) -> int:
    cid = change["cid"]
    assert isinstance(cid, int)
    return cid


def _start_lsn(i: int) -> int:
    return START_LSNS[i] if i < len(START_LSNS) else (i << 32) | (0x01000000 * (i % 16))


def generate_cluster(
    out_dir: str | os.PathLike[str],
    nodes: int,
    transactions: int,
    seed: int = 0,
    binary: bool = True,
    options: GenerateOptions | None = None,
    **overrides: Any,
) -> GenerateSummary:
    """Write DIR/dn1.pgstream … dnK.pgstream and DIR/expected.jsonl; deterministic per seed.

    `binary` picks the tuple value format of the streams (`--text` is
    `binary=False`); the expected output is the same either way.  `overrides`
    replace single `GenerateOptions` fields, e.g. `large_txn_changes=2000`.
    Existing files of the same names are overwritten; other `*.pgstream` files
    in DIR are refused, since a replay of `DIR/*.pgstream` would mix them in.
    """
    if transactions < 0:
        raise ValueError(f"transactions must be >= 0, got {transactions}")
    opts = dataclasses.replace(options or GenerateOptions(), **overrides)
    out = os.fspath(out_dir)
    os.makedirs(out, exist_ok=True)
    ours = {f"dn{i + 1}.pgstream" for i in range(nodes)}
    stale = sorted(f for f in os.listdir(out) if f.endswith(".pgstream") and f not in ours)
    if stale:
        raise FileExistsError(
            f"{out} already holds {', '.join(stale)} from another run; remove them or use an empty directory"
        )
    return Generator(out, nodes, seed, binary, opts).run(transactions)
