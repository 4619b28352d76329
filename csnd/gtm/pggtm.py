"""A shared, durable GTM: a PostgreSQL sequence on a designated server.

Writer processes on any machine share one CSN sequencer by connecting to the
same server (the "GTM server"; it may be one of the nodes):

    writer process 1 ─┐   nextval('csnd_gtm')                    ── next()
    writer process 2 ─┼─► pg_sequence_last_value('csnd_gtm')     ── current()
    ticker           ─┘   csnd_gtm_txn (gid, nodes, LSNs, csn)   ── the commit log

`next()` is `nextval`.  `current()` must be the latest CSN handed out by ANY
process, because the protocol's guarantee is about every process: a writer
logs `committing <gid> <current()>` (or the ticker `tick <current()>`), and
every `next()` that starts after that `current()` returned must be greater.

- `currval()` is wrong: it is the value the *calling session's* last nextval
  returned (and an error before its first one), blind to other processes.
- `last_value` is right only with CACHE 1: with CACHE n each session takes n
  values at a time and hands them out from its private cache, so values leave
  the sequence out of order and `last_value` is the end of the newest cached
  range, not the latest value handed out.  The sequence is created with
  CACHE 1 and a sequence found with another cache size is refused.
- An in-flight nextval: nextval updates the sequence tuple in place on its
  one page while holding that buffer's exclusive lock, and returns the value
  only after releasing it.  `pg_sequence_last_value()` reads the tuple under
  the same buffer lock (read_seq_tuple), so a read is ordered before or after
  each nextval, never inside one (`SELECT last_value FROM seq` reads the page
  without the content lock, so it is not used).  Reads and nextvals are
  therefore linearizable: if current() returned c, the nextval that produced
  c took the lock before that read, and any nextval that starts after the
  read returned takes the lock later and returns at least c + 1.  A current()
  may return a value whose nextval has not yet returned to its caller; that
  is harmless -- the guarantee is about later next() calls, and the value is
  already taken.  (tests/gtm/test_pggtm.py checks exactly this property with
  several processes: each logs its current() before its next(), and every
  next() exceeds every current() logged before it started.)

Durability.  Sequences are WAL-logged, but to save WAL a nextval logs a
value 32 ahead (SEQ_LOG_VALS) and writes no WAL for the next 32 calls; after
a crash, replay restores the logged value, so the sequence resumes up to 32
values *ahead* of the last one handed out.  That skips CSNs, never repeats
one: CSNs need to be unique and increasing, not dense.  The pre-logged WAL
record must be on disk before any of the values it covers is used: nextval
assigns its transaction an xid so that the autocommit commit flushes the WAL
(and a checkpoint forces a fresh record), and this connection runs with
`synchronous_commit = on` whatever the server default, so a value is durable
before `next()` returns it.

The commit log (table `<name>_txn`) is what in-doubt recovery reads
(`gtm.recovery`); each row is written before the writer's first marker
(`begin_commit`, which also returns current() in the same round trip),
notes the CSN the moment it is taken (`take_csn`: `taken`, the same
statement as nextval, which a commit barrier reads -- `gtm.barrier`),
updated with the commit CSN once every node has prepared (`decide_commit`,
the point of no return), and deleted lazily once the transaction is finished
everywhere (`end_commit`: the gids are deleted by the next `begin_commit`'s
statement, saving a round trip per transaction).  A row names its owner --
the writer's GTM session (backend pid and start time) -- so recovery leaves
the transactions of live writers alone.  The commit log's own commits carry
no `commit` marker: when the GTM lives in a database that is also a
GTM-mode node, its publication must not include `<name>_txn` (publish the
data tables, not FOR ALL TABLES), or csnd rightly reports a transaction
with changes and no commit marker.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import psycopg

from csnd.core.errors import ConfigError, CsndError
from csnd.core.ids import Csn, lsn_to_str

_NAME_RE = re.compile(r"^[a-z_][a-z0-9_]{0,58}$")

DEFAULT_NAME = "csnd_gtm"


class PgGtm:
    """`Sequencer` backed by sequence `name` (and table `<name>_txn`) on the server at `conninfo`.

    Thread-safe (one connection, one lock); a process normally has one.
    The sequence and the table are created on first use.
    """

    def __init__(self, conninfo: str, name: str = DEFAULT_NAME, *, connect_timeout: int = 10) -> None:
        if not _NAME_RE.match(name):
            raise ConfigError(f"gtm name {name!r} must be a lowercase identifier of at most 59 characters")
        self.conninfo = conninfo
        self.name = name
        self.table = f"{name}_txn"
        self._lock = threading.Lock()
        self._finished: list[str] = []
        self._taken: set[str] = set()  # gids with a CSN taken and no decision yet
        try:
            self._conn: psycopg.Connection[Any] = psycopg.connect(
                conninfo, autocommit=True, connect_timeout=connect_timeout
            )
        except psycopg.Error as e:
            raise CsndError(f"gtm: cannot connect to {_redact(conninfo)}: {_first_line(e)}") from e
        try:
            self._conn.execute("SET synchronous_commit = on")
            ensure_objects(self._conn, name)
            row = self._conn.execute(
                "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"
            ).fetchone()
            assert row is not None
            self.owner: tuple[int, Any] = (row[0], row[1])
        except BaseException:
            self._conn.close()
            raise

    # --- the sequencer ----------------------------------------------------------------

    def current(self) -> Csn:
        """The latest CSN handed out by any process (0 before the first)."""
        return Csn(self._one("SELECT pg_sequence_last_value(%s::regclass)", (self.name,)) or 0)

    def next(self) -> Csn:
        """A new CSN, strictly larger than every CSN handed out before, durable when returned."""
        return Csn(self._one("SELECT nextval(%s::regclass)", (self.name,)))

    def take_csn(self, gid: str) -> Csn:
        """`gid`'s commit CSN: `next()`, noted in its commit-log record in the same statement.

        A commit barrier (`gtm.barrier`) holds the sequence and must tell the
        transactions that already have a CSN (they commit before it lets go)
        from those still to take one: the record says so, atomically.
        """
        with self._lock:
            csn = self._execute(
                f"UPDATE {self.table} SET taken = nextval(%s::regclass) WHERE gid = %s RETURNING taken",
                (self.name, gid),
            )
            if csn is None:
                raise CsndError(
                    f"gtm: no commit record for global transaction {gid} in {self.table}; "
                    "was it resolved by csnd gtm recover while its writer was alive?"
                )
            self._taken.add(gid)
        return Csn(csn)

    # --- the commit log ---------------------------------------------------------------

    def begin_commit(self, gid: str, start_lsns: Mapping[str, int]) -> Csn:
        with self._lock:
            done, self._finished = self._finished, []
            try:
                row = self._execute(
                    f"WITH done AS (DELETE FROM {self.table} WHERE gid = ANY(%s)) "
                    f"INSERT INTO {self.table} (gid, owner_pid, owner_start, nodes, start_lsns) "
                    "VALUES (%s, %s, %s, %s, %s::pg_lsn[]) "
                    "RETURNING pg_sequence_last_value(%s::regclass)",
                    (
                        done,
                        gid,
                        self.owner[0],
                        self.owner[1],
                        list(start_lsns),
                        [lsn_to_str(x) for x in start_lsns.values()],
                        self.name,
                    ),
                )
            except BaseException:
                self._finished[:0] = done
                raise
        return Csn(row or 0)

    def decide_commit(self, gid: str, csn: Csn) -> None:
        with self._lock:
            cur = self._cursor_execute(
                f"UPDATE {self.table} SET csn = %s WHERE gid = %s AND csn IS NULL", (csn, gid)
            )
        self._taken.discard(gid)
        if cur != 1:
            raise CsndError(
                f"gtm: no open commit record for global transaction {gid} in {self.table}; "
                "was it resolved by csnd gtm recover while its writer was alive?"
            )

    def end_commit(self, gid: str) -> None:
        with self._lock:
            if gid in self._taken:
                # Rolled back after taking a CSN (no decision): deleted now, not with the next
                # begin_commit, or a commit barrier would wait for it as for a commit under way.
                self._taken.discard(gid)
                try:
                    self._execute(f"DELETE FROM {self.table} WHERE gid = %s RETURNING 1", (gid,))
                    return
                except CsndError:
                    pass  # (the connection broke: deleted later, by a begin_commit or recovery)
            self._finished.append(gid)

    def close(self) -> None:
        """Delete the finished transactions' records and close the connection."""
        with self._lock:
            if self._finished and not self._conn.closed:
                try:
                    self._conn.execute(f"DELETE FROM {self.table} WHERE gid = ANY(%s)", (self._finished,))
                    self._finished = []
                except psycopg.Error:
                    pass  # recovery deletes them (finished records resolve to nothing)
            self._conn.close()

    def __enter__(self) -> PgGtm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PgGtm({_redact(self.conninfo)!r}, name={self.name!r})"

    # --- plumbing ---------------------------------------------------------------------

    def _one(self, query: str, params: tuple[Any, ...]) -> Any:
        with self._lock:
            return self._execute(query, params)

    def _execute(self, query: str, params: tuple[Any, ...]) -> Any:
        try:
            row = self._conn.execute(query, params).fetchone()
        except psycopg.Error as e:
            raise CsndError(f"gtm {self.name} at {_redact(self.conninfo)}: {_first_line(e)}") from e
        return row[0] if row is not None else None

    def _cursor_execute(self, query: str, params: tuple[Any, ...]) -> int:
        try:
            return self._conn.execute(query, params).rowcount
        except psycopg.Error as e:
            raise CsndError(f"gtm {self.name} at {_redact(self.conninfo)}: {_first_line(e)}") from e


