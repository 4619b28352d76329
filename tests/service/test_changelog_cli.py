"""`csnd changelog DIR` as a user runs it: a subprocess on real directories (docs/design.md section 8)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from csnd.changelog import Changelog
from tests.service.feedkit import fill

CSND = [sys.executable, "-m", "csnd.cli"]


def _changelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CSND, "changelog", *args], capture_output=True, text=True, timeout=120)


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("check", [["--check"], []])
@pytest.mark.parametrize("contents", [{}, {"notes.txt": b"hello\n"}, {"LOCK": b"", "CURRENT": b"x"}])
def test_a_directory_that_is_no_changelog_is_refused_untouched(
    tmp_path: Path, contents: dict[str, bytes], check: list[str]
) -> None:
    """It said "ok: 0 transactions" and left a LOCK file behind."""
    d = tmp_path / "not-a-changelog"
    d.mkdir()
    for name, data in contents.items():
        (d / name).write_bytes(data)
    before = _tree(d)
    proc = _changelog(str(d), *check)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        f"csnd changelog: error: {d} is not a changelog directory (no segment files like "
        "0000000000000001-0000000000000001.log); give the directory of csnd serve --changelog"
    ]
    assert _tree(d) == before and sorted(os.listdir(d)) == sorted(contents)


def test_a_missing_directory_or_a_file_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    proc = _changelog(str(tmp_path / "missing"), "--check")
    assert (proc.returncode, proc.stderr) == (
        1,
        f"csnd changelog: error: {tmp_path / 'missing'}: no such directory\n",
    )
    (tmp_path / "file").write_text("x")
    proc = _changelog(str(tmp_path / "file"), "--check")
    assert (proc.returncode, proc.stderr) == (
        1,
        f"csnd changelog: error: {tmp_path / 'file'}: not a directory\n",
    )
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_changelog_still_opens_empty_or_not(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    with Changelog(str(empty)):  # (what a service that has appended nothing yet leaves: LOCK)
        pass
    proc = _changelog(str(empty), "--check")
    assert proc.returncode == 0 and "ok: 0 transactions" in proc.stderr, proc.stderr
    full = tmp_path / "full"
    with Changelog(str(full)) as log:
        written = fill(log, range(1, 6))
    proc = _changelog(str(full), "--check")
    assert proc.returncode == 0 and "ok: 5 transactions" in proc.stderr, proc.stderr
    proc = _changelog(str(full), "--from-csn", "3")
    assert proc.stdout.encode() == written[4] + b"\n" + written[5] + b"\n"
