"""`csnd workload`: concurrent distributed writers on live nodes through the shared GTM.

    parent ── setup (tables, seed rows) ── recover_in_doubt ── Ticker thread ─► tick on every node
      │
      ├─► writer process 1 ─┐  PgGtm (own session)  ─► GTM server: nextval, commit log
      ├─► writer process 2 ─┼─ GlobalTransaction    ─► dn1..dnK: DML, markers, PREPARE/COMMIT PREPARED
      └─► writer process W ─┘  OUT.wN (one JSON line per committed txn, written after its commit)
      │
      └── every second: progress on stderr; at the end OUT = the writers' lines by CSN, and a summary

Transactions (each writer's own seeded random mix): transfers between two
accounts, which live on different nodes as often as not (debit, credit and a
ledger row on each side, in statement order); a statement spread over every
node (one cid on all); single-node inserts; deletes of old ledger rows;
client rollbacks before commit (no markers at all); and failures after
`committing` -- a deferred unique violation that fails PREPARE, so the
writer logs `abort`.  With several writers the commit records reach each
node's WAL out of CSN order, as in a GaussDB cluster: writer A takes CSN 10,
writer B CSN 11, and B's COMMIT PREPARED lands first.

Distributed deadlocks are out of reach of each server's detector (a wait on
dn1 behind a wait on dn2), so writers take row locks in one global order:
accounts by id, deletes with SKIP LOCKED; lock_timeout is the net.

The committed file (JSON lines, by CSN): {"gid", "csn", "writer", "nodes":
{node: [[table, op, key], ...]}} -- each node's row changes in order, key
`id` for accounts and `gid:seq` for ledger rows, what a witness decoding
the nodes must find.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any, Final

import psycopg

from csnd.core.errors import CommitIncomplete, CommitInDoubt, CsndError
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.recovery import RecoveryReport, recover_in_doubt
from csnd.gtm.ticker import TICK_INTERVAL, Ticker
from csnd.gtm.writer import PAUSE_POINTS, GlobalTransaction

SCHEMA: Final = (
    "CREATE TABLE IF NOT EXISTS wl_accounts (id int PRIMARY KEY, balance bigint NOT NULL, node text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS wl_ledger (gid text, seq int, amount bigint NOT NULL, note text, "
    "PRIMARY KEY (gid, seq))",
    "CREATE TABLE IF NOT EXISTS wl_poison (k int, CONSTRAINT wl_poison_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
)
TABLES: Final = ("wl_accounts", "wl_ledger", "wl_poison")
LOCK_TIMEOUT_MS: Final = 5000
# counters per writer, in a shared array
_COMMITTED, _ROLLED_BACK, _FAILED, _CONFLICTS, _LAST_CSN, _DONE, _READY = range(7)
_NCOUNT: Final = 7


@dataclass
class LoadOptions:
    nodes: dict[str, str]  # name -> conninfo
    gtm: str  # conninfo of the GTM server
    writers: int = 4
    rate: float = 0.0  # transactions a second over all writers; 0: as fast as they go
    duration: float = 10.0
    out: str | None = None
    tick_interval: float = TICK_INTERVAL
    accounts: int = 50  # per node
    seed: int = 1
    max_txns: int | None = None  # per writer (tests)
    gtm_name: str = "csnd_gtm"
    progress: bool = True
    publication: str | None = None  # created FOR the workload's tables if given
    # A test hook: writer 0 stops (sleeps) at this commit step of its first
    # multi-node transaction after `pause_after` commits, and writes that
    # transaction's gid to `pause_file` first.
    pause_at: str | None = None
    pause_after: int = 0
    pause_file: str | None = None


@dataclass
class LoadSummary:
    committed: int = 0
    rolled_back: int = 0
    failed: int = 0  # aborted after committing
    conflicts: int = 0
    seconds: float = 0.0
    last_csn: int = 0
    ticks: int = 0
    errors: list[str] = field(default_factory=list)
    recovery: RecoveryReport | None = None
    out: str | None = None

    @property
    def per_second(self) -> float:
        return self.committed / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        return (
            f"{self.committed} distributed transactions committed in {self.seconds:.1f} s "
            f"({self.per_second:.0f}/s), {self.rolled_back} rolled back, {self.failed} aborted after "
            f"committing, {self.conflicts} lock conflicts; last csn {self.last_csn}; {self.ticks} tick rounds"
            + (f"; committed transactions in {self.out}" if self.out else "")
        )


def setup(opts: LoadOptions) -> None:
    """Create the tables on every node and seed the accounts (as one global transaction, so a
    GTM-mode reader started earlier sees it committed properly)."""
    conns = {n: psycopg.connect(u, autocommit=True) for n, u in opts.nodes.items()}
    try:
        for c in conns.values():
            for ddl in SCHEMA:
                c.execute(ddl.encode())
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            if opts.publication:
                exists = c.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (opts.publication,))
                if exists.fetchone() is None:
                    c.execute(
                        f'CREATE PUBLICATION "{opts.publication}" FOR TABLE {", ".join(TABLES)}'.encode()
                    )
        empty = [
            n for n, c in conns.items() if c.execute("SELECT count(*) FROM wl_accounts").fetchone() == (0,)
        ]
        if empty:
            with PgGtm(opts.gtm, opts.gtm_name) as gtm:
                t = GlobalTransaction(gtm, conns)
                names = list(opts.nodes)
                for n in empty:
                    i = names.index(n)
                    ids = [a for a in range(1, opts.accounts * len(names) + 1) if a % len(names) == i]
                    t.execute(
                        n,
                        "INSERT INTO wl_accounts SELECT x, 1000, %s FROM unnest(%s::int[]) x",
                        (n, ids),
                    )
                t.commit()
    finally:
        for c in conns.values():
            c.close()


def run_workload(opts: LoadOptions, *, err: Any = sys.stderr) -> LoadSummary:
    """Setup, recovery, ticker and W writer processes for `opts.duration`; returns the summary."""
    if opts.writers < 1 or not opts.nodes:
        raise CsndError("the workload needs at least one writer and one node")
    if opts.pause_at is not None and opts.pause_at not in PAUSE_POINTS:
        raise CsndError(f"unknown pause point {opts.pause_at!r}; one of {', '.join(PAUSE_POINTS)}")
    setup(opts)
    summary = LoadSummary(out=opts.out)
    with PgGtm(opts.gtm, opts.gtm_name) as gtm:
        conns = {n: psycopg.connect(u, autocommit=True) for n, u in opts.nodes.items()}
        try:
            summary.recovery = recover_in_doubt(conns, gtm)
        finally:
            for c in conns.values():
                c.close()
        if summary.recovery.committed or summary.recovery.aborted or summary.recovery.errors:
            print(f"workload: recovery: {summary.recovery.summary()}", file=err)
        summary.errors += summary.recovery.errors
        ctx = mp.get_context("spawn")
        counts = ctx.Array("q", opts.writers * _NCOUNT, lock=False)
        stop, go = ctx.Event(), ctx.Event()
        errq = ctx.Queue()
        procs = [
            ctx.Process(target=_writer_main, args=(opts, i, counts, stop, go, errq), name=f"csnd-writer-{i}")
            for i in range(opts.writers)
        ]
        for p in procs:
            p.start()
        ticker = Ticker(gtm, opts.nodes, opts.tick_interval).start()
        # The clock starts when every writer is connected (spawning takes seconds on a busy machine).
        while not all(counts[i * _NCOUNT + _READY] or not p.is_alive() for i, p in enumerate(procs)):
            time.sleep(0.02)
        go.set()
        t0 = time.monotonic()
        last_print, last_committed = t0, 0
        try:
            while True:
                try:
                    time.sleep(0.1)
                except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the run ends here, as its duration would
                    print("workload: stopping early on a signal", file=err, flush=True)
                    break
                now = time.monotonic()
                done = all(counts[i * _NCOUNT + _DONE] for i in range(opts.writers))
                if done or not any(p.is_alive() for p in procs) or now - t0 >= opts.duration:
                    break
                if opts.progress and now - last_print >= 1.0:
                    n_done = _total(counts, opts.writers, _COMMITTED)
                    rate = (n_done - last_committed) / (now - last_print)
                    print(
                        f"workload: {now - t0:5.1f}s committed {n_done} ({rate:.0f}/s) "
                        f"rolled back {_total(counts, opts.writers, _ROLLED_BACK)} "
                        f"aborted {_total(counts, opts.writers, _FAILED)} csn {_max(counts, opts.writers)} "
                        f"ticks {ticker.ticks}",
                        file=err,
                        flush=True,
                    )
                    last_print, last_committed = now, n_done
        finally:
            stop.set()
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join()
            summary.seconds = time.monotonic() - t0
            ticker.stop()
        summary.ticks = ticker.ticks
        summary.errors += [f"ticker: node {n}: {e}" for n, e in ticker.errors.items()]
    while not errq.empty():
        summary.errors.append(errq.get())
    summary.errors += [
        f"writer {i} exited with status {p.exitcode}"
        for i, p in enumerate(procs)
        if p.exitcode not in (0, None)
    ]
    summary.committed = _total(counts, opts.writers, _COMMITTED)
    summary.rolled_back = _total(counts, opts.writers, _ROLLED_BACK)
    summary.failed = _total(counts, opts.writers, _FAILED)
    summary.conflicts = _total(counts, opts.writers, _CONFLICTS)
    summary.last_csn = _max(counts, opts.writers)
    if opts.out:
        merge_outputs(opts.out, opts.writers)
    return summary


def merge_outputs(out: str, writers: int) -> None:
    """OUT = every writer's committed lines, by CSN; the per-writer files are removed."""
    lines = []
    for i in range(writers):
        part = f"{out}.w{i}"
        if os.path.exists(part):
            with open(part, encoding="utf-8") as f:
                lines += [json.loads(x) for x in f if x.strip()]
            os.remove(part)
    lines.sort(key=lambda r: r["csn"])
    with open(out + ".partial", "w", encoding="utf-8") as f:
        for r in lines:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    os.replace(out + ".partial", out)


