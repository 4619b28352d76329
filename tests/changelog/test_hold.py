"""Records held back from readers (an initial snapshot in progress), and a changelog emptied to take one again."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from csnd.changelog import Changelog


def test_held_records_are_shown_to_no_reader_until_released(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.hold_readers()
        for csn in (1, 2, 3):
            log.append(csn, b'{"csn": %d}' % csn)
        log.sync()
        assert log.durable_csn == 3 and log.visible_csn == 0
        assert list(log.read(0)) == [] and list(log.read_pieced(1)) == []
        assert log.count_after(0, 10) == (0, False)
        assert not log.wait_durable(0, 0.05)
        woke: list[bool] = []
        waiter = threading.Thread(target=lambda: woke.append(log.wait_durable(0, 30)))
        waiter.start()
        log.release_readers()
        waiter.join(30)
        assert woke == [True]
        assert [c for c, _ in log.read(0)] == [1, 2, 3] and log.count_after(0, 10) == (3, False)


def test_a_hold_keeps_what_was_shown_before_it(tmp_path: Path) -> None:
    with Changelog(str(tmp_path)) as log:
        log.append(1, b"a")
        log.sync()
        log.hold_readers()
        log.append(2, b"b")
        log.sync()
        assert list(log.read(0)) == [(1, b"a")] and list(log.read(0, 2)) == [(1, b"a")]
        assert log.visible_csn == 1


def test_clear_leaves_a_new_changelog(tmp_path: Path) -> None:
    log = Changelog(str(tmp_path), segment_bytes=200)
    log.relations.add(1, "dn1", '"schema": "public", "table": "t", "columns": []')
    for csn in range(1, 30):
        log.append(csn, b"x" * 50)
    log.sync()
    assert log.segment_count > 1
    log.clear()
    log._check()
    assert (log.durable_csn, log.segment_count, len(log.relations), list(log.read(0))) == (0, 0, 0, [])
    log.append(5, b"again")  # (from any csn: nothing is before it now)
    log.sync()
    log._check()
    log.close()
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".log")) == [
        "0000000000000001-0000000000000005.log"
    ]
    with Changelog(str(tmp_path)) as again:
        assert list(again.read(0)) == [(5, b"again")] and len(again.relations) == 0
