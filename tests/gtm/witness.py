"""An independent witness of a GTM-mode node: its test_decoding slot, parsed.

Each committed local transaction becomes (gid, csn, row changes) in commit
order; non-transactional markers are kept in stream order.  Nothing of csnd's
reader or sender is used.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

_MSG = re.compile(r"^message: transactional: ([01]) prefix: csn, sz: \d+ content:(.*)$")
_ROW = re.compile(r"^table public\.(\w+): (INSERT|UPDATE|DELETE): (.*)$")
_COL = re.compile(r"(\w+)\[[^\]]+\]:('(?:[^']|'')*'|\S+)")


@dataclass
class Txn:
    gid: str | None = None
    csn: int | None = None
    changes: list[list[Any]] = field(default_factory=list)


@dataclass
class NodeWitness:
    commits: list[Txn] = field(default_factory=list)  # in commit order
    markers: list[str] = field(default_factory=list)  # non-transactional, in stream order


def _key(table: str, cols: dict[str, str]) -> Any:
    if "id" in cols:
        return int(cols["id"])
    return f"{cols['gid'].strip(chr(39))}:{cols['seq']}"


def create_slot(conn: psycopg.Connection[Any], slot: str) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (slot,))


def read_slot(conn: psycopg.Connection[Any], slot: str, tables: tuple[str, ...] = ()) -> NodeWitness:
    """Consume the slot up to the current WAL (flushed first) and parse it."""
    conn.execute("BEGIN; SET LOCAL synchronous_commit = on; SELECT pg_current_xact_id(); COMMIT")
    target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
    deadline = time.monotonic() + 30
    while not conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", target).fetchone()[0]:  # type: ignore[index]
        assert time.monotonic() < deadline, "WAL was not flushed"
        time.sleep(0.05)
    w = NodeWitness()
    cur: Txn | None = None
    for (data,) in conn.execute("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL)", (slot,)):
        m = _MSG.match(data)
        if m:
            if m.group(1) == "0":
                w.markers.append(m.group(2))
            elif cur is not None and m.group(2).startswith("commit "):
                _, gid, csn = m.group(2).split(" ")
                cur.gid, cur.csn = gid, int(csn)
            continue
        if data.startswith("BEGIN"):
            cur = Txn()
        elif data.startswith("COMMIT"):
            assert cur is not None
            if cur.gid is not None or cur.changes:
                w.commits.append(cur)
            cur = None
        else:
            r = _ROW.match(data)
            # (the GTM's own commit log, csnd_gtm_txn, lives in dn1 here: not a workload table)
            if r and not r.group(1).startswith("csnd_") and (not tables or r.group(1) in tables):
                assert cur is not None
                cols = dict(_COL.findall(r.group(3)))
                cur.changes.append([r.group(1), r.group(2), _key(r.group(1), cols)])
    return w
