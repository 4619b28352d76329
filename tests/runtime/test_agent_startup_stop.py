"""A node agent stopped during its start-up: while its new slot waits for its consistent point.

CREATE_REPLICATION_SLOT returns only once every transaction running when it
was asked for has ended, so an agent started beside a long transaction waits
in its start-up for as long.  A SIGTERM then (a service manager giving up on
it, an operator) must stop it at once with one line saying so -- the slot
not made -- never leave it waiting for the transaction.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from tests.fixtures.pg import PgDatabase
from tests.service.servekit import wait_for

CSND = [sys.executable, "-m", "csnd.cli"]
AGENT_FLAGS = ["--create-slot", "--listen", "127.0.0.1:0", "--decoders", "1"]


def test_sigterm_while_the_slot_waits_for_a_transaction_stops_the_agent(pg: PgDatabase) -> None:
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    with pg.connect(autocommit=False) as held:
        held.execute(
            "INSERT INTO item VALUES (1)"
        )  # open, with an xid: the slot's consistent point waits for it
        proc = subprocess.Popen(
            [*CSND, "node", f"dn1={pg.url}", "--slot", "agent", "--publication", "csnd_pub", *AGENT_FLAGS],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda: (
                    pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'agent'")
                    or proc.poll() is not None
                ),
                "the agent's slot to be in the making",
            )
            assert proc.poll() is None, proc.communicate()[1]
            proc.send_signal(signal.SIGTERM)
            try:
                _out, err = proc.communicate(timeout=60)  # (a safety net: it stops at once, or it hangs)
            except subprocess.TimeoutExpired:
                proc.kill()
                _out, err = proc.communicate()
                raise AssertionError(
                    f"the agent did not stop on SIGTERM during its start-up: {err}"
                ) from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        held.rollback()
    assert proc.returncode == 0, f"exit {proc.returncode}: {err}"
    assert "csnd node dn1: stopped during start-up, before the ready line" in err, err
    assert "Traceback" not in err, err
    # The slot being made was cancelled with the start-up: none is left holding WAL.
    wait_for(
        lambda: not pg.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'agent'"),
        "the slot in the making to be gone",
    )
