"""Transaction JSON lines (DESIGN section 7) flattened into Arrow columns: one row per change.

    (csn, line) ... ──► RowBuilder.add ──► column lists ──► RecordBatch (SCHEMA)

This runs on the executors, once per change of everything Spark reads, so
it walks each line once with the json module's C scanner (`raw_decode`)
instead of parsing it whole and re-serialising `old` and `new`: those two
columns are the JSON text of the objects *as the line holds them*, byte for
byte (re-dumping could change a float's text, which other tools compare),
and slicing them out costs nothing beyond the scan that parsing needs anyway.

The row schema is the documented contract of the Spark source (DESIGN
section 8): `seq` is the change's position in the line it came in (with a
`tables` filter, among the changes kept), `xid` the transaction's xid on the
change's node (from the line's `nodes` map), `unchanged` the columns left out
of `new` as unchanged TOAST values (an empty array when there are none).

Pure: no I/O.  A line that is not a transaction object is a ValueError
naming the csn and what is wrong (the caller adds where it came from).
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Iterable
from typing import Any, Final

import pyarrow as pa

# The Spark schema, as DDL (DataSource.schema) and as Arrow (what `read` yields).
SCHEMA_DDL: Final = (
    "csn long, gid string, commit_time timestamp, seq int, node string, xid long, cid int, "
    "lsn string, op string, schema string, table string, old string, new string, unchanged array<string>"
)
ARROW_SCHEMA: Final = pa.schema(
    [
        ("csn", pa.int64()),
        ("gid", pa.string()),
        # Spark hands Python data sources timestamps as microseconds in UTC.
        ("commit_time", pa.timestamp("us", tz="UTC")),
        ("seq", pa.int32()),
        ("node", pa.string()),
        ("xid", pa.int64()),
        ("cid", pa.int32()),
        ("lsn", pa.string()),
        ("op", pa.string()),
        ("schema", pa.string()),
        ("table", pa.string()),
        ("old", pa.string()),
        ("new", pa.string()),
        ("unchanged", pa.list_(pa.string())),
    ]
)
COLUMNS: Final = tuple(ARROW_SCHEMA.names)

_scan: Final = json.JSONDecoder().raw_decode
_loads: Final = json.loads
# The C scanner without raw_decode's wrapper: (value, end) at an index, StopIteration if none.
_scan_once: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_WS: Final = " \t\n\r"
# A change's keys in the writer's order (DESIGN section 7).
_KEYS: Final = ("node", "cid", "lsn", "op", "schema", "table", "old", "new")
_KEYS_UNCHANGED: Final = (*_KEYS, "unchanged")
_RAW_KEYS: Final = frozenset(("old", "new"))  # (kept as text; every other field is parsed)


class RowBuilder:
    """Collects the rows of whole transactions; `take()` returns them as one RecordBatch.

    `rows` is how many rows are waiting, so a reader can cut batches near a
    size it likes -- always between transactions, never inside one.
    """

    __slots__ = ("_cols", "rows")

    def __init__(self) -> None:
        self._cols: list[list[Any]] = [[] for _ in COLUMNS]
        self.rows = 0

    def add(self, csn: int, line: bytes | str) -> None:
        """Appends one row per change of the transaction `line` (whose csn is `csn`)."""
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        try:
            head, changes = _fast(text)
        except (ValueError, IndexError, TypeError, KeyError, StopIteration, AttributeError):
            head = {}
        try:
            if not head:
                head, changes = _walk(text)
        except (ValueError, IndexError, TypeError) as e:
            raise ValueError(f"csn {csn}: not a transaction line: {e}") from None
        line_csn = head.get("csn")
        if line_csn != csn:
            raise ValueError(f"csn {csn}: the line says csn {line_csn!r}")
        nodes = head.get("nodes")
        if not isinstance(nodes, dict):
            raise ValueError(f"csn {csn}: the line has no nodes map")
        gid = head.get("gid")
        commit_time = head.get("commit_time")
        n = len(changes)
        if not n:
            return
        names = [ch.get("node") for ch in changes]
        try:
            xids = [nodes[name]["xid"] for name in names]
        except (KeyError, TypeError):
            bad = next(name for name in names if not isinstance(nodes.get(name), dict))
            raise ValueError(
                f"csn {csn}: change {names.index(bad)} is from node {bad!r}, which the nodes map does not list"
            ) from None
        # Column by column: a comprehension per column costs less than a
        # Python loop appending to fourteen lists per change.
        (
            c_csn,
            c_gid,
            c_time,
            c_seq,
            c_node,
            c_xid,
            c_cid,
            c_lsn,
            c_op,
            c_schema,
            c_table,
            c_old,
            c_new,
            c_unch,
        ) = self._cols
        c_csn.extend([csn] * n)
        c_gid.extend([gid] * n)
        c_time.extend([commit_time] * n)
        c_seq.extend(range(n))
        c_node.extend(names)
        c_xid.extend(xids)
        c_cid.extend([ch.get("cid") for ch in changes])
        c_lsn.extend([ch.get("lsn") for ch in changes])
        c_op.extend([ch.get("op") for ch in changes])
        c_schema.extend([ch.get("schema") for ch in changes])
        c_table.extend([ch.get("table") for ch in changes])
        c_old.extend([ch.get("old") for ch in changes])
        c_new.extend([ch.get("new") for ch in changes])
        c_unch.extend([ch.get("unchanged") or [] for ch in changes])
        self.rows += len(changes)

    def take(self) -> pa.RecordBatch:
        """The rows collected so far as one RecordBatch of ARROW_SCHEMA; the builder starts empty."""
        cols = self._cols
        self._cols = [[] for _ in COLUMNS]
        self.rows = 0
        arrays = []
        for name, values in zip(COLUMNS, cols, strict=True):
            field = ARROW_SCHEMA.field(name)
            if name == "commit_time":
                # Arrow parses ISO 8601 with an offset in C; the text is per
                # transaction, so most rows repeat their neighbour's.
                arrays.append(pa.array(values, pa.string()).cast(field.type))
            else:
                arrays.append(pa.array(values, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def flatten(records: Iterable[tuple[int, bytes | str]]) -> pa.RecordBatch:
    """All rows of `records` ((csn, line) pairs) as one RecordBatch."""
    b = RowBuilder()
    for csn, line in records:
        b.add(csn, line)
    return b.take()


def _fast(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`_walk` for lines as the writer writes them (json.dumps' separators, section 7's key order).

    One C parse of the whole line gives every value; `old` and `new` are then
    found by position -- in a change, the text `"old": ` can only be that key,
    since the fields before it are strings, in which a quote is escaped -- and
    their ends by scanning just them.  Every structural character on the way
    is checked, so a line in any other shape raises and `_walk` takes it.
    """
    obj = _loads(text)
    changes: list[dict[str, Any]] = obj.pop("changes")
    i = text.index('"changes": [') + 12
    scan, find, starts = _scan_once, text.find, text.startswith
    for ch in changes:
        keys = tuple(ch)
        if text[i] != "{" or (keys != _KEYS and keys != _KEYS_UNCHANGED):
            raise ValueError("not a change as written")
        i = find('"old": ', i)
        if i < 0:
            raise ValueError("no old")
        i += 7
        if ch["old"] is None:
            if not starts("null", i):
                raise ValueError("old")
            i += 4
        else:
            start = i
            _, i = scan(text, i)
            ch["old"] = text[start:i]
        if not starts(', "new": ', i):
            raise ValueError("new")
        i += 9
        if ch["new"] is None:
            if not starts("null", i):
                raise ValueError("new")
            i += 4
        else:
            start = i
            _, i = scan(text, i)
            ch["new"] = text[start:i]
        if text[i] == ",":
            if not starts(', "unchanged": ', i) or len(keys) != 9:
                raise ValueError("unchanged")
            _, i = scan(text, i + 15)
        if text[i] != "}":
            raise ValueError("end of change")
        i += 1
        if starts(", ", i):
            i += 2
    if not starts("]}", i) or len(text) != i + 2:
        raise ValueError("end of line")
    return obj, changes


def _space(text: str, i: int) -> int:
    while text[i] in _WS:
        i += 1
    return i


def _walk(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
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
