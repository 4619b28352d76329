"""A transaction JSON line (docs/design.md section 7) parsed into its head and its changes, `old` and `new` as text.

`RowBuilder` decodes the usual line with msgspec in one pass; a line that
does not fit its types comes here.  `parse_as_written` takes a line as
csnd's writer writes it (json.dumps' separators, section 7's key order):
one C parse of the whole line, and the text of each change's `old` and
`new` found with str.find alone.  `parse_any` walks any valid line with the
json module's C scanner (`raw_decode`), slicing `old` and `new` out as the
line holds them, byte for byte (re-dumping could change a float's text,
which other tools compare).  Both return (head fields, changes); a change
holds `old` and `new` as their JSON text (None for null).

Pure: no I/O.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["parse_any", "parse_as_written"]

_scan: Final = json.JSONDecoder().raw_decode
_loads: Final = json.loads
_WS: Final = " \t\n\r"
# A change's keys in the writer's order (docs/design.md section 7), and in its
# first revision's (no `key`), which a changelog written then still holds.
_KEYS: Final = ("node", "cid", "lsn", "op", "schema", "table", "key", "old", "new")
_KEYS_V1: Final = ("node", "cid", "lsn", "op", "schema", "table", "old", "new")
_AS_WRITTEN: Final = frozenset((_KEYS, (*_KEYS, "unchanged"), _KEYS_V1, (*_KEYS_V1, "unchanged")))
_RAW_KEYS: Final = frozenset(("old", "new"))  # (kept as text; every other field is parsed)
_CHANGE_SEP: Final = '}, {"node": "'  # between two changes, as the writer separates them


def parse_as_written(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`parse_any` for lines as the writer writes them (json.dumps' separators, section 7's key order).

    One C parse of the whole line gives every value; the text of each
    change, and in it of `old` and `new`, is then found with str.find alone:

    * Changes: the writer puts `}, {"node": "` between two changes, so the
      line holds that text at least len(changes) - 1 times; more only when
      a value holds it too (a jsonb array of objects keyed "node").  Exactly
      that many: the occurrences are the boundaries.
    * `"old": `: the first after a change's start is its key (the fields
      before it are strings, numbers and `key`'s array of strings, in which
      a quote is escaped).
    * `, "new": ` ends `old`; a row with a column named "new" holds it
      twice, which is checked.  `new` runs to the change's end, or to
      `, "unchanged": [` (found from the end: column names are strings).

    Any line in another shape raises, and `parse_any` takes it.
    """
    obj = _loads(text)
    changes: list[dict[str, Any]] = obj.pop("changes")
    i = text.index('"changes": [') + 12
    n = len(changes)
    if not n:
        if len(text) != i + 2 or not text.endswith("]}"):
            raise ValueError("end of line")
        return obj, changes
    last = len(text) - 2
    if (
        not text.startswith('{"node": "', i)
        or not text.endswith("}]}")
        or text.count(_CHANGE_SEP, i) != n - 1
    ):
        raise ValueError("changes not as written")
    find = text.find
    start = i
    for k, ch in enumerate(changes):
        keys = tuple(ch)
        if keys not in _AS_WRITTEN:
            raise ValueError("not a change as written")
        end = last if k == n - 1 else find(_CHANGE_SEP, start) + 1  # (just after the change's "}")
        o = find('"old": ', start, end) + 7
        if o < 7:
            raise ValueError("no old")
        if ch["old"] is None:
            if not text.startswith('null, "new": ', o):
                raise ValueError("old")
            v = o + 13
        else:
            q = find(', "new": ', o, end)
            if q < 0 or find(', "new": ', q + 1, end) >= 0:
                raise ValueError("new, or a column named new")
            ch["old"] = text[o:q]
            v = q + 9
        stop = end - 1
        if keys[-1] == "unchanged":
            stop = text.rfind(', "unchanged": [', v, stop)
            if stop < 0:
                raise ValueError("unchanged")
        if ch["new"] is None:
            if stop - v != 4 or not text.startswith("null", v):
                raise ValueError("new")
        else:
            ch["new"] = text[v:stop]
        start = end + 2
    return obj, changes


def _space(text: str, i: int) -> int:
    while text[i] in _WS:
        i += 1
    return i


def parse_any(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The line's top-level fields (changes left out) and its changes, `old`/`new` as raw text."""
    i = _space(text, 0)
    if text[i] != "{":
        raise ValueError("not a JSON object")
    head: dict[str, Any] = {}
    changes: list[dict[str, Any]] | None = None
    i = _space(text, i + 1)
    while text[i] != "}":
        key, i = _scan(text, i)
        i = _space(text, i)
        if text[i] != ":":
            raise ValueError(f"no ':' after key {key!r}")
        i = _space(text, i + 1)
        if key == "changes":
            changes, i = _changes(text, i)
        else:
            head[key], i = _scan(text, i)
        i = _space(text, i)
        if text[i] == ",":
            i = _space(text, i + 1)
        elif text[i] != "}":
            raise ValueError(f"unexpected {text[i]!r} at offset {i}")
    if changes is None:
        raise ValueError("no changes array")
    return head, changes


def _changes(text: str, i: int) -> tuple[list[dict[str, Any]], int]:
    """The change objects of the array at `i`, each with `old` and `new` as their JSON text."""
    if text[i] != "[":
        raise ValueError(f"changes at offset {i} is not an array")
    out: list[dict[str, Any]] = []
    scan, raw_keys = _scan, _RAW_KEYS
    i = _space(text, i + 1)
    while text[i] != "]":
        if text[i] != "{":
            raise ValueError(f"change {len(out)} at offset {i} is not an object")
        ch: dict[str, Any] = {}
        i = i + 1
        if text[i] in _WS:
            i = _space(text, i)
        while text[i] != "}":
            key, i = scan(text, i)
            if text.startswith(": ", i):  # (the writer's separator: skip the general path)
                i += 2
            else:
                i = _space(text, i)
                if text[i] != ":":
                    raise ValueError(f"no ':' after key {key!r} in change {len(out)}")
                i = _space(text, i + 1)
            start = i
            value, i = scan(text, i)
            ch[key] = (None if value is None else text[start:i]) if key in raw_keys else value
            if text.startswith(", ", i):
                i += 2
                continue
            i = _space(text, i)
            if text[i] == ",":
                i = _space(text, i + 1)
            elif text[i] != "}":
                raise ValueError(f"unexpected {text[i]!r} at offset {i} in change {len(out)}")
        out.append(ch)
        i = _space(text, i + 1)
        if text[i] == ",":
            i = _space(text, i + 1)
        elif text[i] != "]":
            raise ValueError(f"unexpected {text[i]!r} at offset {i} after change {len(out) - 1}")
    return out, i + 1
