"""`SubscriptionStore`: the acknowledged CSN of each named subscription, durable (Kafka's consumer offsets).

One small JSON file in the changelog directory, `subscriptions.json`:
`{"version": 1, "subscriptions": {"NAME": CSN, ...}}`.  Every set() writes
the whole file anew the way a crash cannot tear: a temporary file, fsync,
rename over the old one, fsync of the directory (so the rename itself is
durable).  After a crash the file is the old one or the new one, never a
mix; a leftover temporary file is an unfinished set() and is removed.
The file holds a few names, and acknowledgements are rate-limited by the
changefeed, so rewriting it whole costs less than a log of offsets would.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Final

from csnd.core.durable import sync_directory
from csnd.core.errors import ChangelogCorrupt

FILE_NAME: Final = "subscriptions.json"
_VERSION: Final = 1


class SubscriptionStore:
    """Durable named offsets; safe to call from several threads."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(os.path.abspath(directory), FILE_NAME)
        self._tmp = self.path + ".tmp"
        self._lock = threading.Lock()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)
        self._offsets = self._load()

    def _load(self) -> dict[str, int]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        try:
            doc = json.loads(data)
            subs = doc["subscriptions"]
            ok = doc.get("version") == _VERSION and isinstance(subs, dict)
            ok = ok and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in subs.items())
        except (ValueError, TypeError, KeyError):
            ok = False
        if not ok:
            raise ChangelogCorrupt(
                "not a subscription offsets file of this csnd; restore it from a copy, or remove it "
                "to forget every named subscription's position",
                path=self.path,
                offset=0,
            )
        return dict(subs)

    def get(self, name: str) -> int | None:
        with self._lock:
            return self._offsets.get(name)

    def all(self) -> dict[str, int]:
        with self._lock:
            return dict(self._offsets)

    def set(self, name: str, csn: int) -> None:
        """Store `name`'s acknowledged csn; durable when this returns."""
        if not isinstance(name, str) or not name:
            raise ValueError("a subscription name must be a non-empty string")
        if type(csn) is not int or csn < 0:
            raise ValueError(f"subscription {name!r}: csn must be a non-negative integer, not {csn!r}")
        with self._lock:
            if self._offsets.get(name) == csn:
                return
            offsets = {**self._offsets, name: csn}
            data = json.dumps({"version": _VERSION, "subscriptions": offsets}, sort_keys=True).encode()
            fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data + b"\n")
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp, self.path)
            sync_directory(self.path)
            self._offsets = offsets

    def _check(self) -> None:
        assert all(isinstance(k, str) and k and v >= 0 for k, v in self._offsets.items())
