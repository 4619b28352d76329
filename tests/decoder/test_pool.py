"""The decoder pool's plumbing (its decoding is tested end to end in tests/test_replay.py)."""

from __future__ import annotations

import fcntl

from decoder.pool import PIPE_BYTES, DecoderPool


def _pipe_max() -> int:
    with open("/proc/sys/fs/pipe-max-size") as f:
        return int(f.read())


def test_pipes_to_and_from_workers_hold_whole_batches() -> None:
    """A worker must not wait in send() for the collector to come round (see `_widen_pipe`)."""
    pool = DecoderPool("dn1", 2, binary=True)
    try:
        ends = [c.fileno() for c in pool._out] + [q._reader.fileno() for q in pool._in]
        sizes = [fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) for fd in ends]
    finally:
        pool.close()
    # where the system caps pipes lower, they keep Linux's default of 64 kB
    expected = PIPE_BYTES if _pipe_max() >= PIPE_BYTES else 1 << 16
    assert sizes == [expected] * 4
