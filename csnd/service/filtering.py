"""Table filters: a subscriber's `schema.table` list applied to transaction lines.

The changelog holds each transaction as its DESIGN section 7 JSON line.  A
filtered subscriber gets the same line with only the changes of its tables:
csn, gid, commit_time and nodes stay as they are, and a transaction with no
change left is not sent at all.  The line is cut, not re-serialised: the head
(up to `"changes": [`), every kept change and the tail are copied byte for byte
from the stored line and the kept changes are joined with `", "`, exactly as
the writer (`csnd.coordinator.jsonlines`) joins them.  Re-dumping parsed values
could change them (a float4's shortest text, key order), and the format is one
other tools compare byte for byte.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Final

# A filter part: a plain name (no dot, no quote) or a "double-quoted" one in
# which "" stands for one quote -- so a table named `a.b` can be asked for.
_PART: Final = r'(?:[^."\s]+|"(?:[^"]|"")+")'
_FILTER: Final = re.compile(rf"({_PART})\.({_PART})")

_scan: Final = json.JSONDecoder().raw_decode
_encode: Final = json.JSONEncoder(ensure_ascii=False).encode


def _unquote(part: str) -> str:
    return part[1:-1].replace('""', '"') if part.startswith('"') else part


def parse_table(spec: str) -> tuple[str, str]:
    """`schema.table` -> (schema, table); ValueError with a message a person understands."""
    m = _FILTER.fullmatch(spec)
    if m is None:
        raise ValueError(
            f"table filter {spec!r} is not SCHEMA.TABLE (for example public.accounts; "
            'double-quote a name that holds a dot: public."a.b")'
        )
    return _unquote(m.group(1)), _unquote(m.group(2))


class TableFilter:
    """The tables one subscriber asked for; empty: every table (`keep` returns the line as is)."""

    __slots__ = ("tables", "_needles")

    def __init__(self, specs: Iterable[str] = ()) -> None:
        self.tables: frozenset[tuple[str, str]] = frozenset(parse_table(s) for s in specs)
        # A cheap first test: a line that holds none of these texts has no
        # change of ours (the writer encodes names exactly so); a line that
        # holds one is parsed to be sure.
        self._needles = tuple({f'"table": {_encode(t)}'.encode() for _, t in self.tables})

    def __bool__(self) -> bool:
        return bool(self.tables)

    def keep(self, line: bytes) -> bytes | None:
        """The line with only the changes of our tables; None if no change is left."""
        if not self.tables:
            return line
        if not any(n in line for n in self._needles):
            return None
        return filter_line(line, self.tables)


def filter_line(line: bytes, tables: frozenset[tuple[str, str]]) -> bytes | None:
    """`line` with only the changes whose (schema, table) is in `tables`; None if none is.

    The very line is returned when every change is kept.  ValueError when the
    line is not a transaction object with a `changes` array.
    """
    text = line.decode("utf-8")
    open_at, close_at, spans = _changes(text)
    kept = [(start, end) for start, end, schema, table in spans if (schema, table) in tables]
    if not kept:
        return None
    if len(kept) == len(spans):
        return line
    body = ", ".join(text[start:end] for start, end in kept)
    return (text[: open_at + 1] + body + text[close_at:]).encode("utf-8")


def _changes(text: str) -> tuple[int, int, list[tuple[int, int, object, object]]]:
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
        found: tuple[int, int, list[tuple[int, int, object, object]]] | None = None
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
