"""Incremental snapshots' window logic (csnd.snapshot.watermark) against a brute-force table, and resumption.

The property: a table with rows from before the stream began, transactions
before the window opens, between the opening and the chunk's read snapshot
(visible to it), after it, and after the watermark.  A consumer that applies
every line the sink hands on -- reads and inserts put, updates move, deletes
remove, leniently for rows it never saw -- ends with the table exactly, as
the brute-force replay of the same operations has it.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.core.ids import lsn_to_str
from csnd.snapshot.incremental import IncrementalSnapshots, Job, TableJob
from csnd.snapshot.watermark import UNPLACED_LSN, Chunk, Windows, attach, body_key

KEY = ("id",)
_HEAD = '"schema": "public", "table": "t", "key": ["id"]'


def _change(op: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    return (
        f'{{"node": "dn1", "cid": 0, "lsn": "0/1", "op": "{op}", {_HEAD}, '
        f'"old": {json.dumps(old)}, "new": {json.dumps(new)}}}'
    )


def _line(csn: int, xid: int, changes: list[str]) -> str:
    return (
        f'{{"csn": {csn}, "gid": null, "commit_time": "2026-01-01T00:00:00+00:00", '
        f'"nodes": {{"dn1": {{"xid": {xid}, "commit_lsn": "{lsn_to_str(csn)}"}}}}, '
        f'"changes": [{", ".join(changes)}]}}'
    )


def _read_body(row: dict[str, Any]) -> str:
    return f'{UNPLACED_LSN}"op": "read", {_HEAD}, "old": null, "new": {json.dumps(row)}'


# An operation on the table: (kind, key, other key or value)
ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "update", "move", "delete"]), st.integers(0, 12), st.integers(0, 12)
    ),
    max_size=12,
)


def _apply_op(table: dict[int, dict[str, Any]], op: tuple[str, int, int], serial: int) -> str | None:
    """Apply `op` to `table` as PostgreSQL would; its change as the stream gives it (None: nothing done)."""
    kind, k, other = op
    if kind == "insert" and k not in table:
        table[k] = {"id": k, "v": serial}
        return _change("insert", None, table[k])
    if kind == "update" and k in table:
        table[k] = {"id": k, "v": serial}
        return _change("update", None, table[k])
    if kind == "move" and k in table and other not in table:
        del table[k]
        table[other] = {"id": other, "v": serial}
        return _change("update", {"id": k}, table[other])
    if kind == "delete" and k in table:
        del table[k]
        return _change("delete", {"id": k}, None)
    return None


def _consume(lines: list[str]) -> dict[int, dict[str, Any]]:
    state: dict[int, dict[str, Any]] = {}
    for line in lines:
        for ch in json.loads(line)["changes"]:
            old, new = ch["old"], ch["new"]
            if ch["op"] in ("read", "insert"):
                state[new["id"]] = new
            elif ch["op"] == "update":
                state.pop((old or new)["id"], None)
                state[new["id"]] = new
            elif ch["op"] == "delete":
                state.pop(old["id"], None)
    return state


@settings(max_examples=300, deadline=None)
@given(
    initial=st.sets(st.integers(0, 12)),
    before=ops,
    opened=ops,
    after_read=ops,
    after_mark=ops,
    lo=st.integers(-1, 12),
    hi=st.integers(0, 13),
)
def test_a_consumer_of_the_lines_ends_with_the_table(
    initial: set[int],
    before: list[tuple[str, int, int]],
    opened: list[tuple[str, int, int]],
    after_read: list[tuple[str, int, int]],
    after_mark: list[tuple[str, int, int]],
    lo: int,
    hi: int,
) -> None:
    table = {k: {"id": k, "v": -1} for k in initial}
    windows = Windows()
    out: list[str] = []
    csn = 100

    def stream(batch: list[tuple[str, int, int]]) -> None:
        nonlocal csn
        for op in batch:
            change = _apply_op(table, op, csn)
            if change is not None:
                csn += 1
                out.append(windows.observe(csn, _line(csn, csn, [change]))[0])

    stream(before)
    window = windows.open("dn1", "public", "t", KEY)
    stream(opened)
    # the chunk: the keys lo < id <= hi as the read snapshot sees them (everything committed so far)
    rows = [table[k] for k in sorted(table) if lo < k <= hi]
    bodies = [_read_body(r) for r in rows]
    stream(after_read)
    windows.arm(window, 7, Chunk(bodies, [body_key(b, KEY) for b in bodies], {"chunk": 1}))
    csn += 1
    out.append(windows.observe(csn, _line(csn, 7, []))[0])
    assert window.done.is_set() and window.appended is not None and not windows.active
    stream(after_mark)
    state = _consume(out)
    # Rows the chunk covered, or the stream touched, are the table's; a row outside the chunk that no
    # transaction touched is one the stream never gave (it predates it).
    streamed = {
        row["id"]
        for line in out
        for ch in json.loads(line)["changes"]
        if ch["op"] != "read"
        for row in (ch["old"], ch["new"])
        if row
    }
    unseen = {k for k in initial if not lo < k <= hi} - streamed
    assert {k: v for k, v in state.items() if k not in unseen} == {
        k: v for k, v in table.items() if k not in unseen
    }
    assert unseen.isdisjoint(state)


def test_the_watermark_gets_the_rows_the_window_left_alone_in_place() -> None:
    windows = Windows()
    w = windows.open("dn1", "public", "t", KEY)
    windows.observe(5, _line(5, 50, [_change("update", None, {"id": 2, "v": 9})]))
    bodies = [_read_body({"id": k, "v": 0}) for k in (1, 2, 3)]
    windows.arm(w, 2**32 + 7, Chunk(bodies, [body_key(b, KEY) for b in bodies], {"chunk": 4}))
    line, relations = windows.observe(
        6, _line(6, 7, [])
    )  # (pgoutput's xid: the low 32 bits of txid_current())
    txn = json.loads(line)
    assert relations == []  # (the chunk named no relation version)
    assert [c["new"]["id"] for c in txn["changes"]] == [1, 3]
    assert all(c["lsn"] == lsn_to_str(6) and c["op"] == "read" and c["node"] == "dn1" for c in txn["changes"])
    assert txn["snapshot"] == {"chunk": 4, "rows": 2, "left_out": 1}
    assert w.appended == (6, 2)


def test_a_truncate_or_an_uninspectable_transaction_makes_the_chunk_read_again() -> None:
    windows = Windows()
    w = windows.open("dn1", "public", "t", KEY)
    windows.observe(5, _line(5, 50, [_change("truncate", None, None)]))
    bodies = [_read_body({"id": 1, "v": 0})]
    windows.arm(w, 7, Chunk(bodies, [body_key(b, KEY) for b in bodies], {"chunk": 1}))
    txn = json.loads(windows.observe(6, _line(6, 7, []))[0])
    assert txn["changes"] == [] and txn["snapshot"]["redo"].startswith("the table was truncated")
    w2 = windows.open("dn1", "public", "t", KEY)
    windows.poison("transaction 9 was too large to look into")
    assert w2.redo == "transaction 9 was too large to look into"


def test_other_nodes_tables_and_transactions_pass_untouched() -> None:
    windows = Windows()
    w = windows.open("dn1", "public", "t", KEY)
    other = _line(5, 7, [_change("insert", None, {"id": 1, "v": 1}).replace('"dn1"', '"dn2"')])
    assert windows.observe(5, other) == (
        other,
        [],
    )  # (dn2's change, and not the watermark though xid 7 is armed)
    assert w.touched == set()
    windows.arm(w, 7, Chunk([], [], {"chunk": 1}))
    assert windows.observe(6, _line(6, 8, [])) == (_line(6, 8, []), [])
    assert not w.done.is_set()


def test_attach_refuses_a_watermark_with_changes() -> None:
    try:
        attach(_line(5, 7, [_change("insert", None, {"id": 1})]), "dn1", 5, [], {})
    except ValueError as e:
        assert "has changes of its own" in str(e)
    else:
        raise AssertionError("attached to a transaction with changes")


def _jobs(tmp_path: Any, records: list[tuple[int, str]]) -> tuple[IncrementalSnapshots, Changelog]:
    log = Changelog(str(tmp_path))
    for csn, line in records:
        log.append(csn, line.encode())
    log.sync()
    return IncrementalSnapshots(str(tmp_path), log, Windows(), {}), log


def test_a_chunk_in_flight_at_a_crash_counts_once_whether_or_not_it_reached_the_changelog(
    tmp_path: Any,
) -> None:
    marked = json.loads(_line(12, 7, []))
    marked["snapshot"] = {"node": "dn1", "schema": "public", "table": "t", "incremental": "j1", "chunk": 3}
    marked["snapshot"].update(rows=5, last=False)
    jobs, log = _jobs(tmp_path, [(10, _line(10, 1, [])), (12, json.dumps(marked)), (13, _line(13, 2, []))])
    try:
        pending = {"chunk": 3, "hi": ["30"], "floor": 10}
        landed = TableJob("dn1", "public", "t", after=["20"], chunks=2, rows=9, pending=dict(pending))
        lost = TableJob("dn1", "public", "u", after=["20"], chunks=2, rows=9, pending=dict(pending))
        job = Job("j1", [landed, lost])
        jobs._jobs = [job]
        jobs._show(job)
        jobs._settle_pending(job, landed)
        jobs._settle_pending(job, lost)
        assert (landed.chunks, landed.rows, landed.after, landed.pending) == (3, 14, ["30"], None)
        assert (lost.chunks, lost.rows, lost.after, lost.pending) == (2, 9, ["20"], None)  # (read again)
        stored = json.loads((tmp_path / "incremental_snapshots.json").read_text())
        assert stored["jobs"][0]["tables"][0]["after"] == ["30"]
        again = IncrementalSnapshots(str(tmp_path), log, Windows(), {})
        again.load()
        assert again.latest() is not None and again.latest().tables[0].chunks == 3  # type: ignore[union-attr]
    finally:
        log.close()
