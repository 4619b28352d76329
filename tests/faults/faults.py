"""The fault classes: each strikes one fault into a running `harness.Run`, at a moment from its seed.

Each function is called once the stream flows and returns when the fault has
been dealt (and, where an operator would act -- a restarted process, `csnd
gtm recover` -- that action taken); the harness then drains and checks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import psycopg

from csnd.gtm.writer import PAUSE_POINTS
from tests.faults import witness as wit
from tests.faults.clock import clock_jump, clock_jump_setup
from tests.faults.harness import Run, Stall, http_status, wait
from tests.faults.spark import spark_kill, spark_kill_setup
from tests.fixtures.disks import fill
from tests.fixtures.procs import children

# Steps of a writer's commit between its first PREPARE and its last COMMIT PREPARED.
IN_DOUBT_STEPS: Final = PAUSE_POINTS[PAUSE_POINTS.index("prepared") :]
# How long a server's shutdown may take (pg_ctl -t) before the run fails.
STOP_S: Final = 30


def service_kill(run: Run) -> None:
    """kill -9 of `csnd serve` (its process group: decoders too), then the same command again."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    run.mark_fault(f"kill -9 after {d:.2f}s")
    assert run.served is not None
    run.served.kill()
    run.restart_served()


def _decoders(pid: int) -> list[int]:
    servers = [p for p, cmd in children(pid) if "multiprocessing.forkserver" in cmd]
    return sorted(p for s in servers for p, _ in children(s))


def decoder_kill(run: Run) -> None:
    """kill -9 of one decoder process of the service (a child of its fork server)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    assert run.served is not None
    pid = run.served.proc.pid
    decoders = wait(lambda: _decoders(pid), "decoder processes", run.diagnose, seconds=30)
    victim = run.rng.choice(decoders)
    run.mark_fault(f"kill -9 decoder {decoders.index(victim) + 1} of {len(decoders)} after {d:.2f}s")
    os.kill(victim, signal.SIGKILL)
    served = run.served
    wait(lambda: int(http_status(served)["totals"]["restarts"]) >= 1, "the pipeline to restart", run.diagnose)


def subscriber_kill(run: Run) -> None:
    """kill -9 of one subscriber; restarted after its last line (unnamed) or its stored mark (named)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    sub = run.rng.choice(run.subs)
    run.mark_fault(f"kill -9 subscriber {sub.name or '(unnamed)'} after {d:.2f}s")
    sub.kill()
    if sub.name is None:
        kept = sub.cut_to(2**63)  # a torn last line goes; continue after the last whole one
        sub.start("--from-csn", str(kept))
        return
    served = run.served
    assert served is not None

    def acked() -> int | None:
        for c in http_status(served)["consumers"]:
            if c.get("name") == sub.name and not c.get("connected"):
                return int(c.get("acknowledged_csn", 0))
        return None

    # (a subscription that never connected is not listed: it has no mark, and printed nothing)
    found = wait(
        lambda: (acked(),) if acked() is not None else None,
        "the named subscription",
        run.diagnose,
        5.0,
        fail=False,
    )
    mark = found[0] if found else 0
    kept = sub.cut_to(mark)
    # Invariant 6: the mark is a line it printed (acknowledged only once written).
    assert kept == mark, f"the stored mark {mark} is not a csn the subscriber printed (last kept {kept})"
    sub.start()


