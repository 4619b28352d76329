"""The transaction JSON line of docs/design.md section 7, written without re-serialising values.

Other tools read and write this format byte for byte (the generator's
`expected.jsonl`, `csnd replay` output, the changelog), so it must be exactly
what `json.dumps(obj, ensure_ascii=False)` writes for the equivalent object:
separators `", "` and `": "`, non-ASCII kept as is.  The values of a change
were already serialised by a decoder worker (`DecodedChange.body`, the text
after `"cid": N, `, LSN included); here we only wrap each body in
`{"node": .., "cid": .., <body>}` -- re-parsing and re-dumping the bodies
would repeat the CPU-heavy step the decoder pool exists to parallelise.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import TYPE_CHECKING, Final

from csnd.coordinator.batch import change_body
from csnd.core.ids import lsn_to_str, pg_time_to_iso

if TYPE_CHECKING:
    from csnd.coordinator.globaltxn import GlobalTxn, NodeCommit


_encode: Final = json.JSONEncoder(ensure_ascii=False).encode


def _dumps(value: str | None) -> str:
    return "null" if value is None else _encode(value)


@lru_cache(maxsize=1024)
def _node_key(name: str) -> str:
    """A node name as a JSON string: a cluster has a handful, written once per transaction each."""
    return _dumps(name)


def _node_entry(name: str, c: NodeCommit) -> str:
    return f'{_node_key(name)}: {{"xid": {c.xid}, "commit_lsn": "{lsn_to_str(c.commit_lsn)}"}}'


def json_head(csn: int, gid: str | None, commit_time: int, nodes: dict[str, NodeCommit]) -> str:
    """A transaction line up to and including `"changes": [`."""
    if len(nodes) == 1:  # (a single node's every line: a generator and a join for one entry cost 1.7 us)
        ((name, c),) = nodes.items()
        listed = _node_entry(name, c)
    else:
        listed = ", ".join(_node_entry(name, c) for name, c in nodes.items())
    return (
        f'{{"csn": {csn}, "gid": {_dumps(gid)}, "commit_time": "{pg_time_to_iso(commit_time)}", '
        f'"nodes": {{{listed}}}, "changes": ['
    )


def json_changes(node: str, chunk: list[tuple[int, int, str]], first: bool) -> str:
    """The change objects of one merge batch, comma-separated (and comma-led unless `first`).

    A chunk holds one cid -- `CsnMerge.add_batch` checks a merge batch; a
    single node's transaction written without the merge is one cid at both
    ends (`csnd.runtime.items.whole_list`), and its sender never lets cids
    decrease -- so this is one C-level join of the bodies: it runs in the
    coordinator's single thread, once per change of the whole cluster.
    """
    if not chunk:
        return ""
    head = f'{{"node": {_node_key(node)}, "cid": {chunk[0][0]}, '
    if len(chunk) == 1:  # (one-row transactions: one format beats the list below)
        return f"{head}{chunk[0][2]}}}" if first else f", {head}{chunk[0][2]}}}"
    bodies = list(map(change_body, chunk))
    # The head and the closing brace go onto the first and last bodies, so the
    # text (a transaction's worth of bodies) is copied once, by the join.
    bodies[0] = head + bodies[0] if first else ", " + head + bodies[0]
    bodies[-1] += "}"
    return f"}}, {head}".join(bodies)


JSON_TAIL: Final = "]}"


def relation_line(csn: int, node: str, body: str) -> str:
    """A relation line of docs/design.md section 7 (no newline): `body` is `decoder.schema.relation_body`'s text.

    `{"relation": {"csn": .., "node": .., "schema": .., "table": .., ...}}`: the
    version of a node's table in force from the transaction at `csn` on.
    """
    return f'{{"relation": {{"csn": {csn}, "node": {_node_key(node)}, {body}}}}}'


def json_line(txn: GlobalTxn) -> str:
    """`{"csn": .., "gid": .., "commit_time": .., "nodes": {..}, "changes": [..]}` (no newline)."""
    out = [json_head(txn.csn, txn.gid, txn.commit_time, txn.nodes)]
    first = True
    for node, chunk in txn.parts:
        if chunk:
            out.append(json_changes(node, chunk, first))
            first = False
    out.append(JSON_TAIL)
    return "".join(out)