def _total(counts: Any, writers: int, k: int) -> int:
    return sum(int(counts[i * _NCOUNT + k]) for i in range(writers))


def _max(counts: Any, writers: int) -> int:
    return max(int(counts[i * _NCOUNT + _LAST_CSN]) for i in range(writers))


# --- one writer process ---------------------------------------------------------------


def _writer_main(opts: LoadOptions, index: int, counts: Any, stop: Any, go: Any, errq: Any) -> None:
    base = index * _NCOUNT
    # A terminal's Ctrl-C reaches the whole process group: the parent alone
    # decides when the run ends (its stop event), so that every writer
    # finishes the transaction it is in and the summary counts them all.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _Writer(opts, index, counts, base, stop).run(go)
    except Exception as e:
        errq.put(f"writer {index}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    finally:
        counts[base + _DONE] = 1


class _Writer:
    def __init__(self, opts: LoadOptions, index: int, counts: Any, base: int, stop: Any) -> None:
        self.opts = opts
        self.index = index
        self.counts = counts
        self.base = base
        self.stop = stop
        self.rng = Random(opts.seed * 1000 + index)
        self.names = list(opts.nodes)
        self.n_accounts = opts.accounts * len(self.names)
        self.out = open(f"{opts.out}.w{index}", "a", encoding="utf-8") if opts.out else None  # noqa: SIM115
        self.txn_no = 0
        self._gid = ""
        self.changes: dict[str, list[list[Any]]] = {}

    def node_of(self, account: int) -> str:
        return self.names[account % len(self.names)]

    def run(self, go: Any) -> None:
        opts = self.opts
        gtm = PgGtm(opts.gtm, opts.gtm_name)
        conns = {n: psycopg.connect(u, autocommit=True) for n, u in opts.nodes.items()}
        for c in conns.values():
            c.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}".encode())
        self.counts[self.base + _READY] = 1
        go.wait()
        interval = opts.writers / opts.rate if opts.rate > 0 else 0.0
        next_at = time.monotonic()
        deadline = next_at + opts.duration
        try:
            parent = os.getppid()
            # (a parent killed -9 sets no stop event: an orphan stops by itself)
            while not self.stop.is_set() and time.monotonic() < deadline and os.getppid() == parent:
                if opts.max_txns is not None and self.txn_no >= opts.max_txns:
                    break
                if interval:
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                self.one(gtm, conns)
        finally:
            for c in conns.values():
                c.close()
            gtm.close()
            if self.out:
                self.out.close()

    def one(self, gtm: PgGtm, conns: dict[str, psycopg.Connection[Any]]) -> None:
        self.txn_no += 1
        rng = self.rng
        pause = self._pause_hook()
        t = GlobalTransaction(gtm, conns, gid=f"w{self.index}-{os.getpid()}-{self.txn_no}", pause=pause)
        self._gid = t.gid
        self.changes = {}
        k = rng.random()
        if pause is not None:
            kind = "spread"
        elif k < 0.5:
            kind = "transfer"
        elif k < 0.62:
            kind = "spread"
        elif k < 0.77:
            kind = "insert"
        elif k < 0.87:
            kind = "delete"
        elif k < 0.95:
            kind = "rollback"
        else:
            kind = "fail"
        try:
            getattr(self, f"_{kind}")(t)
            if kind == "rollback":
                t.rollback()
                self.counts[self.base + _ROLLED_BACK] += 1
                return
            csn = t.commit()
        except psycopg.errors.UniqueViolation:
            if kind != "fail":
                raise
            self.counts[self.base + _FAILED] += 1
            return
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            if t.state == "active":
                t.rollback()
            self.counts[self.base + _CONFLICTS] += 1
            return
        except (CommitIncomplete, CommitInDoubt):
            raise
        if csn is None:
            return
        if self.out:
            rec = {"gid": t.gid, "csn": csn, "writer": self.index, "nodes": self.changes}
            self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self.out.flush()
        self.counts[self.base + _COMMITTED] += 1
        self.counts[self.base + _LAST_CSN] = max(self.counts[self.base + _LAST_CSN], csn)

    def _pause_hook(self) -> Callable[[str], None] | None:
        o = self.opts
        if o.pause_at is None or self.index != 0 or self.counts[self.base + _COMMITTED] < o.pause_after:
            return None
        target = o.pause_at

        def pause(step: str) -> None:
            if step == target:
                if o.pause_file:
                    with open(o.pause_file + ".tmp", "w") as f:
                        f.write(self._gid)
                    os.replace(o.pause_file + ".tmp", o.pause_file)
                time.sleep(3600)  # the test kills us here

        return pause

    # --- transaction kinds: each records its row changes per node ----------------------

    def _exec(self, t: GlobalTransaction, node: str, table: str, op: str, query: str, params: Any) -> None:
        rows = t.execute(node, query, params).fetchall()
        lst = self.changes.setdefault(node, [])
        for r in rows:
            lst.append([table, op, r[0] if len(r) == 1 else f"{r[0]}:{r[1]}"])

    def _ledger(self, t: GlobalTransaction, node: str, seq: int, amount: int) -> None:
        self._exec(
            t,
            node,
            "wl_ledger",
            "INSERT",
            "INSERT INTO wl_ledger VALUES (%s, %s, %s, %s) RETURNING gid, seq",
            (t.gid, seq, amount, "x" * self.rng.randrange(0, 40)),
        )

    def _update(self, t: GlobalTransaction, account: int, delta: int) -> None:
        self._exec(
            t,
            self.node_of(account),
            "wl_accounts",
            "UPDATE",
            "UPDATE wl_accounts SET balance = balance + %s WHERE id = %s RETURNING id",
            (delta, account),
        )

    def _transfer(self, t: GlobalTransaction) -> None:
        a, b = self.rng.sample(range(1, self.n_accounts + 1), 2)
        amount = self.rng.randrange(1, 100)
        for acct, delta in sorted([(a, -amount), (b, amount)]):  # one global lock order
            self._update(t, acct, delta)
        self._ledger(t, self.node_of(a), 0, -amount)
        self._ledger(t, self.node_of(b), 1, amount)

    def _spread(self, t: GlobalTransaction) -> None:
        rng = self.rng
        with t.statement():
            for i, n in enumerate(self.names):
                self._ledger(t, n, i, rng.randrange(-50, 50))
        accounts = sorted(rng.randrange(1, self.n_accounts + 1) for _ in range(2))
        if accounts[0] != accounts[1]:
            for acct in accounts:
                self._update(t, acct, 0)

    def _insert(self, t: GlobalTransaction) -> None:
        n = self.rng.choice(self.names)
        for seq in range(self.rng.randrange(1, 4)):
            self._ledger(t, n, seq, self.rng.randrange(-9, 9))

    def _delete(self, t: GlobalTransaction) -> None:
        for n in self.rng.sample(self.names, min(2, len(self.names))):
            self._exec(
                t,
                n,
                "wl_ledger",
                "DELETE",
                "DELETE FROM wl_ledger WHERE (gid, seq) IN (SELECT gid, seq FROM wl_ledger ORDER BY gid, seq "
                "LIMIT 2 FOR UPDATE SKIP LOCKED) RETURNING gid, seq",
                None,
            )
        if not self.changes.get(self.names[0]) and not any(self.changes.values()):
            self._insert(t)  # nothing left to delete: write something instead

    def _rollback(self, t: GlobalTransaction) -> None:
        self._transfer(t)

    def _fail(self, t: GlobalTransaction) -> None:
        self._transfer(t)
        t.execute(self.rng.choice(self.names), "INSERT INTO wl_poison VALUES (1), (1)")  # fails at PREPARE