def pg_restart(run: Run) -> None:
    """`pg_ctl restart -m fast|immediate` of one server while streaming; then `csnd gtm recover`.

    A fast shutdown waits for each walsender to see its client confirm the end
    of the WAL; one that does not finish within STOP_S is a failure (with the
    server's log and the service's status as evidence); the server is then
    stopped immediately and the run goes on, so the rest is checked too."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    node = run.rng.choice(list(run.urls))
    mode = run.rng.choice(["fast", "immediate"])
    run.mark_fault(f"restart -m {mode} {node} after {d:.2f}s")
    server = run.cluster.server(node)
    ctl = [server.bin("pg_ctl"), "-D", server.data_dir, "-w", "-t", str(STOP_S)]
    t0 = time.monotonic()
    stopped = server._run(*ctl, "-m", mode, "stop", check=False)  # (as the server's user)
    if stopped.returncode != 0:
        run.outcome.problems.append(
            f"stalled: pg_ctl stop -m {mode} of {node} did not finish in {time.monotonic() - t0:.0f}s while "
            f"csnd streamed ({stopped.stdout.strip()[-60:]} {stopped.stderr.strip()}); csnd status then: "
            f"{run.diagnose()}; server log: {server.log_tail(6)}"
        )
        server._run(*ctl, "-m", "immediate", "stop", check=False)  # (the run goes on)
        run.outcome.detail += "; stopped -m immediate after the fast stop failed"
    server.start()
    if node == run.cluster.names[0]:  # the GTM's server: the ticker's session is gone
        assert run.ticking is not None
        run.ticking.renew()
    time.sleep(0.5)
    run.outcome.detail += "; " + run.recover(cli=True)


def writer_kill_setup(run: Run) -> None:
    """Writer 0 stops at a commit step between PREPARE and COMMIT PREPARED after some commits."""
    step = run.rng.choice(IN_DOUBT_STEPS)
    after = run.rng.randrange(0, 40)  # (from the first: a pause may come before anything flowed)
    run.writer_args[0] = [
        "--pause",
        step,
        "--pause-after",
        str(after),
        "--pause-file",
        str(run.tmp / "paused"),
    ]


def writer_kill(run: Run) -> None:
    """kill -9 of a writer stopped inside its commit; `csnd gtm recover` finishes its transaction."""
    flag = run.tmp / "paused"
    # Not wait_flowing: the writer may pause before anything has flowed (a slow
    # start of the service), and its taken CSN then holds the stream until the kill.
    run.wait_connected()
    wait(flag.exists, "the writer to reach its pause point", run.diagnose)
    d = run.pause(0.0, 1.0)  # (the stream is held by its open `committing` meanwhile)
    step = run.writer_args[0][1]
    gid = flag.read_text()
    run.mark_fault(f"kill -9 writer at {step} ({gid}) after {d:.2f}s")
    run.writers[0].kill()
    run.writers[0].join()
    report = run.recover(cli=True)
    run.outcome.detail += "; " + report
    run.victim = (gid, step in ("decided", "committed-one"))


def proxy_cut(run: Run) -> None:
    """Every connection of one source's TCP path closed at once (the service reconnects)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    ((node, proxy),) = run.proxies.items()
    run.mark_fault(f"cut {node}'s replication connection after {d:.2f}s")
    assert proxy.cut() >= 1, "the proxy carried no connection"


def proxy_stall(run: Run) -> None:
    """One source's TCP path stops moving bytes for a while, then flows again (or is cut then)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    ((node, proxy),) = run.proxies.items()
    hold = run.rng.uniform(0.5, 6.0)
    then_cut = run.rng.random() < 0.3
    run.mark_fault(
        f"stall {node}'s replication connection {hold:.1f}s after {d:.2f}s"
        + (", then cut" if then_cut else "")
    )
    proxy.stall()
    time.sleep(hold)
    if then_cut:
        proxy.cut()
    proxy.resume()


def proxy_black_hole(run: Run) -> None:
    """One source's TCP path drops every packet from now on, closing nothing: only silence tells.

    The service must notice the silence (its receive timeout, short in this
    class: `harness.BLACK_HOLE_PARAMS`), give the connection up and reconnect; the
    server lets the slot go once its walsender's own timeout ends the old one.
    """
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    ((node, proxy),) = run.proxies.items()
    run.mark_fault(f"black-hole {node}'s replication connection after {d:.2f}s")
    assert proxy.black_hole() >= 1, "the proxy carried no connection"


def client_cut(run: Run) -> None:
    """The subscribers' TCP path to the service cut, or stalled 0.5-6 s and then flowing again (or cut)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    proxy = run.client_proxy
    assert proxy is not None
    how = run.rng.choice(["cut", "stall", "stall, then cut"])
    if how == "cut":
        run.mark_fault(f"cut the subscribers' connections after {d:.2f}s")
        assert proxy.cut() >= 1, "the proxy carried no connection"
        return
    hold = run.rng.uniform(0.5, 6.0)
    run.mark_fault(f"{how} the subscribers' connections for {hold:.1f}s after {d:.2f}s")
    proxy.stall()
    time.sleep(hold)
    if how.endswith("cut"):
        proxy.cut()
    proxy.resume()