def ensure_objects(conn: psycopg.Connection[Any], name: str) -> None:
    """Create the sequence and the commit-log table if missing; refuse a cached sequence.

    Several processes may start at once, and IF NOT EXISTS does not make two
    concurrent CREATEs safe: both pass the check, then one fails on the
    catalog's unique index or with "relation already exists", depending on
    where they meet.  So the creators take a transaction-scoped advisory
    lock on the name first and create one at a time.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"csnd.gtm.{name}",))
        conn.execute(
            f"CREATE SEQUENCE IF NOT EXISTS {name} AS bigint MINVALUE 1 START 1 CACHE 1 NO CYCLE".encode()
        )
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {name}_txn (gid text PRIMARY KEY, owner_pid int NOT NULL, "
            "owner_start timestamptz NOT NULL, nodes text[] NOT NULL, start_lsns pg_lsn[] NOT NULL, "
            "csn bigint, created timestamptz NOT NULL DEFAULT now(), taken bigint)".encode()
        )
        # (a commit log made before `taken` existed gets it; only then, as ALTER locks the table)
        if not conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'taken' AND NOT attisdropped",
            (f"{name}_txn",),
        ).fetchone():
            conn.execute(f"ALTER TABLE {name}_txn ADD COLUMN IF NOT EXISTS taken bigint".encode())
    row = conn.execute(
        "SELECT cache_size FROM pg_sequences WHERE sequencename = %s AND schemaname = current_schema()",
        (name,),
    ).fetchone()
    if row is None or row[0] != 1:
        raise ConfigError(
            f"gtm: sequence {name} has cache size {row[0] if row else '?'}; a shared gtm needs CACHE 1 "
            f"(ALTER SEQUENCE {name} CACHE 1), or its last_value is not the latest csn handed out"
        )


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _redact(conninfo: str) -> str:
    """A conninfo without its password, for messages."""
    conninfo = re.sub(r"password=\S+", "password=***", conninfo)
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", conninfo)
