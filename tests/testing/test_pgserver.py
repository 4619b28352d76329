"""The test PostgreSQL server helper: ports that outgoing connections cannot take, a taken one, and
an installation the `postgres` user cannot reach.  (The suite runs as root: the servers run as `postgres`.)"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile

import psycopg

from csnd.testing.pgserver import (
    PgServer,
    _ephemeral_low,
    _postgres_readable_copy,
    _runs_as_postgres,
    free_port,
    pg_bin_dir,
)


def test_ports_are_chosen_below_the_kernels_ephemeral_range() -> None:
    low = _ephemeral_low()
    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports), (ports, low)


def test_a_first_start_whose_port_was_taken_moves_to_another() -> None:
    server = PgServer(tempfile.mkdtemp(prefix="csnd-pg-"))
    server.init()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", server.port))
    squatter.listen()
    taken = server.port
    try:
        server.start()
        assert server.port != taken
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            assert c.execute("SHOW port").fetchone() == (str(server.port),)
        server.restart()  # (a restart keeps the port its clients know)
        with psycopg.connect(server.dsn(), autocommit=True) as c:
            assert c.execute("SHOW port").fetchone() == (str(server.port),)
    finally:
        squatter.close()
        server.stop("immediate")


def test_an_installation_the_postgres_user_cannot_reach_is_run_from_a_copy_it_can() -> None:
    """A checkout under a closed directory (root's home) hides the wheel's PostgreSQL 18 from `postgres`."""
    closed = tempfile.mkdtemp(prefix="csnd-closed-")  # (mode 700: closed to the postgres user)
    hidden_bin = os.path.join(closed, "pginstall", "bin")
    shutil.copytree(os.path.dirname(pg_bin_dir(18)), os.path.join(closed, "pginstall"), symlinks=True)
    copied = ""
    try:
        assert not _runs_as_postgres(hidden_bin)
        copied = _postgres_readable_copy(hidden_bin)
        assert copied != hidden_bin and _runs_as_postgres(copied)
        assert _postgres_readable_copy(hidden_bin) == copied  # (made once)
        out = subprocess.run(
            ["runuser", "-u", "postgres", "--", os.path.join(copied, "postgres"), "--version"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.startswith("postgres (PostgreSQL) 18.")
    finally:
        shutil.rmtree(closed, ignore_errors=True)
        if copied:
            shutil.rmtree(os.path.dirname(copied), ignore_errors=True)
