"""An independent, test-only reading of a generated node stream.

It follows the pgoutput rules the generator claims to mimic -- stream blocks,
Stream Abort of subtransactions and whole txns, Relation messages before use,
csn markers -- and reduces a node's stream to its committed transactions and
its marker timeline, so the tests can check causality and cross-check the
expected output against what was actually written.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from csnd.core.markers import PREFIX, parse_marker
from csnd.reader.events import iter_events
from csnd.reader.pgoutput import (
    Begin,
    Change,
    Commit,
    Keepalive,
    LogicalMessage,
    Relation,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
)
from csnd.reader.streamfile import StreamFileReader

_I16 = struct.Struct("!h")
_I32 = struct.Struct("!i")

Tuple = list[tuple[str, bytes | None]]  # (kind 'n' 'u' 't' 'b', raw)


def parse_tuple(buf: bytes, pos: int) -> tuple[Tuple, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    out: Tuple = []
    for _ in range(n):
        kind = chr(buf[pos])
        pos += 1
        if kind in "tb":
            (size,) = _I32.unpack_from(buf, pos)
            out.append((kind, buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        else:
            assert kind in "nu", kind
            out.append((kind, None))
    return out, pos


def split_change(ch: Change) -> tuple[str | None, Tuple | None, Tuple | None]:
    """(old kind, old tuple, new tuple) of an Insert/Update/Delete."""
    data = ch.data
    if ch.kind == "I":
        assert data[0:1] == b"N"
        new, end = parse_tuple(data, 1)
        assert end == len(data)
        return None, None, new
    old_kind = None
    old = None
    pos = 0
    if data[0:1] in (b"K", b"O"):
        old_kind = chr(data[0])
        old, pos = parse_tuple(data, 1)
    if ch.kind == "D":
        assert old is not None and pos == len(data)
        return old_kind, old, None
    assert data[pos : pos + 1] == b"N"
    new, end = parse_tuple(data, pos + 1)
    assert end == len(data)
    return old_kind, old, new


@dataclass
class SeenChange:
    lsn: int
    xid: int | None
    op: str
    table: str
    relation: Relation
    old_kind: str | None = None
    old: Tuple | None = None
    new: Tuple | None = None
    cid: int = 0


@dataclass
class NodeTxn:
    xid: int
    commit_lsn: int
    end_lsn: int
    commit_time: int
    streamed: bool
    gid: str | None = None
    csn: int | None = None
    cids: list[int] = field(default_factory=list)
    changes: list[SeenChange] = field(default_factory=list)


@dataclass
class NodeView:
    node: str
    binary: bool
    mode: str
    committed: list[NodeTxn] = field(default_factory=list)
    # (event index, kind, gid, value): committing / commit (at the Commit) / abort / tick
    timeline: list[tuple[int, str, str | None, int | None]] = field(default_factory=list)
    stream_aborts: list[tuple[int, int]] = field(default_factory=list)
    stream_blocks: int = 0
    keepalives: int = 0
    relations: list[Relation] = field(default_factory=list)
    begin_positions: list[tuple[int, int]] = field(default_factory=list)  # (frame lsn, first item lsn)


class _Open:
    def __init__(self, xid: int) -> None:
        self.xid = xid
        self.items: list[tuple[int, int | None, Any]] = []  # (lsn, xid, SeenChange | ('M', content))


def read_node(path: str) -> NodeView:
    with StreamFileReader(path) as f:
        header = f.header
        view = NodeView(header.node, header.binary, header.mode)
        rels: dict[int, Relation] = {}
        cur: _Open | None = None  # the non-streamed txn between Begin and Commit
        begin_lsn = 0
        streams: dict[int, _Open] = {}
        block: _Open | None = None
        for idx, (lsn, msg) in enumerate(iter_events(f, header.node, path)):
            if isinstance(msg, Keepalive):
                view.keepalives += 1
                continue
            if isinstance(msg, Relation):
                assert lsn == 0, "Relation frames are 0/0"
                rels[msg.relid] = msg
                view.relations.append(msg)
                continue
            target = block if block is not None else cur
            if isinstance(msg, LogicalMessage):
                assert msg.prefix == PREFIX
                assert msg.lsn == lsn
                if not msg.transactional:
                    assert target is None or block is None, "non-tx message inside a stream block"
                    m = parse_marker(msg.content)
                    view.timeline.append((idx, m.kind, m.gid, m.value))
                    continue
                assert target is not None, f"transactional message outside a txn at {lsn:X}"
                target.items.append((lsn, msg.xid, ("M", msg.content)))
            elif isinstance(msg, Change):
                assert target is not None
                rel = rels[msg.relid]
                old_kind, old, new = split_change(msg)
                op = {"I": "insert", "U": "update", "D": "delete"}[msg.kind]
                target.items.append(
                    (lsn, msg.xid, SeenChange(lsn, msg.xid, op, rel.name, rel, old_kind, old, new))
                )
            elif isinstance(msg, Truncate):
                assert target is not None
                for relid in msg.relids:
                    rel = rels[relid]
                    target.items.append((lsn, msg.xid, SeenChange(lsn, msg.xid, "truncate", rel.name, rel)))
            elif isinstance(msg, Begin):
                assert cur is None and block is None
                cur = _Open(msg.xid)
                begin_lsn = lsn
            elif isinstance(msg, Commit):
                assert cur is not None
                assert lsn == msg.end_lsn
                if cur.items:
                    view.begin_positions.append((begin_lsn, cur.items[0][0]))
                view.committed.append(
                    _finish(view, idx, cur, msg.commit_lsn, msg.end_lsn, msg.commit_time, False)
                )
                cur = None
            elif isinstance(msg, StreamStart):
                assert cur is None
                block = streams.get(msg.xid)
                assert (block is None) == msg.first_segment, "first_segment flag"
                if block is None:
                    block = streams[msg.xid] = _Open(msg.xid)
                view.stream_blocks += 1
            elif isinstance(msg, StreamStop):
                block = None
            elif isinstance(msg, StreamAbort):
                view.stream_aborts.append((msg.xid, msg.subxid))
                st = streams[msg.xid]
                if msg.subxid == msg.xid:
                    del streams[msg.xid]
                else:
                    st.items = [it for it in st.items if it[1] != msg.subxid]
            elif isinstance(msg, StreamCommit):
                st = streams.pop(msg.xid)
                assert lsn == msg.end_lsn
                view.committed.append(
                    _finish(view, idx, st, msg.commit_lsn, msg.end_lsn, msg.commit_time, True)
                )
            else:
                raise AssertionError(f"unexpected message {msg!r}")
        assert cur is None and block is None, "stream ends inside a txn"
        assert not streams, f"streamed txns never finished: {sorted(streams)}"
    return view


def _finish(
    view: NodeView, idx: int, txn: _Open, commit_lsn: int, end_lsn: int, t: int, streamed: bool
) -> NodeTxn:
    out = NodeTxn(txn.xid, commit_lsn, end_lsn, t, streamed)
    cid = 0
    for _lsn, _xid, item in txn.items:
        if isinstance(item, tuple):
            m = parse_marker(item[1])
            if m.kind == "commit":
                assert out.gid is None, "two commit markers"
                out.gid, out.csn = m.gid, m.value
            else:
                assert m.kind == "cid" and m.value is not None
                assert m.value > cid, "cid markers increase"
                cid = m.value
                out.cids.append(cid)
        else:
            item.cid = cid
            out.changes.append(item)
    view.timeline.append((idx, "commit", out.gid, out.csn))
    return out


def lsn_str(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"
