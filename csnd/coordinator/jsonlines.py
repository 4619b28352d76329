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

from typing import TYPE_CHECKING

from csnd.coordinator.batch import change_body
from csnd.core.lines import JSON_TAIL, changes_text, line_head, node_entry, node_key

if TYPE_CHECKING:
    from csnd.coordinator.globaltxn import GlobalTxn, NodeCommit

__all__ = ["JSON_TAIL", "json_changes", "json_head", "json_line", "relation_line"]


def json_head(csn: int, gid: str | None, commit_time: int, nodes: dict[str, NodeCommit]) -> str:
    """A transaction line up to and including `"changes": [`."""
    if len(nodes) == 1:  # (a single node's every line: a generator and a join for one entry cost 1.7 us)
        ((name, c),) = nodes.items()
        listed = node_entry(name, c.xid, c.commit_lsn)
    else:
        listed = ", ".join(node_entry(name, c.xid, c.commit_lsn) for name, c in nodes.items())
    return line_head(csn, gid, commit_time, listed)


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
    if len(chunk) == 1:
        return changes_text(node, chunk[0][0], [chunk[0][2]], first)
    return changes_text(node, chunk[0][0], list(map(change_body, chunk)), first)


def relation_line(csn: int, node: str, body: str) -> str:
    """A relation line of docs/design.md section 7 (no newline): `body` is `decoder.schema.relation_body`'s text.

    `{"relation": {"csn": .., "node": .., "schema": .., "table": .., ...}}`: the
    version of a node's table in force from the transaction at `csn` on.
    """
    return f'{{"relation": {{"csn": {csn}, "node": {node_key(node)}, {body}}}}}'


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
