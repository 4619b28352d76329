"""TxnBuffer: memory bound, spill file, rolled-back subtransactions, cleanup."""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.sender.txnbuf import CHANGE_OVERHEAD, SpillError, TxnBuffer


def _open_spill_fds() -> int:
    """Spill files are unnamed: count this process's descriptors on deleted / O_TMPFILE files."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "(deleted)" in target or "#" in os.path.basename(target):
            n += 1
    return n


def test_small_transaction_stays_in_memory(tmp_path: Path) -> None:
    buf = TxnBuffer("dn1", 7, spill_bytes=1 << 20, spill_dir=str(tmp_path))
    for i in range(100):
        buf.append(i // 10, 1000 + i, None, f"body {i}")
    assert not buf.spilled and buf.n_changes == 100
    assert list(buf.drain()) == [(i // 10, 1000 + i, f"body {i}") for i in range(100)]


def test_large_transaction_spills_and_reads_back_in_order(tmp_path: Path) -> None:
    """Several MB through a 64 KiB bound: the file is used, memory stays near the bound."""
    bound = 64 * 1024
    n = 40_000
    body = "x" * 150  # ~6 MB of bodies, plus multi-byte text below
    fds_before = _open_spill_fds()
    tracemalloc.start()
    try:
        buf = TxnBuffer("dn1", 745, spill_bytes=bound, spill_dir=str(tmp_path))
        for i in range(n):
            buf.append(i // 1000, 0x16B0000 + i * 8, None, f"{i} é€ {body}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert buf.spilled
    assert buf.spilled_bytes > n * 150
    assert buf.mem_bytes == 0
    # Python-level memory stayed far below the data (bound + write buffer + slack).
    assert peak < bound + 4 * 1024 * 1024, peak
    assert os.listdir(tmp_path) == [], "spill files are unnamed"
    assert _open_spill_fds() == fds_before + 1
    it = buf.drain()
    count = 0
    for i, (cid, lsn, text) in enumerate(it):
        assert (cid, lsn, text) == (i // 1000, 0x16B0000 + i * 8, f"{i} é€ {body}")
        count += 1
    assert count == n == buf.n_changes
    assert _open_spill_fds() == fds_before, "the iterator closes the file when exhausted"


def test_unread_release_and_close_free_the_file(tmp_path: Path) -> None:
    fds = _open_spill_fds()
    a = TxnBuffer("dn1", 1, spill_bytes=1000, spill_dir=str(tmp_path))
    b = TxnBuffer("dn1", 2, spill_bytes=1000, spill_dir=str(tmp_path))
    for i in range(100):
        a.append(0, i, None, "y" * 50)
        b.append(0, i, None, "y" * 50)
    assert _open_spill_fds() == fds + 2
    it = iter(a.drain())
    next(it)
    del it  # released, read only in part, then dropped
    gc.collect()
    b.close()  # aborted
    assert _open_spill_fds() == fds


def test_subtransaction_abort_in_memory_and_spilled(tmp_path: Path) -> None:
    for bound in (10**9, 300):
        buf = TxnBuffer("dn1", 100, spill_bytes=bound, spill_dir=str(tmp_path))
        want = []
        for i in range(60):
            sub = (100, 101, 102)[i % 3] if i < 40 else (100, 103)[i % 2]
            buf.append(i, i * 10, sub, f"c{i}")
            if sub not in (101, 103):
                want.append((i, i * 10, f"c{i}"))
            if i == 45:
                buf.abort_subxact(101)
                buf.abort_subxact(101)  # twice is harmless
        buf.abort_subxact(103)
        assert buf.spilled == (bound == 300)
        assert buf.n_changes == len(want)
        assert list(buf.drain()) == want
        if bound > 10**6:
            assert buf.mem_bytes == 0


def test_memory_estimate_drops_with_aborted_subxact() -> None:
    buf = TxnBuffer(spill_bytes=10**9)
    buf.append(0, 1, 5, "abc")
    buf.append(0, 2, 6, "defg")
    buf.abort_subxact(6)
    assert buf.mem_bytes == 3 + CHANGE_OVERHEAD
    assert buf.n_changes == 1


def test_drain_twice_is_a_bug() -> None:
    buf = TxnBuffer(xid=9)
    buf.drain()
    with pytest.raises(RuntimeError, match="transaction 9"):
        buf.drain()


def test_unwritable_spill_dir_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    buf = TxnBuffer("dn3", 88, spill_bytes=10, spill_dir=str(missing))
    with pytest.raises(SpillError) as ei:
        buf.append(0, 1, None, "x" * 100)
    msg = str(ei.value)
    assert msg.startswith("node dn3: ") and "transaction 88" in msg and str(missing) in msg


def test_truncated_spill_file_is_detected(tmp_path: Path) -> None:
    buf = TxnBuffer("dn1", 5, spill_bytes=10, spill_dir=str(tmp_path))
    for i in range(10):
        buf.append(0, i, None, "z" * 40)
    f = buf._file
    assert f is not None
    f.flush()
    f.truncate(f.tell() - 7)
    f.seek(0, os.SEEK_END)
    with pytest.raises(SpillError, match="truncated"):
        list(buf.drain())


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 4), st.text(max_size=30)),
        st.tuples(st.just("abort"), st.integers(1, 4), st.just("")),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=_ops, bound=st.sampled_from([0, 64, 500, 10**9]))
def test_buffer_matches_a_list(ops: list[tuple[str, int, str]], bound: int) -> None:
    """Against the obvious model: a list filtered by the aborted subxids."""
    buf = TxnBuffer("dn1", 1, spill_bytes=bound)
    model: list[tuple[int, int, int, str]] = []
    aborted: set[int] = set()
    lsn = 0
    for op, sub, text in ops:
        if op == "add":
            if sub in aborted:
                continue  # xids are never reused
            lsn += 1
            subxid = None if sub == 0 else sub
            buf.append(lsn % 3, lsn, subxid, text)
            model.append((lsn % 3, lsn, sub, text))
        else:
            aborted.add(sub)
            buf.abort_subxact(sub)
    want = [(c, n, t) for c, n, s, t in model if s not in aborted]
    assert buf.n_changes == len(want)
    assert list(buf.drain()) == want


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_gigabyte_transaction_keeps_rss_flat(tmp_path: Path) -> None:
    """1 GiB of changes through a 1 MiB bound: resident memory grows by a few MB at most.

    (The spill file is unnamed: its disk space is freed as soon as the reader closes it.)
    """
    body = "v" * (64 * 1024)
    n = 1024 * 1024 * 1024 // len(body)
    base = _rss()
    peak = base
    buf = TxnBuffer("dn1", 9, spill_bytes=1024 * 1024, spill_dir=str(tmp_path))
    for i in range(n):
        buf.append(0, i, None, body)
        if i % 128 == 0:
            peak = max(peak, _rss())
    assert buf.spilled_bytes >= 1024 * 1024 * 1024
    count = 0
    for i, (_, lsn, text) in enumerate(buf.drain()):
        assert lsn == i and len(text) == len(body)
        count += 1
        if i % 128 == 0:
            peak = max(peak, _rss())
    assert count == n
    assert peak - base < 32 * 1024 * 1024, f"rss grew by {(peak - base) >> 20} MiB"
