"""The pieces of the transaction JSON line (docs/design.md section 7) that two stages write.

The coordinator writes every line (`coordinator.jsonlines`); a decoder
worker writes the whole line of a single node's complete transaction when
the node is the only one (`decoder.worker`, `decoder.pool`), so the lone
node's lines skip the coordinator's per-transaction formatting.  Both build
them from these functions, so the two are the same text byte for byte:
exactly what `json.dumps(obj, ensure_ascii=False)` writes for the object.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Final

from csnd.core.ids import lsn_to_str, pg_time_to_iso

_encode: Final = json.JSONEncoder(ensure_ascii=False).encode

JSON_TAIL: Final = "]}"


def json_str(value: str | None) -> str:
    """A string (or null) as JSON."""
    return "null" if value is None else _encode(value)


@lru_cache(maxsize=1024)
def node_key(name: str) -> str:
    """A node name as a JSON string: a cluster has a handful, written once per transaction each."""
    return json_str(name)


def node_entry(name: str, xid: int, commit_lsn: int) -> str:
    """`"dn1": {"xid": .., "commit_lsn": ".."}`, one node's entry in "nodes"."""
    return f'{node_key(name)}: {{"xid": {xid}, "commit_lsn": "{lsn_to_str(commit_lsn)}"}}'


def line_head(csn: int, gid: str | None, commit_time: int, listed: str) -> str:
    """A transaction line up to and including `"changes": [`; `listed`: the nodes' entries, joined."""
    return (
        f'{{"csn": {csn}, "gid": {json_str(gid)}, "commit_time": "{pg_time_to_iso(commit_time)}", '
        f'"nodes": {{{listed}}}, "changes": ['
    )


def changes_text(node: str, cid: int, bodies: list[str], first: bool) -> str:
    """The change objects of `bodies` (one node, one cid), comma-separated (and comma-led unless `first`).

    One C-level join: the head and the closing brace go onto the first and
    last bodies, so a transaction's worth of text is copied once.  A list
    of more than one body is consumed: its two ends are changed in place.
    """
    if not bodies:
        return ""
    head = f'{{"node": {node_key(node)}, "cid": {cid}, '
    if len(bodies) == 1:  # (one-row transactions: one format beats the list below)
        return f"{head}{bodies[0]}}}" if first else f", {head}{bodies[0]}}}"
    bodies[0] = head + bodies[0] if first else ", " + head + bodies[0]
    bodies[-1] += "}"
    return f"}}, {head}".join(bodies)


def single_node_line(
    node: str,
    csn: int,
    gid: str | None,
    xid: int,
    commit_lsn: int,
    commit_time: int,
    cid: int,
    bodies: list[str],
) -> str:
    """The whole line of a transaction of one node whose changes share one cid."""
    return "".join(
        (
            line_head(csn, gid, commit_time, node_entry(node, xid, commit_lsn)),
            changes_text(node, cid, bodies, True),
            JSON_TAIL,
        )
    )


# `single_node_line` of one change with no gid and cid 0, its CSN the commit LSN: one format.
_ONE_CHANGE_LINE: Final = (
    '{"csn": %d, "gid": null, "commit_time": "%s", "nodes": {%s: {"xid": %d, "commit_lsn": "%X/%X"}}, '
    '"changes": [{"node": %s, "cid": 0, %s}]}'
)


def one_change_line(node: str, commit_lsn: int, xid: int, commit_time: int, body: str) -> str:
    """The line of a single-node-mode transaction of one change: `single_node_line`'s text in one format.

    A decoder worker writes one per one-row transaction; the three helpers'
    calls were a third of that (tests hold the two to the same text).
    """
    key = node_key(node)
    return _ONE_CHANGE_LINE % (
        commit_lsn,
        pg_time_to_iso(commit_time),
        key,
        xid,
        commit_lsn >> 32,
        commit_lsn & 0xFFFFFFFF,
        key,
        body,
    )
