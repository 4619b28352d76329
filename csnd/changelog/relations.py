"""`RelationStore`: every relation version the changelog's transactions were written with, durable.

A transaction line names its tables and key columns but not their column
types; those change only with a Relation message, so they are said once per
relation version, in relation lines (docs/design.md section 7):

    {"relation": {"csn": 1042, "node": "dn1", "schema": "public", "table": "acct", ...}}

where `csn` is the first transaction the version is in force with.  A
consumer reading from CSN X needs the versions in force at X, which came
with transactions before X, maybe long gone to retention; so the changelog
keeps every version here, `DIR/relations.jsonl`, one relation line each,
appended (and fsynced) before the transaction that first uses it is
appended -- a version is never missing for a durable transaction.  A version
equal to the one in force is not added again (pgoutput repeats Relation
messages at every reconnect and invalidation), so the file grows with DDL,
not with traffic, and retention leaves it alone.

On open a last line cut short (a crash mid-append) is cut off, as the
changelog cuts a torn tail; anything else that is not a relation line is
corruption, named with its file and offset.

    between(lo, hi)   the latest version of each table among those that came
                      into force after csn lo, up to csn hi: what a reader
                      who has the versions in force at lo needs before the
                      transaction at hi (lo = 0: the versions in force at hi)
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Final, NamedTuple

from csnd.coordinator.jsonlines import relation_line
from csnd.core.durable import sync_directory
from csnd.core.errors import ChangelogCorrupt

FILE_NAME: Final = "relations.jsonl"

log = logging.getLogger("csnd.changelog")


class RelationEntry(NamedTuple):
    csn: int  # the first transaction it is in force with
    node: str
    schema: str
    table: str
    body: str  # decoder.schema.relation_body
    line: str  # the relation line (no newline)


class RelationStore:
    """The relation versions of one changelog directory; safe to call from several threads."""

    def __init__(self, directory: str, guard: Callable[[Callable[[], None]], None] | None = None) -> None:
        self.path = os.path.join(os.path.abspath(directory), FILE_NAME)
        # The changelog's `_guard`: a failed write (a full disk) is its one error line, and stops
        # its appends too (a record must never be durable without its relation version).
        self._guard = guard if guard is not None else _run
        self._lock = threading.Lock()
        self._fd = -1
        entries = self._load()
        entries.sort(key=lambda e: e.csn)  # (stable: the file's order within a csn)
        self._entries: list[RelationEntry] = entries
        self._csns = [e.csn for e in entries]

    def __len__(self) -> int:
        return len(self._entries)

    def _load(self) -> list[RelationEntry]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        out: list[RelationEntry] = []
        offset = 0
        while offset < len(data):
            end = data.find(b"\n", offset)
            if end < 0:  # a torn last line: the append it belonged to never returned
                log.warning(
                    "%s: cutting %d bytes of a relation line cut short", self.path, len(data) - offset
                )
                with open(self.path, "r+b") as f:
                    f.truncate(offset)
                    f.flush()
                    os.fsync(f.fileno())
                break
            try:
                out.append(_parse(data[offset:end].decode("utf-8")))
            except (ValueError, KeyError, TypeError) as e:
                raise ChangelogCorrupt(
                    f"not a relation line ({e}); restore the file from a copy", path=self.path, offset=offset
                ) from None
            offset = end + 1
        return out

    def add(self, csn: int, node: str, body: str) -> RelationEntry | None:
        """Keep the version `body` of a table of `node` as in force from `csn`; durable on return.

        None when the version in force at `csn` is that one already.
        """
        obj = json.loads("{" + body + "}")
        schema, table = obj["schema"], obj["table"]
        with self._lock:
            current = self._in_force(node, schema, table, csn)
            if current is not None and current.body == body:
                return None
            entry = RelationEntry(csn, node, schema, table, body, relation_line(csn, node, body))
            self._append(entry.line)
            i = bisect.bisect_right(self._csns, csn)
            self._entries = [*self._entries[:i], entry, *self._entries[i:]]  # (readers hold the old list)
            self._csns = [*self._csns[:i], csn, *self._csns[i:]]
            return entry

    def has_between(self, lo: int, hi: int) -> bool:
        """Whether any version came into force after csn `lo`, up to csn `hi` (cheap: a reader asks per record)."""
        csns = self._csns
        return bisect.bisect_right(csns, lo) < bisect.bisect_right(csns, hi)

    def between(
        self, lo: int, hi: int, keep: Callable[[str, str], bool] | None = None
    ) -> list[RelationEntry]:
        """The latest version of each (node, schema, table) in force from a csn in (lo, hi], by csn.

        `keep(schema, table)`: only those tables.
        """
        entries, csns = self._entries, self._csns
        latest: dict[tuple[str, str, str], RelationEntry] = {}
        for e in entries[bisect.bisect_right(csns, lo) : bisect.bisect_right(csns, hi)]:
            if keep is None or keep(e.schema, e.table):
                latest[(e.node, e.schema, e.table)] = e
        return sorted(latest.values(), key=lambda e: e.csn)

    def in_force(self, node: str, schema: str, table: str, csn: int) -> tuple[int, str] | None:
        """(the csn it is in force from, its body) of the table's version in force at `csn`; None: none."""
        with self._lock:
            e = self._in_force(node, schema, table, csn)
        return (e.csn, e.body) if e is not None else None

    def _in_force(self, node: str, schema: str, table: str, csn: int) -> RelationEntry | None:
        for e in reversed(self._entries[: bisect.bisect_right(self._csns, csn)]):
            if (e.node, e.schema, e.table) == (node, schema, table):
                return e
        return None

    def _append(self, line: str) -> None:
        def step() -> None:
            created = self._fd < 0 and not os.path.exists(self.path)
            try:
                if self._fd < 0:
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                view = memoryview((line + "\n").encode("utf-8"))
                while view:
                    view = view[os.write(self._fd, view) :]
                os.fsync(self._fd)
            except OSError as e:  # (os.write names no file: the error line does)
                raise OSError(e.errno, e.strerror, self.path) from e
            if created:
                sync_directory(self.path)

        self._guard(step)

    def clear(self) -> None:
        """Forget every version, on disk too (the changelog's records went: `Changelog.clear`)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if os.path.exists(self.path):
                os.unlink(self.path)
                sync_directory(self.path)
            self._entries, self._csns = [], []

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _check(self) -> None:
        assert self._csns == [e.csn for e in self._entries] == sorted(self._csns)
        for e in self._entries:
            assert e.line == relation_line(e.csn, e.node, e.body)


def _run(step: Callable[[], None]) -> None:
    step()


def _parse(line: str) -> RelationEntry:
    """One line of the file, checked to be a relation line exactly as `relation_line` writes it."""
    obj = json.loads(line)["relation"]
    csn, node, schema, table = obj["csn"], obj["node"], obj["schema"], obj["table"]
    if type(csn) is not int or csn < 0 or not all(isinstance(x, str) for x in (node, schema, table)):
        raise ValueError("csn, node, schema or table of the wrong type")
    head = relation_line(csn, node, "")
    prefix, suffix = head[: -len("}}")], "}}"
    if not (line.startswith(prefix) and line.endswith(suffix)):
        raise ValueError("not written as csnd writes relation lines")
    return RelationEntry(csn, node, schema, table, line[len(prefix) : -len(suffix)], line)
