"""What the nodes committed, read independently of csnd, and the invariants checked against it.

The invariants are those of docs/design.md section 6.

The witness is a `test_decoding` slot per node, created beside csnd's slot
before the writers start, so it sees the same WAL; tests.fixtures.witness
reads it.  Each committed local transaction becomes its xid, the end LSN of
its commit record (what a slot confirmation is compared with), its gid and
CSN (from the `commit` marker) and its row changes with every value:
integers as numbers, text as strings, SQL NULL as None, an unchanged TOAST
value as a name in `unchanged`.  Transactions of one gid on several nodes
are joined into one, as the merge must join them.

`check` compares the lines consumers received with it and returns every
problem found (not only the first), with the counts the suite's table shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import psycopg

from csnd.core.ids import lsn_from_str
from tests.fixtures.witness import Row, consume, transactions, typed_values

TABLES = ("fx_acct", "fx_ledger", "fx_full", "fx_poison")
# test_decoding leaves NULL columns out of an old tuple; with REPLICA IDENTITY
# FULL the old row has every column, so the missing ones are put back as None.
FULL_COLUMNS = {"fx_full": ("id", "v")}


@dataclass
class Local:
    """One node's part of a transaction."""

    xid: int
    end_lsn: int
    changes: list[dict[str, Any]]


@dataclass
class Txn:
    gid: str
    csn: int
    nodes: dict[str, Local] = field(default_factory=dict)


def change(row: Row) -> dict[str, Any]:
    """A row change as the suite compares it: typed values, the unchanged TOAST columns by name."""
    old: dict[str, Any] | None = None
    new: dict[str, Any] | None = None
    unchanged: list[str] = []
    if row.old is not None:
        old, unchanged = typed_values(row.old)
    if row.new is not None:
        new, unchanged = typed_values(row.new)
    if old is not None and row.table in FULL_COLUMNS:
        old = {c: old.get(c) for c in FULL_COLUMNS[row.table]}
    return {"table": row.table, "op": row.op, "new": new, "old": old, "unchanged": unchanged}


def read_node(conn: psycopg.Connection[Any], slot: str) -> list[tuple[str, int, Local]]:
    """Consume the witness slot up to the flushed end of WAL: (gid, csn, part) of each committed txn.

    Commits without a gid (the ticker's, the GTM's own commit log) are left out,
    as are changes of tables that are not the suite's."""
    txns, _ = transactions(consume(conn, slot))
    out: list[tuple[str, int, Local]] = []
    for t in txns:
        marker = t.commit_marker()
        if marker is None or t.end_lsn is None:
            continue
        changes = [change(r) for r in t.rows if r.schema == "public" and r.table in TABLES]
        out.append((*marker, Local(t.xid, t.end_lsn, changes)))
    return out


def read_witness(
    urls: dict[str, str], slot: str, early: dict[str, list[tuple[str, int, Local]]] | None = None
) -> list[Txn]:
    """Every committed global transaction of the suite's tables, joined by gid, by CSN.

    `early`: parts a run consumed from a node's witness slot before the end
    (`read_node`; a class that must keep that slot's WAL from being removed)."""
    by_gid: dict[str, Txn] = {}
    for node, url in urls.items():
        with psycopg.connect(url, autocommit=True) as c:
            parts = [*(early or {}).get(node, []), *read_node(c, slot)]
        for gid, csn, part in parts:
            t = by_gid.setdefault(gid, Txn(gid, csn))
            assert t.csn == csn, f"witness: {gid} has csn {t.csn} and {csn}"
            assert node not in t.nodes, f"witness: {gid} committed twice on {node}"
            t.nodes[node] = part
    return sorted(by_gid.values(), key=lambda t: t.csn)


def expected(witness: list[Txn]) -> list[Txn]:
    """The transactions a consumer must receive: those with row changes somewhere."""
    return [t for t in witness if any(p.changes for p in t.nodes.values())]


# --- the checks ---------------------------------------------------------------------------


@dataclass
class Verdict:
    lost: list[str] = field(default_factory=list)  # gids
    doubled: list[str] = field(default_factory=list)  # gids delivered more than once (each extra once)
    problems: list[str] = field(default_factory=list)  # every violation, one line each

    def add(self, text: str) -> None:
        if len(self.problems) < 40:
            self.problems.append(text)
        elif len(self.problems) == 40:
            self.problems.append("... (more problems left out)")


def _ours_change(ch: dict[str, Any]) -> dict[str, Any]:
    return {
        "table": ch["table"],
        "op": ch["op"],
        "new": ch["new"],
        "old": ch["old"],
        "unchanged": ch.get("unchanged", []),
    }


