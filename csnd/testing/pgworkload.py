"""A small but nasty PostgreSQL workload for reader tests and the demo.

Concurrency (two sessions interleaving), savepoint rollbacks, a streamed large
transaction (the server runs with logical_decoding_work_mem=64kB) with
rolled-back subtransactions, out-of-line TOAST values left unchanged, every
replica identity, multi-table TRUNCATE, ALTER TABLE mid-stream, COMMIT and
ROLLBACK PREPARED, transactional and non-transactional logical messages.
"""

from __future__ import annotations

import random
import string

import psycopg

SCHEMA = """
CREATE TABLE acct (id int PRIMARY KEY, owner text, balance numeric(12,2), doc jsonb);
CREATE TABLE full_t (id int, v text, big text);
ALTER TABLE full_t REPLICA IDENTITY FULL;
CREATE TABLE idx_t (a int NOT NULL, b int NOT NULL, note text);
CREATE UNIQUE INDEX idx_t_ab ON idx_t (a, b);
ALTER TABLE idx_t REPLICA IDENTITY USING INDEX idx_t_ab;
CREATE TABLE nothing_t (id int, v text);
ALTER TABLE nothing_t REPLICA IDENTITY NOTHING;
CREATE TABLE toast_t (id int PRIMARY KEY, payload text, n int);
CREATE TABLE trunc_a (id int);
CREATE TABLE trunc_b (id int);
"""


def big_text(rng: random.Random, n: int) -> str:
    # random letters do not compress, so the value is stored out of line
    return "".join(rng.choices(string.ascii_letters, k=n))


def setup(conninfo: str, publication: str = "csnd_pub") -> None:
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute(SCHEMA.encode())
        c.execute(f"CREATE PUBLICATION {publication} FOR ALL TABLES".encode())


