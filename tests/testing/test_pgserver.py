"""The test PostgreSQL server helper: ports that outgoing connections cannot take, and a taken one."""

from __future__ import annotations

import socket
import tempfile

import psycopg

from csnd.testing.pgserver import PgServer, _ephemeral_low, free_port


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
