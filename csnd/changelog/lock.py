"""The changelog directory's lock: one service per directory.

Two processes appending to the same segments would interleave records
and chain CRCs through each other's: an exclusive `flock` on DIR/LOCK,
held for as long as the changelog is open, turns a second opener away
with the pid of the first.  The kernel drops the lock when the holder
dies, so a crash leaves nothing to clean up.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Final

from csnd.core.errors import ConfigError

LOCK_NAME: Final = "LOCK"


def take_lock(directory: str) -> int:
    """An exclusive flock on DIR/LOCK for as long as the changelog is open; a second opener gets ConfigError."""
    path = os.path.join(directory, LOCK_NAME)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"cannot use {directory} as a changelog directory: {e.strerror or e}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise ConfigError(
                f"changelog {directory} is in use by another csnd (pid {holder or 'unknown'} holds {path}); "
                "each service needs its own changelog directory"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
