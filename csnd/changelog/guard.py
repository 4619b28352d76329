"""The changelog's failure latch: after one failed write or fsync, every later one is refused.

After a failed write or fsync a file's state is unknown, and a retried
fsync may report success for pages the kernel dropped (PostgreSQL's
"fsyncgate"): the changelog refuses everything from then on, and a
restart reopens it at its last durable record while the sources re-send
the rest.  A full disk (ENOSPC, EDQUOT) is the same, with advice to free
space: nothing is confirmed past the durable CSN, and the service ends
with this one line (docs/service.md).

Every part that touches the files -- the segment writer, the sync, the
records in pieces, retention, the relation store -- runs its I/O through
the one latch, so the first failure is the one reported.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from csnd.core.errors import CsndError, OutputError


class WriteGuard:
    """Runs the changelog's file steps; the first OSError becomes an OutputError raised from then on."""

    __slots__ = ("directory", "failed", "_durable_csn")

    def __init__(self, directory: str, durable_csn: Callable[[], int]) -> None:
        self.directory = directory
        self.failed: CsndError | None = None
        self._durable_csn = durable_csn  # (named in the error: nothing after it is confirmed)

    def __call__(self, step: Callable[[], None]) -> None:
        if self.failed is not None:
            raise self.failed
        try:
            step()
        except OSError as e:
            code = errno.errorcode.get(e.errno or 0)
            what = f"{e.strerror or e}{f' ({code})' if code else ''}"
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            todo = (
                f"free space in {self.directory} (or give it more) and restart the service"
                if full
                else "restart the service"
            )
            self.failed = OutputError(
                f"changelog {self.directory}: cannot write {e.filename or 'a segment'}: {what}; "
                f"nothing after csn {self._durable_csn()} is durable or confirmed to a slot; {todo}: "
                "the changelog reopens at its last durable record and the sources re-send the rest"
            )
            raise self.failed from e
