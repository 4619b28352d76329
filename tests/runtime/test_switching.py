"""The merger's switch interval by regime: the process's own while draining, short once caught up."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from csnd.coordinator import CsnMerge
from csnd.core.ids import Csn, Lsn, Xid
from csnd.runtime.items import EndItem, TxnItem
from csnd.runtime.jsonsink import JsonLinesSink
from csnd.runtime.merger import Merger
from csnd.runtime.switching import LIVE_SWITCH_S, SwitchPolicy
from csnd.sender.txn import FinishedTxn
from tests.runtime.queued import QueuedInput

DRAIN_S = 0.02


def _txn(k: int) -> FinishedTxn:
    csn = 10 * (k + 1)
    change = (0, 0x100, f'"lsn": "0/{k:X}", "body": "t{k}"')
    return FinishedTxn(
        "dn1", Csn(csn), None, Xid(700 + k), Lsn(0x900 + csn), Lsn(0x910 + csn), 5, [change], 1
    )


def test_a_backlog_drains_at_the_long_interval_and_a_caught_up_merger_waits_at_the_short(
    tmp_path: Path,
) -> None:
    applied: list[float] = []
    policy = SwitchPolicy(LIVE_SWITCH_S, DRAIN_S, applied.append)
    n = 3 * CsnMerge(["dn1"]).max_pending_batches  # (more than one round takes: a backlog)
    txns = [_txn(k) for k in range(n)]
    node = QueuedInput("dn1", "single", [TxnItem(t, t.end_lsn) for t in txns], confirms=False)
    merger = Merger([node], JsonLinesSink(str(tmp_path / "out.jsonl")), switching=policy)
    runner = threading.Thread(target=merger.run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30  # a ceiling for a stalled run, not a timing goal
    while LIVE_SWITCH_S not in applied and time.monotonic() < deadline:
        time.sleep(0.001)
    node.out.put_many([EndItem()])
    runner.join(timeout=60)
    assert not runner.is_alive()
    # draining, then caught up with the source still open, then the process's own again at the end
    assert applied == [DRAIN_S, LIVE_SWITCH_S, DRAIN_S]


def test_the_policy_applies_only_a_change_of_regime() -> None:
    applied: list[float] = []
    policy = SwitchPolicy(0.001, 0.02, applied.append)
    for step in ("caught_up", "caught_up", "backlog", "backlog", "caught_up", "restore", "restore"):
        getattr(policy, step)()
    assert applied == [0.001, 0.02, 0.001, 0.02]


def test_by_default_the_live_interval_is_never_longer_than_the_processs_own() -> None:
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.002)
        policy = SwitchPolicy.around_current()
        assert (policy.live_s, policy.drain_s) == (0.002, 0.002)
        sys.setswitchinterval(0.02)
        policy = SwitchPolicy.around_current()
        assert (policy.live_s, policy.drain_s) == (LIVE_SWITCH_S, 0.02)
    finally:
        sys.setswitchinterval(before)
