"""A snapshot's chunk records appended in parts: the changelog `append` of the joined line writes, byte for byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.snapshot.lines import changes_line, changes_parts, chunk_line, done_line, snapshot_state
from tests.changelog.helpers import FakeClock

_LSN = 0x1505F10
_MADE_AT = 1_700_000_000_000_000


def _files(directory: Path) -> dict[str, bytes]:
    return {
        n: (directory / n).read_bytes() for n in sorted(os.listdir(directory)) if n.endswith((".log", ".idx"))
    }


def _bodies(rows: int, width: int) -> list[str]:
    return [
        f'"op": "read", "schema": "public", "table": "item", "key": ["id"], "old": null, '
        f'"new": {{"id": {i}, "v": "{"é" * (i % 7)}{"x" * width}"}}'
        for i in range(rows)
    ]


def _changes(bodies: list[str]) -> bytes:
    """The change objects' text, as `render.chunk_changes` writes it (no brackets), in UTF-8."""
    line = chunk_line(1, "dn1", _LSN, _MADE_AT, [f'"lsn": "0/1505F10", {b}' for b in bodies], {})
    start = line.index('"changes": [') + len('"changes": [')
    return line[start : line.rindex('], "snapshot": ')].encode("utf-8")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 200)), min_size=1, max_size=6))
def test_a_snapshot_changelog_in_parts_is_the_joined_one_byte_for_byte(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[tuple[int, int]]
) -> None:
    # (chunks from empty to a few hundred KiB: small ones are joined, large ones written in parts)
    joined, parted = (Path(tmp_path_factory.mktemp(n)) for n in ("joined", "parted"))
    opts = {
        "segment_bytes": 256 << 10,
        "index_interval": 4096,
        "clock": FakeClock(),
        "monotonic": FakeClock(),
    }
    lines: list[bytes] = []
    with Changelog(str(joined), **opts) as a, Changelog(str(parted), **opts) as b:  # type: ignore[arg-type]
        for csn, (rows, width) in enumerate(chunks, start=1):
            bodies = _bodies(rows, width)
            marker = {
                "node": "dn1",
                "schema": "public",
                "table": "item",
                "chunk": csn,
                "chunks": len(chunks),
                "rows": rows,
            }
            changes = _changes(bodies)
            parts = changes_parts(csn, "dn1", _LSN, _MADE_AT, changes, marker)
            line = changes_line(csn, "dn1", _LSN, _MADE_AT, changes, marker)
            assert b"".join(parts) == line
            assert json.loads(line) == json.loads(
                chunk_line(csn, "dn1", _LSN, _MADE_AT, [f'"lsn": "0/1505F10", {x}' for x in bodies], marker)
            )
            a.append(csn, line)
            b.append_parts(csn, parts)
            a.sync()
            b.sync()
            lines.append(line)
        done = len(chunks) + 1
        for log in (a, b):
            log.append(done, done_line(done, {"dn1": _LSN}, _MADE_AT, {"rows": 0}).encode("utf-8"))
            log.sync()
        assert list(b.read(0)) == [*enumerate(lines, start=1), *list(a.read(len(chunks)))]
        assert snapshot_state(next(iter(b.read(len(chunks))))).state == "complete"
    assert _files(parted) == _files(joined)
