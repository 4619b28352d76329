"""The transaction JSON line of DESIGN section 7, written without re-serialising values.

Other tools read and write this format byte for byte (the generator's
`expected.jsonl`, `csnd replay` output, the changelog), so it must be exactly
what `json.dumps(obj, ensure_ascii=False)` writes for the equivalent object:
separators `", "` and `": "`, non-ASCII kept as is.  The values of a change
were already serialised by a decoder worker (`DecodedChange.body`, the text
after `"lsn"`); here we only wrap each body in
`{"node": .., "cid": .., "lsn": .., <body>}` -- re-parsing and re-dumping the
bodies would repeat the CPU-heavy step the decoder pool exists to parallelise.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from csnd.ids import lsn_to_str, pg_time_to_iso

if TYPE_CHECKING:
    from coordinator.txn import GlobalTxn


def _dumps(value: str | None) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_line(txn: GlobalTxn) -> str:
    """`{"csn": .., "gid": .., "commit_time": .., "nodes": {..}, "changes": [..]}` (no newline)."""
    nodes = ", ".join(
        f'{_dumps(name)}: {{"xid": {c.xid}, "commit_lsn": "{lsn_to_str(c.commit_lsn)}"}}'
        for name, c in txn.nodes.items()
    )
    out: list[str] = []
    append = out.append
    to_lsn = lsn_to_str
    for node, chunk in txn.parts:
        prefix = f'{{"node": {_dumps(node)}, "cid": '
        for cid, lsn, body in chunk:
            append(f'{prefix}{cid}, "lsn": "{to_lsn(lsn)}", {body}}}')
    return (
        f'{{"csn": {txn.csn}, "gid": {_dumps(txn.gid)}, "commit_time": "{pg_time_to_iso(txn.commit_time)}", '
        f'"nodes": {{{nodes}}}, "changes": [{", ".join(out)}]}}'
    )
