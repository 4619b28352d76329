"""Table filters: a subscriber's `schema.table` list applied to transaction lines.

The changelog holds each transaction as its docs/design.md section 7 JSON line.  A
filtered subscriber gets the same line with only the changes of its tables:
csn, gid, commit_time and nodes stay as they are, and a transaction with no
change left is not sent at all.  The line is cut, not re-serialised: the head
(up to `"changes": [`), every kept change and the tail are copied byte for byte
from the stored line and the kept changes are joined with `", "`, exactly as
the writer (`csnd.coordinator.jsonlines`) joins them.  Re-dumping parsed values
could change them (a float4's shortest text, key order), and the format is one
other tools compare byte for byte.  The `schema.table` syntax itself is
`csnd.core.tablespec`'s, shared with the consumers.

A subscriber may name thousands of tables: a line is matched against them
by set lookups, never by a scan of the line per name.  A line too large for
one message comes in pieces (`keep_pieces`): it is filtered a change at a
time (`csnd.service.linescan`) and goes out in pieces again, so a filtered
or converted stream holds about one change and a piece, not the line.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final

from csnd.core.tablespec import parse_table
from csnd.service.linescan import LineScanner

_scan: Final = json.JSONDecoder().raw_decode
_encode: Final = json.JSONEncoder(ensure_ascii=False).encode
# Up to this many names, the first test of a line is a substring search per
# name (memchr speed, the fastest for a few); past it, one pass of _NAMED over
# the line with a set lookup per match, whatever the number of names.
FEW_NAMES: Final = 8
# A `"schema": "..."` or `"table": "..."` pair as the writer encodes it (the
# string's JSON text: compared with the names encoded the same way).
_NAMED: Final = re.compile(rb'"(schema|table)": "((?:[^"\\]|\\.)*)"')
# What a converted stream does with one transaction (csnd.service.debezium):
# given the line's keys but its changes, the text each change becomes.
ChangeConverter = Callable[[Mapping[str, Any]], Callable[[Mapping[str, Any]], str]]


class TableFilter:
    """The tables one subscriber asked for; empty: every table (`keep` returns the line as is)."""

    __slots__ = ("tables", "schemas", "_needles", "_table_texts", "_schema_texts")

    def __init__(self, specs: Iterable[str] = ()) -> None:
        parsed = [parse_table(s) for s in specs]
        self.tables = frozenset((s, t) for s, t in parsed if t is not None)
        self.schemas = frozenset(s for s, t in parsed if t is None)  # (schema.*)
        # A cheap first test: a line that holds none of these texts has no
        # change of ours (the writer encodes names exactly so); a line that
        # holds one is parsed to be sure.
        self._table_texts = frozenset(_encode(t)[1:-1].encode() for _, t in self.tables)
        self._schema_texts = frozenset(_encode(s)[1:-1].encode() for s in self.schemas)
        self._needles = tuple(
            {b'"table": "' + t + b'"' for t in self._table_texts}
            | {b'"schema": "' + s + b'"' for s in self._schema_texts}
        )

    def __bool__(self) -> bool:
        return bool(self._needles)

    def matches(self, schema: str, table: str) -> bool:
        """Whether a change of `schema.table` is kept (a relation line of it sent)."""
        return not self._needles or (schema, table) in self.tables or schema in self.schemas

    def wants(self, change: Mapping[str, Any]) -> bool:
        """Whether a change (parsed) is kept."""
        schema = change.get("schema")
        return not self._needles or (schema, change.get("table")) in self.tables or schema in self.schemas

    def may_hold(self, line: bytes) -> bool:
        """False when `line` surely holds no change of ours (True: parse it to know)."""
        needles = self._needles
        if len(needles) <= FEW_NAMES:
            return any(n in line for n in needles)
        tables, schemas = self._table_texts, self._schema_texts
        for m in _NAMED.finditer(line):
            if m.group(2) in (tables if m.group(1) == b"table" else schemas):
                return True
        return False

    def keep(self, line: bytes) -> bytes | None:
        """The line with only the changes of our tables; None if no change is left."""
        if not self._needles:
            return line
        if not self.may_hold(line):
            return None
        return filter_line(line, self.tables, self.schemas)

    def keep_pieces(self, pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
        """`keep` of a line read in pieces, in pieces of at most `size` bytes; none if no change is left.

        The kept changes are joined as `filter_line` joins them; nothing is
        yielded before the first kept change is found.
        """
        scanner = LineScanner(pieces)
        head, _ = scanner.head()
        out = _Pieces(size)
        kept = False
        for text, change in scanner.changes():
            if self.wants(change):
                out.add(", " if kept else head)
                kept = True
                out.add(text)
                yield from out.full()
        tail = scanner.tail()
        if kept:
            out.add(tail)
            yield from out.rest()


class Reshaped:
    """A table filter, then a conversion of each line it keeps (a subscriber's `format`, e.g. Debezium's).

    `convert` takes a whole line; `per_change`, for a line read in pieces,
    takes the line's keys and gives what turns each kept change into its
    text (joined by newlines, as `convert` joins them).
    """

    __slots__ = ("convert", "filt", "per_change")

    def __init__(
        self, filt: TableFilter, convert: Callable[[bytes], bytes | None], per_change: ChangeConverter
    ) -> None:
        self.filt = filt
        self.convert = convert
        self.per_change = per_change

    def __bool__(self) -> bool:
        return True  # (every line is converted: none passes as it is)

    def matches(self, schema: str, table: str) -> bool:
        return self.filt.matches(schema, table)

    def keep(self, line: bytes) -> bytes | None:
        """The converted line; None if the filter or the conversion leaves nothing."""
        kept = self.filt.keep(line)
        return None if kept is None else self.convert(kept)

    def keep_pieces(self, pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
        """`keep` of a line read in pieces, in pieces of at most `size` bytes; none if nothing is left."""
        scanner = LineScanner(pieces)
        _, head = scanner.head()
        convert = self.per_change(head)
        wants = self.filt.wants
        out = _Pieces(size)
        kept = False
        for _, change in scanner.changes():
            if wants(change):
                if kept:
                    out.add("\n")
                kept = True
                out.add(convert(change))
                yield from out.full()
        scanner.tail()
        if kept:
            yield from out.rest()


class _Pieces:
    """Text put in, pieces of exactly `size` bytes (the last one shorter) taken out."""

    __slots__ = ("_buf", "_size")

    def __init__(self, size: int) -> None:
        self._buf = bytearray()
        self._size = max(1, size)

    def add(self, text: str) -> None:
        self._buf += text.encode("utf-8")

    def full(self) -> Iterator[bytes]:
        buf, size = self._buf, self._size
        while len(buf) >= size:
            piece = bytes(buf[:size])
            del buf[:size]  # (a bytearray drops its front without moving the rest)
            yield piece

    def rest(self) -> Iterator[bytes]:
        yield from self.full()
        if self._buf:
            yield bytes(self._buf)
            self._buf.clear()


# What a stream applies to each line: its table filter, converted or not.
LineFilter = TableFilter | Reshaped


def filter_line(
    line: bytes, tables: frozenset[tuple[str, str]], schemas: frozenset[str] = frozenset()
) -> bytes | None:
    """`line` with only the changes whose (schema, table) is in `tables` or schema in `schemas`; None if none is.

    A line without changes goes whole when it is an incremental snapshot's chunk of one of
    those tables (its marker may be the one that says the table is done), else not at all.

    The very line is returned when every change is kept.  ValueError when the
    line is not a transaction object with a `changes` array.
    """
    text = line.decode("utf-8")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not a transaction line: {e}") from None
    changes = obj.get("changes") if isinstance(obj, dict) else None
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        raise ValueError("not a transaction line: it has no changes array of objects")
    if not changes:  # (an incremental snapshot's chunk that kept no row: its marker may say a table is done)
        return line if _marks_kept_table(obj.get("snapshot"), tables, schemas) else None
    wanted = [(c.get("schema"), c.get("table")) in tables or c.get("schema") in schemas for c in changes]
    if not any(wanted):
        return None
    if all(wanted):
        return line
    found = _canonical_spans(text, obj) or _changes(text)
    open_at, close_at, spans = found
    body = ", ".join(text[start:end] for (start, end, _, _), keep in zip(spans, wanted, strict=True) if keep)
    return (text[: open_at + 1] + body + text[close_at:]).encode("utf-8")


def _marks_kept_table(marker: object, tables: frozenset[tuple[str, str]], schemas: frozenset[str]) -> bool:
    """Whether `marker` is an incremental snapshot chunk's of a kept table (docs/design.md section 7)."""
    if not isinstance(marker, dict) or "incremental" not in marker:
        return False
    schema = marker.get("schema")
    return (schema, marker.get("table")) in tables or schema in schemas


