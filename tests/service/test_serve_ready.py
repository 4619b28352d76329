"""The ready line of `csnd serve` (and `csnd node`): what a script may count on once it is out.

Every transaction committed after it is delivered.  `csnd serve ...
--create-slot` (and `csnd node`) used to say it was ready before its
pipeline had created the slot, so what committed in the first moments after
the line was never captured: a new slot streams only what commits after its
consistent point.  The server reaches that point once every transaction
running when the slot was asked for has ended, so each test holds one open
(on a table outside the publication) while the command starts; the command
must not say it is ready while that transaction runs.  The test ends it as
soon as the slot shows up in pg_replication_slots (being created) or, if
the ready line came first, right after committing its own transactions --
in both cases those are committed the instant the line appears.  Then every
one of them must arrive.

A stop at once after it is the service's clean stop, exit 0.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from csnd.consumers.client import Changefeed
from csnd.gtm import generate_cluster
from csnd.runtime.stopping import Terminated
from csnd.service.config import ServeConfig, ServedSource
from csnd.service.serve import Service
from csnd.testing.pgserver import free_port
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import CSND, start_serve, wait_for

BURST = 20  # transactions committed the instant the ready line appears: ids 1..BURST
MARKER = 1000  # committed once the slot surely exists: everything before it has arrived when it has


def _setup(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE TABLE hold (id int)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR TABLE item")


class _Lines:
    """What a process writes on one pipe, read line by line in a thread of its own."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self.closed = False
        self._cond = threading.Condition()
        threading.Thread(target=self._read, args=(pipe,), daemon=True).start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def find(self, prefix: str) -> str | None:
        with self._cond:
            return next((ln for ln in self.lines if ln.startswith(prefix)), None)

    def wait(self, prefix: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                line = next((ln for ln in self.lines if ln.startswith(prefix)), None)
                if line is not None:
                    return line
                left = deadline - time.monotonic()
                assert not self.closed and left > 0, f"no {prefix!r} line: {''.join(self.lines)}"
                self._cond.wait(left)

    def text(self) -> str:
        with self._cond:
            return "".join(self.lines)


class _Command:
    """A csnd command started in the background, both its outputs read as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [*CSND, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out, self.err = _Lines(self.proc.stdout), _Lines(self.proc.stderr)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=60)


def _being_created(probe: psycopg.Connection[tuple[object, ...]], slots: Iterable[str]) -> bool:
    row = probe.execute(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY(%s)", (list(slots),)
    ).fetchone()
    return row is not None and int(str(row[0])) > 0


def _consistent(pg: PgDatabase, slots: Iterable[str]) -> set[str]:
    """The slots that have reached their consistent point (a new one has no confirmed position before)."""
    rows = pg.execute(
        "SELECT slot_name FROM pg_replication_slots "
        "WHERE slot_name = ANY(%s) AND confirmed_flush_lsn IS NOT NULL",
        (list(slots),),
    )
    return {str(r[0]) for r in rows}


def _at_ready(
    pg: PgDatabase,
    lines: _Lines,
    prefix: str,
    slots: list[str],
    at_ready: Callable[[], None],
    while_creating: Callable[[], None] = lambda: None,
) -> str:
    """Starts with a transaction held open and runs `at_ready()` the instant `prefix` appears.

    The held transaction ends once one of `slots` is being created (after
    `while_creating()` has looked at the command then), or after
    `at_ready()` if the ready line came first.  Returns the ready line.
    """
    with pg.connect() as held, pg.connect() as probe:
        held.execute("BEGIN")
        held.execute("INSERT INTO hold VALUES (1)")  # (an xid: the slot waits for it to end)
        deadline = time.monotonic() + 120
        while True:
            line = lines.find(prefix)
            if line is not None:  # ready while no slot could have a consistent point yet
                at_ready()
                held.execute("COMMIT")
                return line
            assert not lines.closed, f"the command ended before it was ready: {lines.text()}"
            assert time.monotonic() < deadline, "neither a ready line nor a slot being created"
            if _being_created(probe, slots):
                while_creating()
                held.execute("COMMIT")
                line = lines.wait(prefix)
                at_ready()
                return line
            time.sleep(0.005)


class _Burst:
    """Commits ids 1..BURST, one transaction each, on a connection opened beforehand."""

    def __init__(self, pg: PgDatabase) -> None:
        self.conn = pg.connect()

    def __call__(self) -> None:
        with self.conn:
            for i in range(1, BURST + 1):
                self.conn.execute("INSERT INTO item VALUES (%s)", (i,))


def _delivered(address: str, pg: PgDatabase, slots: list[str]) -> list[int]:
    """The item ids a consumer receives, up to and including MARKER (committed once the slots exist)."""
    wait_for(lambda: _consistent(pg, slots) == set(slots), "the slots at their consistent point")
    pg.execute("INSERT INTO item VALUES (%s)", (MARKER,))
    ids: list[int] = []
    with Changefeed(address) as feed:
        while MARKER not in ids:
            record = feed.next(timeout=120)
            assert record is not None, f"the marker never arrived; got {ids}"
            ids += [int(ch["new"]["id"]) for ch in json.loads(record[1])["changes"]]
    return ids


def _health(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True
        )
    return int(answer.status)


def test_serve_is_ready_only_once_its_new_slot_captures_every_commit(pg: PgDatabase, tmp_path: Path) -> None:
    _setup(pg)
    port = free_port()
    serve = _Command(
        "serve",
        f"dn1={pg.url}",
        "--changelog",
        str(tmp_path / "log"),
        "--listen",
        f"127.0.0.1:{port}",
        "--decoders",
        "1",
        "--slot",
        "csnd",
        "--publication",
        "csnd_pub",
        "--create-slot",
    )
    health: list[int] = []
    try:
        line = _at_ready(
            pg,
            serve.out,
            "csnd serve: listening on ",
            ["csnd"],
            _Burst(pg),
            lambda: health.append(_health(port)),
        )
        ids = _delivered(line.split()[-1], pg, ["csnd"])
        serving = _health(port)
    finally:
        code = serve.stop()
    assert code == 0, serve.err.text()
    assert ids == [*range(1, BURST + 1), MARKER], "transactions committed after the ready line were lost"
    # health said NOT_SERVING while the slot was being made, SERVING since the ready line
    assert health == [health_pb2.HealthCheckResponse.NOT_SERVING], health
    assert serving == health_pb2.HealthCheckResponse.SERVING


def test_serve_makes_every_sources_slot_before_it_is_ready(pg: PgDatabase, tmp_path: Path) -> None:
    _setup(pg)
    slots = ["csnd_a", "csnd_b"]
    sources = [f"dn{i}={pg.url}?slot={slot}&publication=csnd_pub&mode=gtm" for i, slot in enumerate(slots, 1)]
    serve = _Command(
        "serve",
        *sources,
        "--changelog",
        str(tmp_path / "log"),
        "--listen",
        "127.0.0.1:0",
        "--decoders",
        "1",
        "--create-slot",
    )
    try:
        # (no commits: without the gtm's csn markers a gtm-mode node could not decode them)
        made: set[str] = set()
        _at_ready(
            pg, serve.out, "csnd serve: listening on ", slots, lambda: made.update(_consistent(pg, slots))
        )
    finally:
        code = serve.stop()
    assert code == 0, serve.err.text()
    assert made == set(slots), "ready before every source's slot was at its consistent point"


def test_node_agent_is_ready_only_once_its_new_slot_captures_every_commit(
    pg: PgDatabase, tmp_path: Path
) -> None:
    _setup(pg)
    agent = _Command(
        "node",
        f"dn1={pg.url}",
        "--listen",
        "127.0.0.1:0",
        "--decoders",
        "1",
        "--slot",
        "csnd",
        "--publication",
        "csnd_pub",
        "--create-slot",
    )
    try:
        line = _at_ready(pg, agent.err, "csnd node dn1: listening on ", ["csnd"], _Burst(pg))
        served = start_serve([f"grpc://{line.split()[-1]}"], str(tmp_path / "log"), http=False)
        try:
            ids = _delivered(served.address, pg, ["csnd"])
        finally:
            code, err = served.terminate()
        assert code == 0, err
    finally:
        agent.stop()
    assert ids == [*range(1, BURST + 1), MARKER], "transactions committed after the ready line were lost"


def test_a_slot_that_cannot_be_made_is_one_line_before_the_ready_line(pg: PgDatabase, tmp_path: Path) -> None:
    _setup(pg)
    pg.execute("SELECT pg_create_logical_replication_slot('tdslot', 'test_decoding')")
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/{pg.name}"
    for url, slot, what in ((pg.url, "tdslot", "test_decoding"), (nowhere, "newslot", "connect")):
        got = subprocess.run(
            [
                *CSND,
                "serve",
                f"dn1={url}",
                "--changelog",
                str(tmp_path / slot),
                "--listen",
                "127.0.0.1:0",
                "--decoders",
                "1",
                "--slot",
                slot,
                "--publication",
                "csnd_pub",
                "--create-slot",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.returncode == 1, got
        assert "listening on" not in got.stdout, got.stdout
        (line,) = got.stderr.strip().splitlines()
        assert line.startswith("csnd serve: error: node dn1: "), line
        assert slot in line and what in line, line


class _StopAtReady(io.StringIO):
    """A stdout that takes the ready line and at that instant receives SIGTERM (as csnd's handler raises it)."""

    def write(self, text: str) -> int:
        n = super().write(text)
        if "listening on" in text:
            raise Terminated
        return n


def test_a_stop_the_instant_the_ready_line_is_out_is_a_clean_stop(tmp_path: Path) -> None:
    """A script that stops the service as soon as it read the ready line gets exit 0, as for any stop.

    The stop used to land before the service waited for one (mostly: the
    pipeline thread was starting), so it ended as an interrupted command,
    exit 143, and at times with a decoder's traceback.
    """
    generate_cluster(str(tmp_path), 1, 20, seed=5, binary=True)
    config = ServeConfig(
        (ServedSource(str(tmp_path / "dn1.pgstream")),),
        str(tmp_path / "log"),
        listen="127.0.0.1:0",
        decoders=1,
    )
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        code = Service(config, stdout=_StopAtReady()).run()
    except KeyboardInterrupt:  # (not a clean stop; kept from pytest, which would end the session)
        code = 143
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    assert code == 0
