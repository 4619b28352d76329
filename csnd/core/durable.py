"""Making written files durable: writeback as they grow, and their directory entries.

`sync_directory` fsyncs the directory that holds a file, after the file is
created or renamed into place: fsync of a file does not by itself make its
name durable (PostgreSQL does the same, `fsync_fname` of the parent).

`Writeback` starts writing a file's new pages to disk while the file is still
being written.

Linux keeps written pages dirty in memory until a flusher thread gets to
them (after `vm.dirty_expire_centisecs`, 30 s by default, or once a tenth of
memory is dirty).  A replay writes hundreds of megabytes in less time than
that, so every byte reached the disk only in the closing fsync: half a
second of a ten-second replay spent waiting, with both cores idle.  Asking
for writeback of each stretch as it is written lets the disk work while
the decoders do, and the fsync waits only for the last stretch.

This is what PostgreSQL's `*_flush_after` settings do (`pg_flush_data`):
`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which starts writeback and does
not wait for it.  Python's `os` module has no binding for it, so it is
called through ctypes; where libc has no such function it is a no-op and
the fsync does all the work, as before.  It is only ever a hint: durability
still comes from the fsync.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Callable
from typing import Final

# Ask for writeback after this many new bytes.  Large enough that the call
# is rare (one per 8 MiB), small enough that the closing fsync has little left.
WRITEBACK_BYTES: Final = 8 << 20

_SYNC_FILE_RANGE_WRITE: Final = 2
_PAGE: Final = mmap.PAGESIZE


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        # The interpreter's own symbols include libc's (no ldconfig lookup).
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


class Writeback:
    """Tracks how far a file has been written and starts writeback of each new stretch."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.written = 0
        self._started = 0  # writeback asked for everything before this offset

    def wrote(self, nbytes: int) -> None:
        self.written += nbytes
        # Whole pages only: the last, partly written page would go to disk
        # now and be dirtied again by the next write (which, on a device
        # that needs stable pages, waits for that I/O).
        end = self.written - self.written % _PAGE
        if _sync_file_range is not None and end - self._started >= WRITEBACK_BYTES:
            # Errors are ignored on purpose: a hint that fails changes nothing
            # that the fsync will not do, and the fsync reports real I/O errors.
            _sync_file_range(self.fd, self._started, end - self._started, _SYNC_FILE_RANGE_WRITE)
            self._started = end


def replace_file(path: str, data: bytes, tmp: str | None = None) -> None:
    """Make `data` the contents of `path` durably, all or nothing: a temporary file, fsync, rename, directory fsync."""
    tmp = tmp or path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    sync_directory(path)


def sync_directory(path: str) -> None:
    """fsync the directory holding `path`, so that its entry (a creation or a rename) survives a crash."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
