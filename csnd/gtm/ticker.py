"""Tick watermarks: `tick <gtm.current()>` on every node, every interval.

In GTM mode a keepalive is no tick: csnd's merge can pass CSN c only when
every node has a pending transaction or a watermark at or beyond c, so a node
with no writes holds the whole stream back.  The ticker writes a watermark on
every node from the shared GTM's side:

    every TICK_INTERVAL:  c = gtm.current()
                          for each node: tick c   (flushed: see below)

Valid whenever written (docs/design.md section 2): a transaction not yet committing
on a node logs `committing` there before it takes its commit CSN, so its
`next()` starts after this `current()` returned and is greater.

An idle cluster.  `tick c` promises every later commit on the node a CSN
greater than c, so a node's watermark after it is c itself (docs/design.md section
3): ticking `current()` passes every CSN handed out, and the last
transaction before a quiet spell is released at the next round.  The ticker
spends no CSNs -- as a real GTM, which does not advance while idle.

Flushing.  PostgreSQL 15 writes a non-transactional message to the WAL
without flushing it (docs/design.md section 9); on an idle node nothing else
flushes it, so it reaches the walsender only when the WAL writer does, every
`wal_writer_delay` (200 ms by default).  bench/gtm_bench.py times a tick
on an idle server from the emit call to its line at a logical replication
client (pg_recvlogical): alone, p50 150 ms, p90 153 ms (up to the WAL
writer's next round); in the flushing transaction, p50 1.0 ms, p90 2.9 ms.  A watermark
that arrives 200 ms late is 200 ms of extra latency for every transaction
behind it.  So each tick is written in a tiny transaction that has an xid
(`writer.emit_flushed`): its commit flushes the WAL up to itself and wakes
the walsenders.  The alternatives: setting the node's wal_writer_delay low
(a server-wide setting a client should not need), or waiting for PostgreSQL
17's `flush` argument.  `abort` markers, the other ones that unblock a
stream, are flushed the same way by the writer and by recovery.

TICK_INTERVAL trades latency against cost: an idle node's watermark lags by
up to one interval (plus the flush), which is the latency an idle node adds
to everyone's transactions; each tick costs every node a WAL record, a commit
record with its flush, and a wake-up of each walsender and of csnd's reader.
100 ms keeps an idle node's share of the latency near the flush itself, at
10 flushes a second per node -- nothing next to a busy node's commits.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Final

import psycopg

from csnd.core.ids import Csn
from csnd.gtm.sequencer import Sequencer
from csnd.gtm.writer import write_tick

TICK_INTERVAL: Final = 0.1  # seconds; see the module docstring for the trade-off


class Ticker:
    """A thread writing flushed ticks to every node (`nodes`: name -> conninfo).

    The thread owns its node connections; `gtm` must be thread-safe (`Gtm`,
    `PgGtm`).  A node that fails is retried at the next interval (its
    connection reopened), so a restarted server gets ticks again; the last
    error is kept in `errors[name]`.
    """

    def __init__(
        self,
        gtm: Sequencer,
        nodes: Mapping[str, str],
        interval: float = TICK_INTERVAL,
        *,
        flush: bool = True,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"tick interval must be > 0, got {interval}")
        self.gtm = gtm
        self.nodes = dict(nodes)
        self.interval = interval
        self.flush = flush
        self.ticks = 0  # rounds completed
        self.last_csn: Csn | None = None
        self.errors: dict[str, str] = {}
        self._stop = threading.Event()
        self._conns: dict[str, psycopg.Connection[Any]] = {}
        self._thread = threading.Thread(target=self._run, name="csnd-ticker", daemon=True)

    def start(self) -> Ticker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def tick_once(self) -> Csn:
        """One round: the current CSN to every node; returns it."""
        csn = self.gtm.current()  # (never next(): see "An idle cluster" above)
        for name, conninfo in self.nodes.items():
            try:
                conn = self._conns.get(name)
                if conn is None or conn.closed:
                    conn = self._conns[name] = psycopg.connect(conninfo, autocommit=True, connect_timeout=5)
                write_tick(conn, csn, flush=self.flush)
                self.errors.pop(name, None)
            except psycopg.Error as e:
                self.errors[name] = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                bad = self._conns.pop(name, None)
                if bad is not None:
                    bad.close()
        self.ticks += 1
        self.last_csn = csn
        return csn

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    self.tick_once()
                except Exception as e:  # the gtm went away: keep trying, say why
                    self.errors["gtm"] = str(e)
        finally:
            for conn in self._conns.values():
                conn.close()

    def __enter__(self) -> Ticker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