def ddl_done(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    row = conn.execute(
        b"SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        b"WHERE attrelid = 'acct'::regclass AND attname = 'owner'"
    ).fetchone()
    return row is not None and row[0] != "text"


def run(conninfo: str, rounds: int = 1, seed: int = 7) -> None:
    rng = random.Random(seed)
    with psycopg.connect(conninfo, autocommit=True) as a, psycopg.connect(conninfo, autocommit=True) as b:
        for r in range(rounds):
            base = seed * 100_000 + r * 1000
            g = f"{seed}_{r}"
            # two interleaved transactions: a's commit is decoded after b's
            a.execute(b"BEGIN")
            b.execute(b"BEGIN")
            a.execute("INSERT INTO acct VALUES (%s, 'ann', 10.50, '{\"k\": [1, 2]}')", (base + 1,))
            b.execute("INSERT INTO acct VALUES (%s, 'bo', 3.00, null)", (base + 2,))
            b.execute(b"COMMIT")
            a.execute("UPDATE acct SET balance = balance + 1 WHERE id = %s", (base + 1,))
            a.execute(b"COMMIT")
            # savepoint rolled back
            with a.transaction():
                a.execute("INSERT INTO acct VALUES (%s, 'cy', 1, null)", (base + 3,))
                a.execute(b"SAVEPOINT s1")
                a.execute("INSERT INTO acct VALUES (%s, 'gone', 0, null)", (base + 4,))
                a.execute(b"ROLLBACK TO SAVEPOINT s1")
                a.execute("UPDATE acct SET id = %s WHERE id = %s", (base + 5, base + 3))  # key change
            # every replica identity
            a.execute("INSERT INTO full_t VALUES (%s, 'x', NULL)", (base + 1,))
            a.execute("UPDATE full_t SET v = 'y' WHERE id = %s", (base + 1,))
            a.execute("DELETE FROM full_t WHERE id = %s", (base + 1,))
            a.execute("INSERT INTO idx_t VALUES (%s, 2, 'n')", (base + 1,))
            a.execute("UPDATE idx_t SET note = 'm' WHERE a = %s", (base + 1,))
            a.execute("UPDATE idx_t SET b = 3 WHERE a = %s", (base + 1,))
            a.execute("DELETE FROM idx_t WHERE a = %s", (base + 1,))
            a.execute("INSERT INTO nothing_t VALUES (%s, 'only inserts')", (base + 1,))
            a.execute("DELETE FROM acct WHERE id = %s", (base + 2,))
            # TOAST: out-of-line value, then an update that leaves it unchanged
            a.execute("INSERT INTO toast_t VALUES (%s, %s, 0)", (base + 1, big_text(rng, 20000)))
            a.execute("UPDATE toast_t SET n = n + 1 WHERE id = %s", (base + 1,))
            a.execute("INSERT INTO full_t VALUES (%s, 'f', %s)", (base + 2, big_text(rng, 20000)))
            a.execute("UPDATE full_t SET v = 'g' WHERE id = %s", (base + 2,))
            # a streamed large transaction with a rolled-back subtransaction
            with b.transaction():
                b.execute(
                    "INSERT INTO toast_t SELECT g, repeat('p', 50), g FROM generate_series(%s::int, %s::int) g",
                    (base + 100, base + 700),
                )
                b.execute(b"SAVEPOINT s2")
                b.execute(
                    "INSERT INTO trunc_a SELECT g FROM generate_series(1, 2000) g",
                )
                b.execute(b"ROLLBACK TO SAVEPOINT s2")
                b.execute(b"SAVEPOINT s3")
                b.execute("UPDATE toast_t SET n = -n WHERE id BETWEEN %s AND %s", (base + 100, base + 300))
                b.execute(b"RELEASE SAVEPOINT s3")
                b.execute("SELECT pg_logical_emit_message(true, 'app', 'inside big')")
            # logical messages
            a.execute("SELECT pg_logical_emit_message(false, 'app', 'nontx ' || %s::text)", (r,))
            with a.transaction():
                a.execute("SELECT pg_logical_emit_message(true, 'app', 'tx ' || %s::text)", (r,))
                a.execute("INSERT INTO trunc_a VALUES (%s)", (r,))
            a.execute("SELECT pg_logical_emit_message(true, 'app', 'rolled back')")  # autocommit: commits
            with a.transaction():
                a.execute("INSERT INTO trunc_b VALUES (1)")
            a.execute(b"TRUNCATE trunc_a, trunc_b")
            # DDL mid-stream: add a column with a default, change a type, drop a column
            if r == 0 and not ddl_done(a):
                a.execute(b"ALTER TABLE acct ADD COLUMN tag text DEFAULT 'dflt'")
                a.execute("UPDATE acct SET owner = 'ann2' WHERE id = %s", (base + 1,))
                a.execute(b"ALTER TABLE acct ALTER COLUMN owner TYPE varchar(20)")
                a.execute("INSERT INTO acct VALUES (%s, 'dee', 2, null, 't')", (base + 6,))
                a.execute(b"ALTER TABLE acct DROP COLUMN tag")
                a.execute("INSERT INTO acct VALUES (%s, 'eve', 2, null)", (base + 7,))
            # two-phase: committed and rolled back prepared transactions
            a.execute(b"BEGIN")
            a.execute("INSERT INTO acct VALUES (%s, 'prep', 1, null)", (base + 8,))
            a.execute(f"PREPARE TRANSACTION 'p{g}a'".encode())
            a.execute(b"BEGIN")
            a.execute("INSERT INTO acct VALUES (%s, 'prep-rb', 1, null)", (base + 9,))
            a.execute(f"PREPARE TRANSACTION 'p{g}b'".encode())
            b.execute(f"COMMIT PREPARED 'p{g}a'".encode())
            b.execute(f"ROLLBACK PREPARED 'p{g}b'".encode())
            # a plain rolled back transaction never appears
            a.execute(b"BEGIN")
            a.execute("INSERT INTO acct VALUES (%s, 'never', 1, null)", (base + 10,))
            a.execute(b"ROLLBACK")
