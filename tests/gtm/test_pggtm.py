"""PgGtm: a PostgreSQL sequence shared by processes, durable across a server restart."""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any

import psycopg
import pytest

from csnd.core.errors import ConfigError
from csnd.gtm.pggtm import PgGtm
from tests.fixtures.pg import PgDatabase, PgServer


def _hammer(dsn: str, rounds: int, published: Any, lock: Any, out: Any) -> None:
    """Log current() (as a writer logs committing), then take next(): it must exceed everything logged before."""
    try:
        _hammer_rounds(dsn, rounds, published, lock, out)
    except BaseException:  # (reported, not lost in a child's stderr while the parent waits)
        out.put(traceback.format_exc())


def _hammer_rounds(dsn: str, rounds: int, published: Any, lock: Any, out: Any) -> None:
    with PgGtm(dsn) as gtm:
        got: list[int] = []
        for _ in range(rounds):
            c = gtm.current()
            with lock:
                published.value = max(published.value, c)
            with lock:
                seen = published.value  # every current() logged before this next() starts
            n = gtm.next()
            if n <= seen:
                out.put(f"next() {n} <= current() {seen} logged before it")
            if got and n <= got[-1]:
                out.put(f"next() went backwards: {got[-1]} then {n}")
            if gtm.current() < n:
                out.put(f"current() below this process's own next() {n}")
            got.append(n)
        out.put(got)


def test_shared_across_processes(pg: PgDatabase) -> None:
    ctx = mp.get_context("spawn")
    published, lock, out = ctx.Value("q", 0, lock=False), ctx.Lock(), ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(pg.dsn, 300, published, lock, out)) for _ in range(4)]
    for p in procs:
        p.start()
    results: list[Any] = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    problems = [r for r in results if isinstance(r, str)]
    assert not problems, problems[0] if problems else ""
    flat = sorted(x for r in results for x in r)
    assert flat == list(range(1, 1201)), "each CSN handed out once, none skipped without a crash"
    with PgGtm(pg.dsn) as gtm:
        assert gtm.current() == 1200


def test_durable_across_restart(pg_server: PgServer, pg: PgDatabase) -> None:
    gtm = PgGtm(pg.dsn)
    taken = [gtm.next() for _ in range(5)]  # the WAL holds a value 32 ahead
    assert taken == [1, 2, 3, 4, 5] and gtm.current() == 5
    gtm.close()
    pg_server.stop("immediate")  # a crash: no shutdown checkpoint
    pg_server.start()
    with PgGtm(pg.dsn) as gtm:
        after = gtm.current()
        assert after >= 5, "never backwards"
        n = gtm.next()
        assert n > 5 and n > after and gtm.current() == n


def test_first_use_and_cached_sequence_refused(pg: PgDatabase) -> None:
    with PgGtm(pg.dsn, name="other_gtm") as gtm:
        assert gtm.current() == 0
        assert gtm.next() == 1
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute("CREATE SEQUENCE cached_gtm CACHE 20")
    with pytest.raises(ConfigError, match="CACHE 1"):
        PgGtm(pg.dsn, name="cached_gtm")
    with pytest.raises(ConfigError, match="identifier"):
        PgGtm(pg.dsn, name="Bad-Name")