def client_black_hole(run: Run) -> None:
    """The subscribers' TCP paths black-holed for good (packets dropped, nothing closed); new ones flow.

    Each client must take its silent stream for dead (15 s without a message,
    where the service sends a keepalive every 5 s) and reconnect after its
    last line; the service frees the old streams."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    proxy = run.client_proxy
    assert proxy is not None
    run.mark_fault(f"black-hole the subscribers' connections after {d:.2f}s")
    assert proxy.black_hole() >= 1, "the proxy carried no connection"
    # What the proxy had read before the hole still arrives (a transaction committed at
    # the fault could look recovered at once): judge by what commits after it.
    time.sleep(0.5)
    run.remark()


def serve_kill_stalled(run: Run) -> None:
    """Overlapping faults: kill -9 of `csnd serve` while one source's replication connection is stalled.

    The killed service's walsender is still behind the stalled proxy and holds
    the slot; the new service is started either while the path is still
    stalled (it must wait its source out, not fail) or once it flows again
    (the old walsender may still hold the slot: the new one must retry).
    """
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    ((node, proxy),) = run.proxies.items()
    hold = run.rng.uniform(0.5, 4.0)
    kill_at = run.rng.uniform(0.1, hold)
    restart_stalled = run.rng.random() < 0.5
    run.mark_fault(
        f"stall {node}'s replication connection {hold:.1f}s after {d:.2f}s, kill -9 serve {kill_at:.1f}s in, "
        + ("restarted while stalled" if restart_stalled else "restarted once flowing")
    )
    proxy.stall()
    time.sleep(kill_at)
    assert run.served is not None
    run.remark()
    run.served.kill()
    if not restart_stalled:
        time.sleep(hold - kill_at)
        proxy.resume()
        run.restart_served()
        return
    # (the new service may wait on its stalled source before it is ready: resume from beside it)
    resumer = threading.Timer(hold - kill_at, proxy.resume)
    resumer.start()
    try:
        run.restart_served()
    finally:
        resumer.join()


def decoder_kill_client_cut(run: Run) -> None:
    """Overlapping faults: a decoder killed while the subscribers' connections are stalled or cut."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    proxy = run.client_proxy
    assert proxy is not None and run.served is not None
    pid = run.served.proc.pid
    decoders = wait(lambda: _decoders(pid), "decoder processes", run.diagnose, seconds=30)
    victim = run.rng.choice(decoders)
    hold = run.rng.uniform(0.5, 4.0)
    how = run.rng.choice(["stall", "stall, then cut"])
    run.mark_fault(
        f"{how} the subscribers' connections {hold:.1f}s after {d:.2f}s, "
        f"kill -9 decoder {decoders.index(victim) + 1} of {len(decoders)} in it"
    )
    proxy.stall()
    time.sleep(run.rng.uniform(0.0, hold))
    run.remark()
    os.kill(victim, signal.SIGKILL)
    served = run.served
    wait(lambda: int(http_status(served)["totals"]["restarts"]) >= 1, "the pipeline to restart", run.diagnose)
    if how.endswith("cut"):
        proxy.cut()
    proxy.resume()


