"""`SteadyWall`: the changelog's clock, wall time that moves only as the monotonic clock does, across restarts too.

Record times and retention by age (`retention_hours`) must be wall time:
they outlive the process.  Read from the system clock each time, a clock
set forward would make every segment "old" at once and drop what consumers
have not read; one set back would hold retention (and the disk) for as
long, and stamp new records earlier than old ones.  So the wall clock is
read once and time is counted on from there with the monotonic clock.

Once per process is not enough: a clock set while the service runs would
take effect at its next start, and a restart is routine.  So the anchor
(the wall time, the monotonic time, the kernel's boot id) is kept in the
changelog directory, `clock.json`.  A process on the same boot -- the
monotonic clock is the kernel's, it ran on through the restart -- continues
the last one's time exactly.  After a reboot the monotonic clock starts
again, and the wall clock is all there is; it is taken, but never earlier
than the newest record (a clock set back is not believed before that).  A
clock set forward while the machine was down cannot be told from time that
passed: that is the one jump retention believes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from typing import Final

from csnd.core.durable import replace_file

log = logging.getLogger("csnd.changelog")

CLOCK_NAME: Final = "clock.json"
_VERSION: Final = 1


class SteadyWall:
    """Wall-clock time that moves only as the monotonic clock does: the wall time at its anchor plus time since."""

    __slots__ = ("_wall0", "_mono0", "_mono")

    def __init__(self, wall: Callable[[], float], monotonic: Callable[[], float]) -> None:
        self._wall0 = wall()
        self._mono = monotonic
        self._mono0 = monotonic()

    def __call__(self) -> float:
        return self._wall0 + (self._mono() - self._mono0)

    def resume(self, path: str, boot: str, newest_us: int) -> None:
        """Continue the time of the last process on this boot (its anchor at `path`), never before `newest_us`.

        `boot`: the kernel's boot id ("" where there is none: never the same
        boot).  The anchor is written anew (durably) only when it changes.
        """
        anchor = _read(path)
        changed = True
        if anchor is not None and boot and anchor[0] == boot and anchor[2] <= self._mono0:
            self._wall0 = anchor[1] + (self._mono0 - anchor[2])
            changed = False
        if self._wall0 * 1_000_000 < newest_us:  # (set back across a reboot: not before what was written)
            self._wall0 = newest_us / 1_000_000
            changed = True
        if changed:
            doc = {"boot": boot, "monotonic": self._mono0, "version": _VERSION, "wall": self._wall0}
            try:
                replace_file(path, json.dumps(doc, sort_keys=True).encode() + b"\n", path + ".tmp")
            except OSError as e:  # (a hint: the next start takes the wall clock instead)
                log.warning("changelog: cannot write the clock anchor %s: %s", path, e.strerror or e)


def _read(path: str) -> tuple[str, float, float] | None:
    """The anchor (boot id, wall, monotonic), or None when there is none or it is not one (a hint: never fatal)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path + ".tmp")  # (a write cut short)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
        boot, wall, mono = doc["boot"], doc["wall"], doc["monotonic"]
        if doc.get("version") == _VERSION and isinstance(boot, str):
            return boot, float(wall), float(mono)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass
    log.warning("changelog: %s is not a clock anchor of this csnd; the wall clock is taken as it is", path)
    return None
