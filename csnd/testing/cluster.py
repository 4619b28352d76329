"""K throwaway local PostgreSQL 15 servers: a GaussDB-style cluster for tests, the demo and bench.

Each server is a `pgserver.PgServer` (wal_level=logical, max_prepared_transactions
> 0 for the writers' PREPARE TRANSACTION), named dn1..dnK; they are initialised
and started in parallel threads (initdb dominates, and it is mostly waiting).
The GTM sequence lives on one of them or on a server of its own -- that is the
caller's choice (`gtm_url`: dn1 by default).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

from csnd.testing.pgserver import PgServer


class LocalCluster:
    """Servers dn1..dnK under one base directory; `stop()` (or the context manager) removes them."""

    def __init__(self, servers: list[PgServer], base_dir: str) -> None:
        self.servers = servers
        self.base_dir = base_dir
        self.names = [f"dn{i + 1}" for i in range(len(servers))]

    def urls(self, dbname: str = "postgres") -> dict[str, str]:
        return {n: s.url(dbname) for n, s in zip(self.names, self.servers, strict=True)}

    def dsns(self, dbname: str = "postgres") -> dict[str, str]:
        return {n: s.dsn(dbname) for n, s in zip(self.names, self.servers, strict=True)}

    @property
    def gtm_url(self) -> str:
        return self.servers[0].url()

    def server(self, name: str) -> PgServer:
        return self.servers[self.names.index(name)]

    def stop(self, mode: str = "immediate", remove: bool = True) -> None:
        with ThreadPoolExecutor(len(self.servers) or 1) as ex:
            list(ex.map(lambda s: s.stop(mode), self.servers))
        if remove:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster(k: int, base_dir: str | None = None) -> LocalCluster:
    """Init and start k servers (dn1..dnK) in parallel; on any failure stop those that started."""
    if k < 1:
        raise ValueError(f"a cluster needs at least one server, got {k}")
    base = base_dir or tempfile.mkdtemp(prefix="csnd-cluster-")
    os.chmod(base, 0o755)  # (the servers may run as user postgres, which must reach their directories)
    servers: list[PgServer] = []
    for i in range(k):
        d = os.path.join(base, f"dn{i + 1}")
        os.makedirs(d, exist_ok=True)
        s = PgServer(d)
        while any(s.port == o.port for o in servers):  # (free ports are picked one at a time)
            s = PgServer(d)
        servers.append(s)
    cluster = LocalCluster(servers, base)

    def up(s: PgServer) -> None:
        s.init()
        s.start()

    try:
        with ThreadPoolExecutor(k) as ex:
            list(ex.map(up, servers))
    except BaseException:
        cluster.stop()
        raise
    return cluster