def check_stream(who: str, lines: list[str], want: list[Txn], v: Verdict) -> None:
    """One consumer's lines against the witness: docs/design.md section 6, invariants 1 to 5."""
    txns = [json.loads(x) for x in lines]
    seen: dict[str, int] = {}
    last = -1
    for t in txns:
        if t["csn"] <= last:
            v.add(f"{who}: csn {t['csn']} (gid {t['gid']}) after csn {last}: not strictly increasing")
        last = max(last, t["csn"])
        seen[t["gid"]] = seen.get(t["gid"], 0) + 1
    for gid, n in seen.items():
        if n > 1:
            v.doubled += [gid] * (n - 1)
            v.add(f"{who}: {gid} delivered {n} times")
    by_gid = {t["gid"]: t for t in txns}
    wanted = {t.gid: t for t in want}
    for gid in wanted.keys() - by_gid.keys():
        v.lost.append(gid)
        v.add(f"{who}: lost {gid} (csn {wanted[gid].csn}, nodes {sorted(wanted[gid].nodes)})")
    for gid in by_gid.keys() - wanted.keys():
        v.add(
            f"{who}: {gid} (csn {by_gid[gid]['csn']}) was never committed with changes (aborted or invented)"
        )
    for gid in by_gid.keys() & wanted.keys():
        _check_txn(who, by_gid[gid], wanted[gid], v)


def _check_txn(who: str, ours: dict[str, Any], w: Txn, v: Verdict) -> None:
    where = f"{who}: {w.gid} (csn {w.csn})"
    if ours["csn"] != w.csn:
        v.add(f"{where}: delivered with csn {ours['csn']}")
    cids = [ch["cid"] for ch in ours["changes"]]
    if cids != sorted(cids):
        v.add(f"{where}: command ids decrease: {cids}")
    per_node: dict[str, list[dict[str, Any]]] = {}
    for ch in ours["changes"]:
        per_node.setdefault(ch["node"], []).append(_ours_change(ch))
    for node, part in w.nodes.items():
        got = per_node.get(node, [])
        if got != part.changes:
            v.add(
                f"{where}: node {node}'s changes differ: got {_brief(got)}, committed {_brief(part.changes)}"
            )
        elif any(
            list((g[k] or {}).keys()) != list((c[k] or {}).keys())
            for g, c in zip(got, part.changes, strict=True)
            for k in ("new", "old")
        ):
            v.add(f"{where}: node {node}: columns not in table order")
        if part.changes:
            info = ours["nodes"].get(node)
            if info is None or info["xid"] != part.xid:
                v.add(f"{where}: node {node}: xid {info and info['xid']}, committed as {part.xid}")
            elif lsn_from_str(info["commit_lsn"]) >= part.end_lsn:
                v.add(f"{where}: node {node}: commit_lsn {info['commit_lsn']} not before the commit's end")
    for node in per_node.keys() - w.nodes.keys():
        v.add(f"{where}: changes from {node}, where it did not commit")


def _brief(changes: list[dict[str, Any]]) -> str:
    out = [f"{c['op']} {c['table']} {c['new'] or c['old']}" for c in changes[:3]]
    return "[" + "; ".join(x[:120] for x in out) + (" ..." if len(changes) > 3 else "") + "]"


def check_writers(records: list[dict[str, Any]], want: list[Txn], v: Verdict) -> None:
    """Every commit a writer saw succeed is in the witness, with its CSN and its rows (a cross-check)."""
    wanted = {t.gid: t for t in want}
    for r in records:
        t = wanted.get(r["gid"])
        if t is None:
            v.add(f"writers: {r['gid']} (csn {r['csn']}) committed, but no node's WAL holds it")
            continue
        if t.csn != r["csn"]:
            v.add(f"writers: {r['gid']} committed with csn {r['csn']}, the WAL says {t.csn}")
        for node, rows in r["nodes"].items():
            have = (
                [[c["table"], c["op"].upper(), _key(c)] for c in t.nodes[node].changes]
                if node in t.nodes
                else []
            )
            if rows != have:
                v.add(f"writers: {r['gid']} on {node}: wrote {rows[:3]}, the WAL holds {have[:3]}")


def _key(change: dict[str, Any]) -> Any:
    row = change["new"] if change["new"] is not None else change["old"]
    if change["table"] == "fx_ledger":
        return f"{row['gid']}:{row['seq']}"
    return row["id"]
