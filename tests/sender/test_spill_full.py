"""A transaction's spill file on a full filesystem: one clear error when its changes are needed, none when not.

The spill file is written through a buffer, so a full disk may surface only
when the buffer is flushed: as the changes are read back (a `SpillError`
naming node, transaction and directory), or as the buffer of a transaction
that aborted is closed -- whose changes nobody needs, so a failed flush
there is no error at all (it was an OSError that ended the service as
"cannot read its source").  A tmpfs of its own (we run as root).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from csnd.core.errors import SpillError
from csnd.sender.txnbuf import TxnBuffer
from tests.fixtures.disks import fill, tmpfs


@pytest.fixture
def full_disk() -> Iterator[str]:
    """A 1 MiB tmpfs; `fill(dir)` fills it to the last byte."""
    with tmpfs("1m") as mnt:
        yield mnt


def _spilled(directory: str) -> TxnBuffer:
    """A transaction spilled to `directory` with its changes still in the file's buffer (nothing on disk yet)."""
    buf = TxnBuffer("dn1", 745, spill_bytes=1000, spill_dir=directory)
    for i in range(100):
        buf.append(i, 0x1000 + i, None, "x" * 100)
    assert buf.spilled
    return buf


def test_aborted_spilled_transaction_closes_quietly_on_a_full_disk(full_disk: str) -> None:
    buf = _spilled(full_disk)
    fill(full_disk)
    buf.close()  # (its changes are discarded: a flush that cannot be written loses nothing)


def test_spilled_transaction_read_back_on_a_full_disk_names_it(full_disk: str) -> None:
    buf = _spilled(full_disk)
    fill(full_disk)
    with pytest.raises(SpillError) as e:
        list(buf.drain())
    text = str(e.value)
    assert "transaction 745" in text and f"in {full_disk}: No space left on device (ENOSPC)" in text, text
