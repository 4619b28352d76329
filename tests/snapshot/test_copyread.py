"""A COPY read whole in one compiled call (`copyread.read_copy`) against psycopg's own COPY loop."""

from __future__ import annotations

import psycopg
import pytest

from csnd.core.compiled import twin_asked
from csnd.snapshot.copyread import libpq_functions, read_copy
from tests.fixtures.pg import PgDatabase


def _psycopg_copy(conn: psycopg.Connection[tuple[object, ...]], statement: str) -> bytes:
    with conn.cursor() as cur, cur.copy(statement) as copy:
        return b"".join(bytes(data) for data in copy)


def test_read_copy_gives_psycopgs_bytes_and_leaves_the_connection_usable(pg: PgDatabase) -> None:
    # (psycopg's libpq found: the compiled loop is what runs, unless the twins are asked for)
    assert (libpq_functions() is None) == twin_asked("csnd.snapshot._copysplit")
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text, doc jsonb)")
        conn.execute(
            "INSERT INTO t SELECT i, repeat('é', i % 50), jsonb_build_object('k', i) FROM generate_series(1, 30000) i"
        )
        conn.commit()
        for statement in (
            "COPY (SELECT * FROM t ORDER BY id) TO STDOUT (FORMAT binary)",
            "COPY (SELECT * FROM t ORDER BY id) TO STDOUT",
            "COPY (SELECT * FROM t WHERE false) TO STDOUT (FORMAT binary)",
        ):
            assert read_copy(conn, statement) == _psycopg_copy(conn, statement)
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (30000,)


def test_read_copy_raises_the_servers_error_as_psycopg_does(pg: PgDatabase) -> None:
    with pg.connect() as conn:
        conn.autocommit = True
        with pytest.raises(psycopg.errors.DivisionByZero, match="division by zero"):
            read_copy(
                conn, "COPY (SELECT 1 / (i - 3) FROM generate_series(1, 5) i) TO STDOUT (FORMAT binary)"
            )
        with pytest.raises(psycopg.errors.UndefinedTable, match="nowhere"):
            read_copy(conn, "COPY (SELECT * FROM nowhere) TO STDOUT")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # (nothing left unread on the connection)
