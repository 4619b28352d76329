"""One distributed writer process of the fault suite (`child`, or `python -m tests.faults.writer ...`).

It commits global transactions through the shared GTM (`csnd.gtm.writer`)
on the fault suite's tables, at a steady rate, until SIGTERM (it finishes the
transaction in hand first).  Each writer owns its accounts (ids
`index*1000+1 ...`) and its ledger rows (gids `<run>-w<index>-...`), so writers
never wait on each other's row locks -- nor on a killed writer's prepared
transaction.

After each commit it appends one JSON line to OUT, flushed: `{"gid", "csn",
"nodes": {node: [[table, op, key], ...]}}` -- what the witness must hold.  A
transaction whose commit failed half-way (a server restarted under it) is not
written: it may or may not have committed, and the witness says which; its
connections and its GTM session are dropped, so `csnd gtm recover` sees a dead
owner and finishes it, and the writer goes on with fresh ones.

`--pause STEP --pause-after N`: the first multi-node transaction after N
commits stops at STEP of its commit (`csnd.gtm.writer.PAUSE_POINTS`), writes
its gid to `--pause-file` and sleeps there, to be killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import time
from typing import Any, Final

import psycopg

from csnd.core.errors import CsndError
from csnd.gtm.pggtm import PgGtm
from csnd.gtm.writer import GlobalTransaction

ACCOUNTS: Final = 24  # per writer
# Big enough to be stored out of line (the column's storage is EXTERNAL):
# updates that do not touch it carry it as an unchanged TOAST value.
DOC_CHARS: Final = 2600
KINDS: Final = (  # (kind, weight)
    ("transfer", 40),
    ("spread", 14),
    ("full", 10),
    ("insert", 10),
    ("delete", 10),
    ("rollback", 8),
    ("fail", 8),
)

Conn = psycopg.Connection[Any]


class Writer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.nodes: dict[str, str] = dict(n.split("=", 1) for n in args.node)
        self.names = list(self.nodes)
        self.rng = random.Random(f"{args.seed}-{args.index}")
        self.prefix = f"{args.run}-w{args.index}"
        self.out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115
        self.stop = False
        self.committed = 0
        self.txn_no = 0
        self.changes: dict[str, list[list[Any]]] = {}
        self.gtm: PgGtm | None = None
        self.conns: dict[str, Conn] = {}

    # --- connections -------------------------------------------------------------------

    def connect(self) -> None:
        self.gtm = PgGtm(self.args.gtm)
        self.conns = {
            n: psycopg.connect(u, autocommit=True, connect_timeout=5) for n, u in self.nodes.items()
        }
        for c in self.conns.values():
            c.execute("SET lock_timeout = 3000")

    def drop(self) -> None:
        """Close everything (a half-done commit is left to `csnd gtm recover`)."""
        for c in self.conns.values():
            c.close()
        self.conns = {}
        if self.gtm is not None:
            # (closed so its session ends: recovery waits for a record's owner to be gone)
            with contextlib.suppress(Exception):
                self.gtm.close()
            self.gtm = None

    # --- the loop ----------------------------------------------------------------------

    def run(self) -> None:
        interval = 1.0 / self.args.rate
        next_at = time.monotonic()
        while not self.stop:
            if not self.conns:
                try:
                    self.connect()
                except (psycopg.Error, CsndError):
                    self.drop()
                    time.sleep(0.2)
                    continue
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()
            try:
                self.one()
            except (psycopg.Error, CsndError):  # CommitInDoubt and CommitIncomplete too
                self.drop()  # a server went away under us: start over on fresh connections
                time.sleep(0.1)
        self.drop()
        self.out.close()

    def one(self) -> None:
        assert self.gtm is not None
        self.txn_no += 1
        a = self.args
        pause = None
        if a.pause and self.committed >= a.pause_after:
            pause = self._pause
            kind = "transfer"
        else:
            kind = self.rng.choices([k for k, _ in KINDS], [w for _, w in KINDS])[0]
        t = GlobalTransaction(self.gtm, self.conns, gid=f"{self.prefix}-{self.txn_no}", pause=pause)
        self.changes = {}
        try:
            getattr(self, f"_{kind}")(t)
            if pause is not None and len(t._touched) < 2:
                t.rollback()  # (the pause is for a multi-node transaction; try again)
                return
            if kind == "rollback":
                t.rollback()
                return
            csn = t.commit()
        except psycopg.errors.UniqueViolation:
            if kind != "fail":
                raise
            return
        except psycopg.errors.LockNotAvailable:
            if t.state == "active":
                t.rollback()
            return
        if csn is None:
            return
        rec = {"gid": t.gid, "csn": csn, "kind": kind, "nodes": self.changes}
        self.out.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.out.flush()
        self.committed += 1

    def _pause(self, step: str) -> None:
        if step == self.args.pause:
            tmp = self.args.pause_file + ".tmp"
            with open(tmp, "w") as f:
                f.write(self._gid_in_hand())
            os.replace(tmp, self.args.pause_file)
            time.sleep(3600)  # the test kills us here

    def _gid_in_hand(self) -> str:
        return f"{self.prefix}-{self.txn_no}"

    # --- transaction kinds: each records its row changes per node ----------------------

    def node_of(self, account: int) -> str:
        return self.names[account % len(self.names)]

    def _exec(self, t: GlobalTransaction, node: str, table: str, query: str, params: Any = None) -> None:
        """Run a statement whose RETURNING gives (key, inserted?) per row; record the changes."""
        rows = t.execute(node, query, params).fetchall()
        lst = self.changes.setdefault(node, [])
        for key, inserted in rows:
            op = "INSERT" if inserted is True else "UPDATE" if inserted is False else str(inserted)
            lst.append([table, op, key])

    def _ledger(self, t: GlobalTransaction, node: str, seq: int, amount: int) -> None:
        note = "".join(self.rng.choice("abc'xyz") for _ in range(self.rng.randrange(0, 12)))
        self._exec(
            t,
            node,
            "fx_ledger",
            "INSERT INTO fx_ledger VALUES (%s, %s, %s, %s) RETURNING gid || ':' || seq, 'INSERT'",
            (t.gid, seq, amount, note or None),
        )

    def _account(self, t: GlobalTransaction, account: int, delta: int) -> None:
        doc = "".join(self.rng.choice("0123456789abcdef") for _ in range(DOC_CHARS))
        self._exec(
            t,
            self.node_of(account),
            "fx_acct",
            "INSERT INTO fx_acct VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
            "SET balance = fx_acct.balance + excluded.balance, note = excluded.note "
            "RETURNING id, xmax = 0",
            (account, delta, f"t{self.txn_no}", doc),
        )

    def _transfer(self, t: GlobalTransaction) -> None:
        base = self.args.index * 1000
        a, b = self.rng.sample(range(base + 1, base + ACCOUNTS + 1), 2)
        amount = self.rng.randrange(1, 100)
        for acct, delta in sorted([(a, -amount), (b, amount)]):
            self._account(t, acct, delta)
        if self.rng.random() < 0.3:  # a rolled-back subtransaction: never delivered
            node = self.node_of(a)
            t.execute(
                node,
                f"SAVEPOINT s; INSERT INTO fx_ledger VALUES ('{t.gid}', 99, 0, 'gone'); ROLLBACK TO SAVEPOINT s",
            )
        self._ledger(t, self.node_of(a), 0, -amount)
        self._ledger(t, self.node_of(b), 1, amount)

    def _spread(self, t: GlobalTransaction) -> None:
        with t.statement():
            for i, n in enumerate(self.names):
                self._ledger(t, n, i, self.rng.randrange(-50, 50))

    def _full(self, t: GlobalTransaction) -> None:
        """A REPLICA IDENTITY FULL table: updates and deletes carry the whole old row."""
        node = self.rng.choice(self.names)
        key = self.args.index * 1000 + self.rng.randrange(1, 8)
        value = f"v{self.txn_no}" if self.rng.random() < 0.8 else None
        self._exec(
            t,
            node,
            "fx_full",
            "INSERT INTO fx_full VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET v = excluded.v RETURNING id, xmax = 0",
            (key, value),
        )
        if self.rng.random() < 0.3:
            self._exec(t, node, "fx_full", "DELETE FROM fx_full WHERE id = %s RETURNING id, 'DELETE'", (key,))

    def _insert(self, t: GlobalTransaction) -> None:
        node = self.rng.choice(self.names)
        for seq in range(self.rng.randrange(1, 4)):
            self._ledger(t, node, seq, self.rng.randrange(-9, 9))

    def _delete(self, t: GlobalTransaction) -> None:
        for n in self.rng.sample(self.names, 2):
            self._exec(
                t,
                n,
                "fx_ledger",
                "DELETE FROM fx_ledger WHERE (gid, seq) IN (SELECT gid, seq FROM fx_ledger WHERE gid LIKE %s "
                "ORDER BY gid, seq LIMIT 2) RETURNING gid || ':' || seq, 'DELETE'",
                (self.prefix + "-%",),
            )
        if not any(self.changes.values()):
            self._insert(t)  # nothing left to delete: write something instead

    def _rollback(self, t: GlobalTransaction) -> None:
        self._transfer(t)

    def _fail(self, t: GlobalTransaction) -> None:
        self._transfer(t)
        t.execute(self.rng.choice(self.names), "INSERT INTO fx_poison VALUES (1), (1)")  # fails at PREPARE


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gtm", required=True)
    p.add_argument("--node", action="append", required=True, metavar="NAME=URL")
    p.add_argument("--run", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--rate", type=float, default=30.0)
    p.add_argument("--out", required=True)
    p.add_argument("--pause")
    p.add_argument("--pause-after", type=int, default=0)
    p.add_argument("--pause-file", default="")
    w = Writer(p.parse_args(argv))

    def stop(_sig: int, _frame: object) -> None:
        w.stop = True

    signal.signal(signal.SIGTERM, stop)
    w.run()


def child(argv: list[str], err: str) -> None:
    """A multiprocessing target (the suite forks writers from a forkserver that has imported this)."""
    fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    main(argv)


if __name__ == "__main__":
    main()