Spans = tuple[int, int, list[tuple[int, int, object, object]]]


def _canonical_spans(text: str, obj: dict[str, object]) -> Spans | None:
    """The spans of the changes when the line is exactly what json.dumps writes (csnd's own lines).

    Each piece is re-encoded only to be compared with the text (C speed); a
    line written any other way (spacing, a number written `1.50`) gets None,
    and the slower walk over the text itself.
    """
    keys = list(obj)
    if not keys or keys[-1] != "changes" or len(keys) < 2:
        return None
    changes = obj["changes"]
    assert isinstance(changes, list)
    head = _encode({k: obj[k] for k in keys[:-1]})[:-1] + ', "changes": ['
    if not text.startswith(head):
        return None
    pos = len(head)
    spans: list[tuple[int, int, object, object]] = []
    for i, change in enumerate(changes):
        if i:
            if not text.startswith(", ", pos):
                return None
            pos += 2
        piece = _encode(change)
        if not text.startswith(piece, pos):
            return None
        spans.append((pos, pos + len(piece), None, None))
        pos += len(piece)
    if text[pos:] != "]}":
        return None
    return len(head) - 1, pos, spans


def _changes(text: str) -> Spans:
    """Where the `changes` array opens and closes, and each change's span, schema and table.

    Walks the top-level object with the json module's own scanner, so every
    value (strings with brackets or quotes in them included) is skipped exactly.
    """

    def space(text: str, i: int) -> int:
        while i < len(text) and text[i] in " \t\n\r":
            i += 1
        return i

    try:
        i = space(text, 0)
        if text[i] != "{":
            raise ValueError("not a JSON object")
        i = space(text, i + 1)
        found: Spans | None = None
        while text[i] != "}":
            key, i = _scan(text, i)
            i = space(text, i)
            if text[i] != ":":
                raise ValueError(f"no ':' at offset {i}")
            i = space(text, i + 1)
            if key == "changes" and text[i] == "[":
                open_at = i
                spans: list[tuple[int, int, object, object]] = []
                i = space(text, i + 1)
                while text[i] != "]":
                    change, end = _scan(text, i)
                    if not isinstance(change, dict):
                        raise ValueError(f"a change at offset {i} is not an object")
                    spans.append((i, end, change.get("schema"), change.get("table")))
                    i = space(text, end)
                    if text[i] == ",":
                        i = space(text, i + 1)
                found = (open_at, i, spans)
                i += 1
            else:
                _, i = _scan(text, i)
            i = space(text, i)
            if text[i] == ",":
                i = space(text, i + 1)
    except (IndexError, json.JSONDecodeError) as e:
        raise ValueError(f"not a transaction line: {e}") from None
    if found is None:
        raise ValueError("not a transaction line: it has no changes array")
    return found