def slot_dropped(run: Run) -> None:
    """csnd's slot on one node dropped under the stream (its walsender ended until the drop wins).

    What that node commits from now on can never be delivered: the correct
    outcome is a clear stop (`harness.Run.check_clear_stop`), not a recovery."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    node = run.rng.choice(list(run.urls))
    run.mark_fault(f"drop {node}'s slot {run.slot} after {d:.2f}s")
    run.stopped = node
    with psycopg.connect(run.urls[node], autocommit=True) as c:
        deadline = time.monotonic() + 30
        while True:  # (the service reconnects at once: terminate and drop until the drop wins)
            row = c.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (run.slot,)
            ).fetchone()
            if row is not None and row[0] is not None:
                c.execute("SELECT pg_terminate_backend(%s)", (row[0],))
            try:
                c.execute("SELECT pg_drop_replication_slot(%s)", (run.slot,))
                return
            except psycopg.errors.ObjectInUse:
                assert time.monotonic() < deadline, f"{node}'s slot {run.slot} stayed in use for 30 s"
                time.sleep(0.02)


# How long `csnd serve` may take to end after a disk it writes filled: it meets
# the full disk at its next write (the group commit writes what is appended at
# once, and a failed sync ends the pipeline in its next round; a spill file at
# its next flush), seconds under load; longer is a stall.
FULL_DISK_END_S: Final = 150.0


def changelog_full_setup(run: Run) -> None:
    """The changelog on a 64 MiB tmpfs of its own (unmounted when the run closes)."""
    run.log_dir = os.path.join(run.small_disk(64), "changelog")


def _py_stacks(pid: int) -> str:
    """Every thread's stack of a hung Python process (py-spy, where installed), as evidence."""
    try:
        r = subprocess.run(
            [str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no py-spy dump: {e})"
    return (r.stdout or r.stderr)[-6000:]


def changelog_full(run: Run) -> None:
    """The changelog's filesystem fills up under the stream; space is freed and `csnd serve` started again.

    The service must end by itself with one line naming the changelog, the
    file it could not write and ENOSPC (never confirm a slot past what it
    holds: the sampler checks), and once restarted deliver everything once."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    disk = os.path.dirname(run.log_dir)
    run.mark_fault(f"fill the changelog's filesystem after {d:.2f}s")
    filled = fill(disk)
    served = run.served
    assert served is not None
    try:  # (reading its pipes meanwhile: a service blocked on a full stderr pipe would look hung)
        _out, err = served.proc.communicate(timeout=FULL_DISK_END_S)
    except subprocess.TimeoutExpired:
        raise Stall(
            f"stalled: csnd serve still runs {FULL_DISK_END_S:.0f}s after its changelog's disk filled; "
            f"{run.diagnose()}; threads: {_py_stacks(served.proc.pid)}"
        ) from None
    ended = time.monotonic() - (run.fault_at or 0.0)
    (run.tmp / "serve-full.err").write_text(err)  # (evidence)
    errors = [ln for ln in err.splitlines() if ln.startswith("csnd serve: error:")]
    assert served.proc.returncode == 1 and len(errors) == 1, (
        f"csnd serve exited {served.proc.returncode} on a full changelog disk with errors {errors}: {err[-1500:]}"
    )
    # (every stream that met the full disk ends with a status, never a traceback in serve's log)
    assert "Traceback" not in err, f"a traceback in csnd serve's stderr on a full disk: {err[-3000:]}"
    line = errors[0]
    assert f"changelog {run.log_dir}: cannot write {run.log_dir}/" in line and "(ENOSPC)" in line, (
        f"the error does not name the changelog, the file and ENOSPC: {line}; stderr: {err[-3000:]}"
    )
    run.outcome.detail += f" ({filled >> 20} MiB), serve ended {ended:.1f}s after; {line[:160]}"
    os.unlink(os.path.join(disk, "filler"))
    run.remark()  # (recovered: a transaction committed after the service ended is everywhere)
    run.restart_served()


# The WAL a slot-invalidated run lets its node keep for a slot: six 16 MB segments, so
# csnd's slot, held back by the stalled path, is invalidated after a few switches while
# the witness slot, consumed at every step, stays within it.  (Its restart point trails
# what it has consumed by the oldest transaction open at the last running-xacts record:
# under load, three segments were once not enough and the witness was lost too.)
KEEP_SIZE: Final = "96MB"
# How long the WAL may be switched and checkpointed before the slot is lost; longer fails.
INVALIDATE_S: Final = 60.0


def slot_invalidated(run: Run) -> None:
    """csnd's slot on one node invalidated by its server (max_slot_wal_keep_size) under the stream.

    The node's replication path is stalled by the proxy (csnd confirms nothing
    more there); the server is given a small max_slot_wal_keep_size and made to
    switch WAL and checkpoint until the slot's wal_status is lost (the witness
    slot consumed at each step, so its own WAL is never removed), the setting
    is reset and the path flows again.  As for slot-dropped, the correct
    outcome is a clear stop naming node and slot (`harness.Run.check_clear_stop`)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    node = next(iter(run.proxies))
    proxy = run.proxies[node]
    run.mark_fault(f"invalidate {node}'s slot {run.slot} (max_slot_wal_keep_size {KEEP_SIZE}) after {d:.2f}s")
    run.stopped = node
    early = run.early_witness.setdefault(node, [])
    proxy.stall()
    try:
        with psycopg.connect(run.urls[node], autocommit=True) as c:
            c.execute(f"ALTER SYSTEM SET max_slot_wal_keep_size = '{KEEP_SIZE}'")
            c.execute("SELECT pg_reload_conf()")
            try:
                deadline = time.monotonic() + INVALIDATE_S
                steps = 0
                while True:
                    c.execute("SELECT pg_switch_wal()")
                    # (invalidates, and logs the running transactions the witness's restart needs)
                    c.execute("CHECKPOINT")
                    early += wit.read_node(c, run.witness_slot)
                    steps += 1
                    row = c.execute(
                        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (run.slot,)
                    ).fetchone()
                    if row is not None and row[0] == "lost":
                        break
                    assert time.monotonic() < deadline, (
                        f"{node}'s slot {run.slot} was not invalidated in {INVALIDATE_S:.0f}s ({row})"
                    )
                witness = c.execute(
                    "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (run.witness_slot,)
                ).fetchone()
                assert witness is not None and witness[0] != "lost", (
                    f"the witness slot on {node} was lost too"
                )
            finally:
                c.execute("ALTER SYSTEM RESET max_slot_wal_keep_size")
                c.execute("SELECT pg_reload_conf()")
    finally:
        proxy.resume()
    run.outcome.detail += f" ({steps} WAL switches)"


