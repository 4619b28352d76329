"""A sync that runs behind the appends: its fsync in a thread of its own, one at a time.

    caller:  append ... start() ─► begin_sync ─► thread: fsync ──┐
             append ... start() ─► finish(): join, finish_sync ◄──┘ ─► begin_sync ─► thread: fsync ...
             finish() at the end: everything started is durable and shown

For a writer with no group commit of its own (the initial snapshot's run):
it goes on appending while the disk writes what the last sync covered,
instead of waiting for the fsync at every sync.  begin_sync and
finish_sync run in the caller's thread, as every append does; only the
fsync runs in the other, as in the service's group commit
(`csnd.service.sink`).  A sync is shown to readers when the next one
starts or at `finish`, so what readers see trails the appends by one sync;
a crash loses what no finished fsync covered, as with `Changelog.sync`.
A caller that waits for other work meanwhile is told when an fsync is over
(`on_fsynced`, in the sync's thread) and shows it without waiting
(`finish_if_over`), so it never stands in an fsync while work may come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from csnd.changelog.sync import SyncPoint

if TYPE_CHECKING:
    from csnd.changelog.log import Changelog


class SyncBehind:
    """`Changelog.sync` in two halves: `start` in the caller's thread, the fsync behind it, `finish` to wait."""

    def __init__(
        self, log: Changelog, name: str = "csnd-sync-behind", on_fsynced: Callable[[], None] | None = None
    ) -> None:
        self._log = log
        self._name = name
        self._on_fsynced = on_fsynced  # (called in the sync's thread: it must not block)
        self._thread: threading.Thread | None = None
        self._point: SyncPoint | None = None
        self._then: Callable[[], None] | None = None
        self._error: BaseException | None = None
        self._over = threading.Event()  # the fsync under way has ended (the thread may not have yet)

    @property
    def busy(self) -> bool:
        """A sync is under way (started, not yet finished)."""
        return self._thread is not None

    def start(self, then: Callable[[], None] | None = None) -> None:
        """Finish the sync under way, then begin one of everything appended so far (its fsync behind).

        `then` runs in the caller's thread once this sync is shown (at the
        next `start` or `finish`): what the caller reports as durable."""
        self.finish()
        point = self._log.begin_sync()
        if point is None:
            if then is not None:
                then()  # (nothing new: what it covers is durable already)
            return
        self._point, self._then = point, then
        self._over.clear()
        self._thread = threading.Thread(target=self._fsync, args=(point,), name=self._name, daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Wait for the sync under way and show what it covered; its failure is raised here."""
        thread, point, then = self._thread, self._point, self._then
        if thread is None or point is None:
            return
        thread.join()
        self._thread = self._point = self._then = None
        if self._error is not None:
            raise self._error
        self._log.finish_sync(point)
        if then is not None:
            then()

    def finish_if_over(self) -> bool:
        """`finish` if the fsync under way is over, without waiting for it; True when nothing is under way after."""
        if self._thread is not None and not self._over.is_set():
            return False
        self.finish()
        return True

    def abandon(self) -> None:
        """Wait for the fsync under way, if any, and drop it unshown (the caller is failing)."""
        thread, self._thread, self._point, self._then = self._thread, None, None, None
        if thread is not None:
            thread.join()

    def _fsync(self, point: SyncPoint) -> None:
        try:
            self._log.fsync(point)
        except BaseException as e:  # (raised in the caller's thread, at `finish`)
            self._error = e
        self._over.set()
        if self._on_fsynced is not None:
            self._on_fsynced()
