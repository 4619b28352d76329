"""A chunk's rows -> the text of its change objects, as one join.

    Insert tuples (copyrows) ─► the table's row reader (decoder.rows, compiled) ─► row JSON
                               ─► prefix + ("}, " + prefix).join(rows) + "}"

Every row of a snapshot chunk has the same node, cid, LSN and table, so the
text before a row's values is the same for all of them: the chunk's change
objects are one prefix, the rows' JSON, and one join -- where the stream's
path (`decoder.rows.row_change_body`, `lines.read_body`,
`coordinator.jsonlines.json_changes`) formats, replaces in and re-joins
each row.  The text is the very same: a row the row reader gives up on (an
unchanged TOAST value cannot be in a snapshot, but a value its builders
refuse can) sends the whole chunk down that path, which also raises its
errors (an unreadable binary table, a bad value) as the stream does.

`binary_chunk_text` takes a binary COPY's whole data instead: where the
table's reader is the compiled one, `_copysplit.render_rows` splits the
rows and writes their text in one pass, in UTF-8, with the reader's own
value writers (no Python object a row); anywhere else it is
`BinaryCopyRows` then `chunk_changes`, its twin, the same bytes.

Pure: COPY data or tuples and a RelationCache in, text out.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from csnd.coordinator.jsonlines import json_changes
from csnd.core.compiled import compiled_module
from csnd.core.ids import Lsn
from csnd.core.lines import node_key
from csnd.snapshot.copyrows import HEADER_SIZE, BinaryCopyRows, binary_header_end
from csnd.snapshot.lines import read_body

if TYPE_CHECKING:
    from csnd.decoder.rows import RelationCache, Table

_copysplit = compiled_module("csnd.snapshot._copysplit")
_render_rows: Callable[..., tuple[bytes | None, int, int, int]] | None = (
    None if _copysplit is None else _copysplit.render_rows
)
_rows = compiled_module("csnd.decoder._rows")  # (render_rows writes what its read_row writes)

_INSERT_OP: Final = '"op": "insert"'
_READ_OP: Final = '"op": "read"'


def chunk_changes(
    node: str, lsn: int, relid: int, tuples: list[bytes], cache: RelationCache, binary: bool
) -> str:
    """The change objects (comma-separated, no brackets) of `tuples`, read rows of table `relid` at `lsn`.

    Equal to `json_changes(node, [(0, lsn, read_body(row_change_body("I", ...)))...], True)`.
    """
    if not tuples:
        return ""
    table = cache.table(relid)
    if not (binary and table.unreadable is not None):
        read_row = table.read_row
        rows: list[str] = []
        append = rows.append
        for data in tuples:
            end = len(data)
            row = read_row(data, 1, end)
            if row is None or row[1] != end:
                break
            append(row[0])
        else:
            prefix = _prefix(node, lsn, table)
            return prefix + ("}, " + prefix).join(rows) + "}"
    return json_changes(node, [(0, lsn, b) for b in stream_bodies(relid, tuples, lsn, cache, binary)], True)


def binary_chunk_text(
    node: str, lsn: int, relid: int, data: bytes, cache: RelationCache
) -> tuple[bytes, int]:
    """A binary COPY's whole data -> (its change objects' text in UTF-8, its row count).

    Equal to `chunk_changes(node, lsn, relid, rows, cache, True).encode()` of
    `BinaryCopyRows`' rows of `data`, whose `CopyFormatError` it raises too.
    """
    table = cache.table(relid)
    reader = _compiled_reader(table)
    if reader is not None and _render_rows is not None and len(data) >= HEADER_SIZE:
        start = binary_header_end(data)
        if start is not None:
            prefix = _prefix(node, lsn, table).encode("utf-8")
            text, rows, pos, state = _render_rows(*reader, data, start, len(data), prefix)
            if text is not None and state == 1 and pos == len(data):
                return text, rows
    # (the checked path: a value the reader gives up on, or data that is not whole, whose error it names)
    parser = BinaryCopyRows()
    tuples = parser.feed(data)
    parser.finish()
    return chunk_changes(node, lsn, relid, tuples, cache, True).encode("utf-8"), len(tuples)


def _compiled_reader(table: Table) -> tuple[bytes, tuple[bytes, ...], Any, tuple[Any, ...]] | None:
    """The compiled row reader's own arguments (codes, keys, quote, builders), when the table has it."""
    read_row = table.read_row
    if (
        _render_rows is None
        or _rows is None
        or table.unreadable is not None
        or not isinstance(read_row, partial)
        or read_row.func is not _rows.read_row
    ):
        return None
    codes, keys, quote, builders = read_row.args
    return codes, keys, quote, builders


def _prefix(node: str, lsn: int, table: Table) -> str:
    """The text of a read change object of `table` before its row: the same for every row of a chunk."""
    head = table.heads["I"].replace(_INSERT_OP, _READ_OP, 1)
    return f'{{"node": {node_key(node)}, "cid": 0, "lsn": "{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}", {head}null, "new": '


def stream_bodies(relid: int, tuples: list[bytes], lsn: int, cache: RelationCache, binary: bool) -> list[str]:
    """Each row's body as the stream's decoder renders an Insert, made a read (the checked path)."""
    from csnd.decoder.rows import row_change_body

    at = Lsn(lsn)
    return [read_body(row_change_body("I", None, relid, t, at, cache, binary)) for t in tuples]
