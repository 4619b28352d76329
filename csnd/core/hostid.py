"""Which running kernel this is: the service's files are readable in place only on its own host.

Linux gives every boot a random id (`/proc/sys/kernel/random/boot_id`).  Two
processes with the same id run on one kernel, so a path one of them names
is the other's file too (unless they see different mounts, which opening
it finds out); two hosts, or one host's two boots, never share it --
whatever they share over NFS, where a file the service drops can vanish
under a reader's mapping.  Elsewhere there is no id and nothing is read
in place.
"""

from __future__ import annotations

from functools import cache
from typing import Final

BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"


@cache
def host_id() -> str:
    """This kernel's boot id, or "" where there is none."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""