# The spill-full class: a transaction's changes beyond this many bytes in memory go to
# a spill file (most of the writers' transactions, whose rows carry 2,600-byte documents),
# on a tmpfs of this many MiB of the run's own.
SPILL_BYTES: Final = 1024
SPILL_DISK_MIB: Final = 16


def _spill_dir(run: Run) -> str:
    return os.path.join(run.mounts[0], "spill")


def spill_full_setup(run: Run) -> None:
    """The spill directory on a small tmpfs of its own, and a spill bound most transactions pass."""
    run.small_disk(SPILL_DISK_MIB)
    os.mkdir(_spill_dir(run))
    config = run.tmp / "spill.toml"
    config.write_text(f'[spill]\ndir = "{_spill_dir(run)}"\nbytes = {SPILL_BYTES}\n')
    run.serve_args = ["--config", str(config)]


class _KeptFull(threading.Thread):
    """Keeps a filesystem full: a spill file closed frees its space, which the filler takes back."""

    def __init__(self, directory: str) -> None:
        super().__init__(name="fault-filler", daemon=True)
        self.path = os.path.join(directory, "filler")
        self.written = fill(directory)
        self.done = threading.Event()

    def run(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            while not self.done.wait(0.005):
                for chunk in (1 << 16, 4096, 1):
                    block = b"\0" * chunk
                    with contextlib.suppress(OSError):
                        while True:
                            self.written += os.write(fd, block)
        finally:
            os.close(fd)

    def free(self) -> None:
        self.done.set()
        self.join()
        os.unlink(self.path)


def spill_full(run: Run) -> None:
    """The spill directory's filesystem fills up (and is kept full) under the stream; space freed, restarted.

    The service must end by itself with one line naming the node, the
    transaction, its LSN, the spill directory and ENOSPC; once restarted with
    space, every invariant is checked as for any class (nothing was confirmed
    past the transaction that did not fit)."""
    run.wait_flowing()
    d = run.pause(0.0, 2.0)
    spill = _spill_dir(run)
    run.mark_fault(f"fill the spill directory's filesystem after {d:.2f}s")
    filler = _KeptFull(run.mounts[0])
    filler.start()
    served = run.served
    assert served is not None
    try:
        try:
            _out, err = served.proc.communicate(timeout=FULL_DISK_END_S)
        except subprocess.TimeoutExpired:
            raise Stall(
                f"stalled: csnd serve still runs {FULL_DISK_END_S:.0f}s after its spill disk filled; "
                f"{run.diagnose()}; threads: {_py_stacks(served.proc.pid)}"
            ) from None
    finally:
        filler.free()
    ended = time.monotonic() - (run.fault_at or 0.0)
    (run.tmp / "serve-full.err").write_text(err)  # (evidence)
    errors = [ln for ln in err.splitlines() if ln.startswith("csnd serve: error:")]
    assert served.proc.returncode == 1 and len(errors) == 1, (
        f"csnd serve exited {served.proc.returncode} on a full spill disk with errors {errors}: {err[-1500:]}"
    )
    assert "Traceback" not in err, f"a traceback in csnd serve's stderr on a full spill disk: {err[-3000:]}"
    line = errors[0]
    assert line.startswith("csnd serve: error: node ") and f" in {spill}: " in line and "(ENOSPC)" in line, (
        f"the error does not name the node, the spill directory and ENOSPC: {line}; stderr: {err[-3000:]}"
    )
    run.outcome.detail += f" ({filler.written >> 20} MiB), serve ended {ended:.1f}s after; {line[:160]}"
    run.remark()  # (recovered: a transaction committed after the service ended is everywhere)
    run.restart_served()


FAULTS: Final[dict[str, Callable[[Run], None]]] = {
    "service-kill": service_kill,
    "decoder-kill": decoder_kill,
    "subscriber-kill": subscriber_kill,
    "pg-restart": pg_restart,
    "writer-kill": writer_kill,
    "replication-cut": proxy_cut,
    "replication-stall": proxy_stall,
    "replication-black-hole": proxy_black_hole,
    "client-cut": client_cut,
    "serve-kill-stalled": serve_kill_stalled,
    "decoder-kill-client-cut": decoder_kill_client_cut,
    "slot-dropped": slot_dropped,
    "changelog-full": changelog_full,
    "slot-invalidated": slot_invalidated,
    "spill-full": spill_full,
    "client-black-hole": client_black_hole,
    "clock-jump": clock_jump,
    "spark-kill": spark_kill,
}
# Classes whose correct outcome is a clear stop naming node and slot (checked by `Run.check_clear_stop`).
STOPS: Final = frozenset({"slot-dropped", "slot-invalidated"})
SETUP: Final[dict[str, Callable[[Run], None]]] = {
    "writer-kill": writer_kill_setup,
    "changelog-full": changelog_full_setup,
    "spill-full": spill_full_setup,
    "clock-jump": clock_jump_setup,
    "spark-kill": spark_kill_setup,
}
PROXIED: Final = frozenset(
    {
        "replication-cut",
        "replication-stall",
        "replication-black-hole",
        "serve-kill-stalled",
        "slot-invalidated",
    }
)
# (the subscribers reach the service through a proxy)
CLIENT_PROXIED: Final = frozenset({"client-cut", "decoder-kill-client-cut", "client-black-hole"})


def evidence_dir() -> Path:
    return Path(os.environ.get("CSND_FAULT_OUT", "faults-out"))
