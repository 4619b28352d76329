"""Independent witnesses for reader tests.

`test_decoding_txns` reads a `test_decoding` slot created beside ours and
`assemble` rebuilds the same shape from our recorded pgoutput events, with the
raw text columns of text-mode tuple data, so the two can be compared
transaction by transaction without going through csnd's decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from csnd.reader import pgoutput as p

UNCHANGED = "<unchanged-toast>"


@dataclass
class WTxn:
    xid: int
    end_lsn: int | None  # None: a message-only transaction test_decoding shows without COMMIT
    changes: list[tuple[Any, ...]] = field(default_factory=list)


def _parse_columns(text: str) -> dict[str, Any]:
    """`id[integer]:1 s[text]:'it''s'` -> {"id": "1", "s": "it's"}."""
    cols: dict[str, Any] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] == " ":
            i += 1
        if i >= n:
            break
        lb = text.index("[", i)
        name = text[i:lb]
        close = text.index("]:", lb)
        i = close + 2
        if text.startswith("'", i):
            j, buf = i + 1, []
            while True:
                q = text.index("'", j)
                buf.append(text[j:q])
                if text.startswith("''", q):
                    buf.append("'")
                    j = q + 2
                else:
                    i = q + 1
                    break
            cols[name] = "".join(buf)
        else:
            j = text.find(" ", i)
            j = n if j < 0 else j
            raw = text[i:j]
            cols[name] = None if raw == "null" else UNCHANGED if raw == "unchanged-toast-datum" else raw
            i = j
    return cols


def test_decoding_txns(rows: list[tuple[str, int, str]]) -> tuple[list[WTxn], list[tuple[str, str]]]:
    """Rows of pg_logical_slot_get_changes(include-xids) -> committed txns, non-transactional messages."""
    from csnd.core.ids import lsn_from_str

    txns: list[WTxn] = []
    nontx: list[tuple[str, str]] = []
    cur: WTxn | None = None
    # test_decoding sends BEGIN lazily, at the first change: a transactional
    # message before it is printed outside BEGIN/COMMIT, and a transaction with
    # only messages gets no BEGIN/COMMIT at all.  Attach them by xid.
    early: dict[int, WTxn] = {}
    for lsn_text, xid, data in rows:
        lsn = lsn_from_str(lsn_text)
        if data.startswith("BEGIN"):
            pending = early.pop(int(xid), None)
            if pending is not None:
                txns.remove(pending)
            cur = WTxn(int(xid), 0, pending.changes if pending else [])
        elif data.startswith("COMMIT"):
            assert cur is not None
            cur.end_lsn = lsn
            txns.append(cur)
            cur = None
        elif data.startswith("message:"):
            # message: transactional: 1 prefix: p, sz: 3 content:abc
            tx = data.split("transactional: ", 1)[1][0] == "1"
            prefix = data.split("prefix: ", 1)[1].split(", sz:", 1)[0]
            content = data.split(" content:", 1)[1]
            if tx and cur is not None:
                cur.changes.append((lsn, "message", prefix, content))
            elif tx:
                if int(xid) not in early:
                    early[int(xid)] = WTxn(int(xid), None)
                    txns.append(early[int(xid)])
                early[int(xid)].changes.append((lsn, "message", prefix, content))
            else:
                nontx.append((prefix, content))
        elif data.startswith("table "):
            head, rest = data[6:].split(": ", 1)
            op, _, cols = rest.partition(":")
            op = op.lower()
            assert cur is not None
            if op == "truncate":
                for t in head.split(", "):
                    cur.changes.append((lsn, "truncate", t))
                continue
            cols = cols.strip()
            old: dict[str, Any] | None = None
            new: dict[str, Any] | None = None
            if op == "update":
                if cols.startswith("old-key:"):
                    o, _, nw = cols[len("old-key:") :].partition(" new-tuple:")
                    old = _parse_columns(o)
                    new = _parse_columns(nw)
                else:
                    new = _parse_columns(cols)
            elif op == "insert":
                new = _parse_columns(cols)
            elif op == "delete":
                old = None if cols.startswith("(no-tuple-data)") else _parse_columns(cols)
            cur.changes.append((lsn, op, head, old, new))
    return txns, nontx


_OPS = {"I": "insert", "U": "update", "D": "delete"}


def _split_tuple(buf: bytes, pos: int, names: list[str]) -> tuple[dict[str, Any], int]:
    n = int.from_bytes(buf[pos : pos + 2], "big", signed=True)
    pos += 2
    out: dict[str, Any] = {}
    for i in range(n):
        kind = buf[pos : pos + 1]
        pos += 1
        if kind == b"n":
            val: Any = None
        elif kind == b"u":
            val = UNCHANGED
        else:
            ln = int.from_bytes(buf[pos : pos + 4], "big")
            raw = buf[pos + 4 : pos + 4 + ln]
            pos += 4 + ln
            val = raw.decode() if kind == b"t" else raw
        out[names[i]] = val
    return out, pos


def _change_row(lsn: int, m: p.Change, rel: p.Relation) -> tuple[Any, ...]:
    names = [c.name for c in rel.columns]
    data = m.data
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    pos = 0
    if m.kind in "UD" and data[0:1] in (b"K", b"O"):
        old, pos = _split_tuple(data, 1, names)
        old = {k: v for k, v in old.items() if v is not None}  # test_decoding skips NULLs in old
    if m.kind in "IU":
        assert data[pos : pos + 1] == b"N"
        new, pos = _split_tuple(data, pos + 1, names)
    assert pos == len(data), "tuple data has trailing bytes"
    return (lsn, _OPS[m.kind], f"{rel.namespace}.{rel.name}", old, new)


def assemble(events: list[tuple[int, Any]]) -> tuple[list[WTxn], list[tuple[str, str]]]:
    """Our pgoutput events -> committed txns in the witness's shape (a reference, not csnd's sender)."""
    rels: dict[int, p.Relation] = {}
    txns: list[WTxn] = []
    nontx: list[tuple[str, str]] = []
    cur: WTxn | None = None
    streams: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
    block: int | None = None
    for lsn, m in events:
        if isinstance(m, p.Relation):
            rels[m.relid] = m
        elif isinstance(m, p.Begin):
            cur = WTxn(m.xid, 0)
        elif isinstance(m, p.Commit):
            assert cur is not None
            cur.end_lsn = m.end_lsn
            txns.append(cur)
            cur = None
        elif isinstance(m, p.StreamStart):
            block = m.xid
            streams.setdefault(m.xid, [])
        elif isinstance(m, p.StreamStop):
            block = None
        elif isinstance(m, p.StreamAbort):
            if m.subxid == m.xid:
                streams.pop(m.xid, None)
            else:
                streams[m.xid] = [c for c in streams.get(m.xid, []) if c[0] != m.subxid]
        elif isinstance(m, p.StreamCommit):
            t = WTxn(m.xid, m.end_lsn, [c for _, c in streams.pop(m.xid, [])])
            txns.append(t)
        elif isinstance(m, (p.Change, p.Truncate, p.LogicalMessage)):
            rows: list[tuple[Any, ...]]
            if isinstance(m, p.Change):
                rows = [_change_row(lsn, m, rels[m.relid])]
            elif isinstance(m, p.Truncate):
                rows = [(lsn, "truncate", f"{rels[r].namespace}.{rels[r].name}") for r in m.relids]
            else:
                if not m.transactional:
                    nontx.append((m.prefix, m.content.decode()))
                    continue
                rows = [(m.lsn, "message", m.prefix, m.content.decode())]
            if block is not None:
                streams[block].extend((m.xid or block, r) for r in rows)
            else:
                assert cur is not None, f"change outside a transaction at {lsn}"
                cur.changes.extend(rows)
    assert block is None and cur is None and not streams, "stream ended inside a transaction"
    return txns, nontx
