"""The main process's collector and switch-interval settings: applied for a command; cycles are still collected."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from csnd.testing.widestream import write_wide_stream

PROBE = """
import gc, sys, weakref
from csnd.cli import GC_YOUNG_THRESHOLD, SWITCH_INTERVAL_S, main
before = gc.get_threshold()
rc = main(["replay", sys.argv[1], "--decoders", "1", "--output", sys.argv[2]])
after = gc.get_threshold()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle, unreachable once the names go
gone = weakref.ref(a)
del a, b
kept = [[] for _ in range(3 * GC_YOUNG_THRESHOLD)]  # live containers enough to start a young collection
print(rc, before[0], after == (GC_YOUNG_THRESHOLD, *before[1:]), gone() is None, sys.getswitchinterval() == SWITCH_INTERVAL_S)
"""


def test_a_command_raises_the_young_threshold_and_switch_interval_and_cycles_are_still_collected(
    tmp_path: Path,
) -> None:
    stream = tmp_path / "s.pgstream"
    write_wide_stream(str(stream), 30, rows_per_txn=3)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(stream), str(tmp_path / "out.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rc, default_young, applied, collected, switching = proc.stdout.split()
    assert (rc, applied, collected, switching) == ("0", "True", "True", "True")
    assert int(default_young) < 10_000  # (700 up to Python 3.13): the setting raises it
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 10
