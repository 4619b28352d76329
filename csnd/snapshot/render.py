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

Pure: tuples and a RelationCache in, text out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from csnd.coordinator.jsonlines import json_changes
from csnd.core.ids import Lsn
from csnd.core.lines import node_key
from csnd.snapshot.lines import read_body

if TYPE_CHECKING:
    from csnd.decoder.rows import RelationCache

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
            head = table.heads["I"].replace(_INSERT_OP, _READ_OP, 1)
            prefix = (
                f'{{"node": {node_key(node)}, "cid": 0, "lsn": "{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}", '
                f'{head}null, "new": '
            )
            return prefix + ("}, " + prefix).join(rows) + "}"
    return json_changes(node, [(0, lsn, b) for b in stream_bodies(relid, tuples, lsn, cache, binary)], True)


def stream_bodies(relid: int, tuples: list[bytes], lsn: int, cache: RelationCache, binary: bool) -> list[str]:
    """Each row's body as the stream's decoder renders an Insert, made a read (the checked path)."""
    from csnd.decoder.rows import row_change_body

    at = Lsn(lsn)
    return [read_body(row_change_body("I", None, relid, t, at, cache, binary)) for t in tuples]
