"""`SubscriptionStore`: each named subscription's acknowledged CSN and table filter, durable (Kafka's consumer offsets).

One small JSON file in the changelog directory, `subscriptions.json`:
`{"subscriptions": {"NAME": CSN, ...}, "tables": {"NAME": ["public.acct", ...], ...}, "version": 1}`
(`tables` lists only names that have a filter; it came after the first
format, which a reader that does not know it still reads, and a file
without it means no filters).  Every change writes the whole file anew the
way a crash cannot tear: a temporary file, fsync, rename over the old one,
fsync of the directory (so the rename itself is durable).  After a crash
the file is the old one or the new one, never a mix; a leftover temporary
file is an unfinished write and is removed.  The file holds a few names,
and acknowledgements are rate-limited by the changefeed, so rewriting it
whole costs less than a log of offsets would.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Sequence
from typing import Final

from csnd.core.durable import replace_file
from csnd.core.errors import ChangelogCorrupt, OutputError

FILE_NAME: Final = "subscriptions.json"
_VERSION: Final = 1


class SubscriptionStore:
    """Durable named offsets and table filters; safe to call from several threads."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(os.path.abspath(directory), FILE_NAME)
        self._tmp = self.path + ".tmp"
        self._lock = threading.Lock()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._tmp)
        self._offsets, self._tables = self._load()

    def _load(self) -> tuple[dict[str, int], dict[str, tuple[str, ...]]]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}, {}
        try:
            doc = json.loads(data)
            subs = doc["subscriptions"]
            tables = doc.get("tables", {})
            ok = doc.get("version") == _VERSION and isinstance(subs, dict) and isinstance(tables, dict)
            ok = ok and all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in subs.items())
            ok = ok and all(
                k in subs and isinstance(v, list) and all(isinstance(t, str) for t in v)
                for k, v in tables.items()
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            ok = False
        if not ok:
            raise ChangelogCorrupt(
                "not a subscription offsets file of this csnd; restore it from a copy, or remove it "
                "to forget every named subscription's position",
                path=self.path,
                offset=0,
            )
        return dict(subs), {k: tuple(v) for k, v in tables.items() if v}

    def get(self, name: str) -> int | None:
        with self._lock:
            return self._offsets.get(name)

    def all(self) -> dict[str, int]:
        with self._lock:
            return dict(self._offsets)

    def tables(self) -> dict[str, tuple[str, ...]]:
        """The table filter of every name that has one (a name without one: every table)."""
        with self._lock:
            return dict(self._tables)

    def set(self, name: str, csn: int, tables: Sequence[str] | None = None) -> None:
        """Store `name`'s acknowledged csn, and its table filter unless None (empty: every table); durable on return."""
        if not isinstance(name, str) or not name:
            raise ValueError("a subscription name must be a non-empty string")
        if type(csn) is not int or csn < 0:
            raise ValueError(f"subscription {name!r}: csn must be a non-negative integer, not {csn!r}")
        with self._lock:
            filters = dict(self._tables)
            if tables is not None:
                filters.pop(name, None)
                if tables:
                    filters[name] = tuple(tables)
            if self._offsets.get(name) == csn and filters == self._tables:
                return
            self._write({**self._offsets, name: csn}, filters)

    def delete(self, name: str) -> bool:
        """Forget `name` (its csn and filter); durable on return.  False if it was not stored."""
        with self._lock:
            if name not in self._offsets:
                return False
            offsets = {k: v for k, v in self._offsets.items() if k != name}
            self._write(offsets, {k: v for k, v in self._tables.items() if k != name})
            return True

    def _write(self, offsets: dict[str, int], tables: dict[str, tuple[str, ...]]) -> None:
        """Replace the file (under the lock), then what this object holds."""
        doc: dict[str, object] = {"version": _VERSION, "subscriptions": offsets}
        if tables:
            doc["tables"] = {k: list(v) for k, v in tables.items()}
        try:
            replace_file(self.path, json.dumps(doc, sort_keys=True).encode() + b"\n", self._tmp)
        except OSError as e:  # (the old file stands: rename is the last step)
            code = errno.errorcode.get(e.errno or 0)
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            raise OutputError(
                f"cannot store the named subscriptions' marks in {self.path}: {e.strerror or e}"
                f"{f' ({code})' if code else ''}; the file keeps the marks stored before, so a named "
                "subscription resumes from there; "
                + (
                    f"free space in {os.path.dirname(self.path)} (or give it more) and restart the service"
                    if full
                    else "restart the service"
                )
            ) from e
        self._offsets, self._tables = offsets, tables

    def _check(self) -> None:
        assert all(isinstance(k, str) and k and v >= 0 for k, v in self._offsets.items())
        assert all(k in self._offsets and v for k, v in self._tables.items())
