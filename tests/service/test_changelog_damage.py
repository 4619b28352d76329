"""Damage in the changelog reaches people as one line, never as a stream that looks complete.

Damage present when the service starts stops `csnd serve` before it says
it is listening (so nothing probes it ready), with the line `csnd changelog
--check` prints.  Damage done while it runs, found by a read, ends the
subscriber's stream with DATA_LOSS: `csnd subscribe` exits 1 with that
same line, after none of the damaged records, and the service logs one
line for it, no traceback.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

import pytest

from csnd.changelog import Changelog
from csnd.changelog import record as rec
from tests.service.feedkit import fill, serve
from tests.service.servekit import CSND

SEG = 8000  # several segments for 60 transactions


def _damaged_log(d: str) -> tuple[str, int, int, dict[int, bytes]]:
    """A closed log of several segments; a flipped byte to come in the payload of a record of the first.

    Returns (first segment's path, the record's csn, its offset, every line written)."""
    with Changelog(d, segment_bytes=SEG) as log:
        written = fill(log, range(1, 61))
    names = sorted(n for n in os.listdir(d) if rec.parse_segment_name(n))
    assert len(names) >= 3
    first = os.path.join(d, names[0])
    off, csn = rec.SEGMENT_HEAD, 1
    for _ in range(3):  # (the fourth record: inside the segment, not at either end)
        off += rec.FRAME_HEAD + len(written[csn])
        csn += 1
    return first, csn, off, written


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x04]))


def _check_line(d: str) -> str:
    """The one line `csnd changelog --check` prints for `d`, without its `csnd changelog: error: `."""
    proc = subprocess.run([*CSND, "changelog", d, "--check"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("csnd changelog: error: ") and "Traceback" not in proc.stderr
    return proc.stderr.strip()[len("csnd changelog: error: ") :]


def test_serve_does_not_start_over_damage_it_can_find(tmp_path: Path) -> None:
    d = str(tmp_path / "log")
    first, _, off, _ = _damaged_log(d)
    _flip(first, off + rec.FRAME_HEAD + 5)
    line = _check_line(d)
    assert line.startswith(f"{first}: bad record crc") and line.endswith(f"(at byte offset {off})")
    out = tmp_path / "cluster"
    subprocess.run(
        [*CSND, "generate", "--nodes", "1", "--transactions", "5", "--seed", "3", "--out", str(out)],
        check=True,
        capture_output=True,
    )
    proc = subprocess.run(
        [*CSND, "serve", str(out / "dn1.pgstream"), "--changelog", d, "--listen", "127.0.0.1:0",
         "--http", "127.0.0.1:0", "--decoders", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "listening on" not in proc.stdout and "dashboard on" not in proc.stdout
    assert proc.stderr == f"csnd serve: error: {line}\n"


def test_damage_found_by_a_read_is_data_loss_for_the_subscriber(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = str(tmp_path / "log")
    first, victim, off, written = _damaged_log(d)
    with caplog.at_level(logging.INFO), Changelog(d, segment_bytes=SEG) as log:
        srv = serve(log)
        try:
            _flip(first, off + rec.FRAME_HEAD + 5)  # (after the open checked it: as a disk might)
            proc = subprocess.run(
                [*CSND, "subscribe", srv.address, "--idle-timeout", "5"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        finally:
            srv.stop()
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    # Only records before the damaged one, never it or any after it.
    got = proc.stdout.encode().splitlines()
    assert got == [written[c] for c in range(1, len(got) + 1)] and len(got) < victim
    # The subscriber's line is the one `csnd changelog --check` gives.
    assert lines[0] == f"csnd subscribe: error: {srv.address}: {_check_line(d)}"
    # The service said it once, as a line: no traceback of a handler that raised.
    assert not [r for r in caplog.records if r.exc_info], [
        r.getMessage() for r in caplog.records if r.exc_info
    ]
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name == "csnd.changefeed" and "DATA_LOSS" in r.getMessage()
    ]
    assert len(said) == 1 and first in said[0], said
