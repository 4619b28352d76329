"""Transactions for the changefeed tests: section 7 lines, a filled changelog, a running server."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from csnd.changelog import Changelog, SubscriptionStore
from csnd.service import FeedSettings, RunningServer, start_changefeed

TABLES = [("public", "acct"), ("public", "orders"), ("sales", "acct"), ("odd", "a.b")]


def change(i: int, schema: str, table: str, node: str = "dn1") -> dict[str, Any]:
    return {
        "node": node,
        "cid": i,
        "lsn": f"0/{0x16B3600 + 16 * i:X}",
        "op": "insert",
        "schema": schema,
        "table": table,
        "old": None,
        "new": {"id": i, "note": f'ünïcode [{i}] "q" ]}}', "f": 1.5e-07, "x": [1, {"k": None}]},
    }


def line(csn: int, tables: Sequence[tuple[str, str]], gid: str | None = None) -> bytes:
    """A docs/design.md section 7 line, written as json.dumps writes it (the format's definition)."""
    obj = {
        "csn": csn,
        "gid": gid,
        "commit_time": "2026-11-22T10:00:00.123456+00:00",
        "nodes": {"dn1": {"xid": 700 + csn, "commit_lsn": f"0/{csn:X}"}},
        "changes": [change(i, s, t) for i, (s, t) in enumerate(tables)],
    }
    return json.dumps(obj, ensure_ascii=False).encode()


def txn_tables(csn: int) -> list[tuple[str, str]]:
    """A deterministic mix: some transactions touch one table, some several, some none of public."""
    k = csn % 5
    return [TABLES[(csn + j) % len(TABLES)] for j in range(k + 1)]


def fill(log: Changelog, csns: Sequence[int]) -> dict[int, bytes]:
    written = {}
    for csn in csns:
        written[csn] = line(csn, txn_tables(csn), gid=f"g-{csn}")
        log.append(csn, written[csn])
    log.sync()
    return written


def open_log(directory: str, **kw: Any) -> Changelog:
    return Changelog(directory, **kw)


def serve(log: Changelog, **kw: Any) -> RunningServer:
    kw.setdefault("subscriptions", SubscriptionStore(log.directory))
    return start_changefeed(log, **kw)


FAST = FeedSettings(keepalive_s=0.2, client_timeout_s=2.0, store_interval_s=0.1)


def wait_for(cond: Callable[[], Any], what: str, seconds: float = 60.0) -> Any:
    """Waits (generously) for `cond()` to be truthy; fails naming `what`."""
    deadline = time.monotonic() + seconds
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def take(it: Iterator[tuple[int, bytes]], n: int) -> list[tuple[int, bytes]]:
    return [next(it) for _ in range(n)]


def in_dir(tmp: Any, name: str) -> str:
    path = os.path.join(str(tmp), name)
    os.makedirs(path, exist_ok=True)
    return path
