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
import threading
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.core.ids import lsn_to_str
from csnd.snapshot.incremental import IncrementalSnapshots, Job, TableJob
from csnd.snapshot.watermark import UNPLACED_LSN, Chunk, ReadSnapshot, Window, Windows, attach, body_key

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


def _keys_of(op: tuple[str, int, int]) -> set[int]:
    kind, k, other = op
    return {k, other} if kind == "move" else {k}


SNAP = ReadSnapshot(10, 10, frozenset())  # (sees every transaction with an xid below 10)


@settings(max_examples=400, deadline=None)
@given(
    initial=st.sets(st.integers(0, 12)),
    before=ops,
    opened=ops,
    delayed=st.lists(st.booleans(), min_size=12, max_size=12),
    after_read=ops,
    after_mark=ops,
    lo=st.integers(-1, 12),
    hi=st.integers(0, 13),
    first_xid=st.one_of(st.integers(3, 2**33), st.integers(2**32 - 12, 2**32 + 3)),
)
def test_a_consumer_of_the_lines_ends_with_the_table(
    initial: set[int],
    before: list[tuple[str, int, int]],
    opened: list[tuple[str, int, int]],
    delayed: list[bool],
    after_read: list[tuple[str, int, int]],
    after_mark: list[tuple[str, int, int]],
    lo: int,
    hi: int,
    first_xid: int,
) -> None:
    """Transactions before tracking (visible to the chunk: the job waits for that), between tracking and
    the chunk's snapshot -- some of them delayed, appended but not yet visible to it, as a commit waiting
    for a synchronous standby is, whose rows later ones cannot touch until they are -- after the snapshot,
    and after the watermark; xids of 64 bits, given to the stream as their low 32 bits, across a wrap."""
    table = {k: {"id": k, "v": -1} for k in initial}
    windows = Windows()
    out: list[str] = []
    csn, xid = 100, first_xid

    def stream(op: tuple[str, int, int], apply_to: list[dict[int, dict[str, Any]]]) -> bool:
        nonlocal csn, xid
        change = _apply_op(table, op, csn)
        if change is None:
            return False
        for other in apply_to:
            _apply_op(other, op, csn)
        csn += 1
        xid += 1
        out.append(windows.observe(csn, _line(csn, xid % 2**32, [change]))[0])
        return True

    for op in before:
        stream(op, [])
    tracker = windows.track("dn1", "public", "t", KEY)
    window = windows.open(tracker, csn)
    seen = {k: dict(v) for k, v in table.items()}  # the table as the chunk's snapshot will see it
    invisible: set[int] = set()
    locked: set[int] = set()
    for op, late in zip(opened, delayed, strict=False):
        if _keys_of(op) & locked:
            continue  # (it would wait for the delayed one's row lock)
        if late:
            if stream(op, []):
                invisible.add(xid)
                locked |= _keys_of(op)
        else:
            stream(op, [seen])
    snapshot = ReadSnapshot(min(invisible, default=xid + 1), xid + 1, frozenset(invisible))
    rows = [seen[k] for k in sorted(seen) if lo < k <= hi]
    bodies = [_read_body(r) for r in rows]
    for op in after_read:
        stream(op, [])
    high = xid + 1
    windows.arm(window, high, Chunk(bodies, [body_key(b, KEY) for b in bodies], {"chunk": 1}), snapshot)
    csn += 1
    out.append(windows.observe(csn, _line(csn, high % 2**32, []))[0])
    assert window.done.is_set() and window.appended is not None and not window.redo
    windows.untrack(tracker)
    assert not windows.active
    for op in after_mark:
        stream(op, [])
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


def test_xid_visibility_follows_postgresql_across_the_wrap() -> None:
    s = ReadSnapshot.parse(f"{2**32 - 2}:{2**32 + 3}:{2**32 - 2},{2**32 + 1}")
    assert s.xip == {2**32 - 2, 2**32 + 1}
    assert s.sees(2**32 - 3) and s.sees(2**32 - 1) and s.sees(0) and s.sees(2)  # (committed before)
    assert not s.sees(2**32 - 2) and not s.sees(1)  # (in progress then)
    assert not s.sees(3) and not s.sees(1000)  # (began after)
    assert s.sees_forever(2**32 - 3) and not s.sees_forever(2**32 - 2) and not s.sees_forever(0)


def _armed(windows: Windows, keys: tuple[int, ...], snapshot: ReadSnapshot = SNAP) -> Window:
    tracker = windows.track("dn1", "public", "t", KEY)
    w = windows.open(tracker, 0)
    bodies = [_read_body({"id": k, "v": 0}) for k in keys]
    windows.arm(w, 2**32 + 70, Chunk(bodies, [body_key(b, KEY) for b in bodies], {"chunk": 4}), snapshot)
    return w


def test_the_watermark_gets_the_rows_its_snapshot_did_not_miss_in_place() -> None:
    windows = Windows()
    w = _armed(windows, (1, 2, 3))
    windows.observe(5, _line(5, 9, [_change("update", None, {"id": 1, "v": 9})]))  # (seen by it)
    windows.observe(6, _line(6, 50, [_change("update", None, {"id": 2, "v": 9})]))  # (not)
    # (the watermark's xid as pgoutput gives it: the low 32 bits of txid_current())
    line, relations = windows.observe(7, _line(7, 70, []))
    txn = json.loads(line)
    assert relations == []  # (the chunk named no relation version)
    assert [c["new"]["id"] for c in txn["changes"]] == [1, 3]
    assert all(c["lsn"] == lsn_to_str(7) and c["op"] == "read" and c["node"] == "dn1" for c in txn["changes"])
    assert txn["snapshot"] == {"chunk": 4, "rows": 2, "left_out": 1}
    assert w.appended == (7, 2)
    assert [t.xid for t in w.tracker.history] == [50]  # (xid 9 is seen by every later snapshot)


def test_a_truncate_or_an_uninspectable_transaction_makes_the_chunk_read_again() -> None:
    windows = Windows()
    _armed(windows, (1,))
    windows.observe(5, _line(5, 50, [_change("truncate", None, None)]))
    txn = json.loads(windows.observe(6, _line(6, 70, []))[0])
    assert txn["changes"] == [] and txn["snapshot"]["redo"].startswith("the table was truncated")
    windows = Windows()
    w2 = _armed(windows, (1,))
    windows.poison("transaction 9 was too large to look into")
    assert w2.redo == "transaction 9 was too large to look into"
    # a change naming its row on one side only is fine; on neither, the chunk is read again
    windows = Windows()
    _armed(windows, (1, 2))
    windows.observe(5, _line(5, 50, [_change("update", {"id": 1}, {"v": 3})]))
    assert "left_out" in json.loads(windows.observe(6, _line(6, 70, []))[0])["snapshot"]
    windows = Windows()
    _armed(windows, (1, 2))
    windows.observe(5, _line(5, 50, [_change("update", None, {"v": 3})]))
    assert "named no row" in json.loads(windows.observe(6, _line(6, 70, []))[0])["snapshot"]["redo"]


def test_a_relation_version_is_kept_unless_the_stream_changed_it_during_the_chunk() -> None:
    windows = Windows()
    versions: dict[int, tuple[int, str]] = {}
    windows.in_force = lambda node, schema, table, csn: versions.get(csn)
    tracker = windows.track("dn1", "public", "t", KEY)

    def chunk_at(csn: int, since: int) -> dict[str, Any]:
        w = windows.open(tracker, since)
        body = _read_body({"id": 1, "v": 0})
        windows.arm(w, 70, Chunk([body], [body_key(body, KEY)], {"chunk": 1}, relation="R1"), SNAP)
        line, relations = windows.observe(csn, _line(csn, 70, []))
        return {"marker": json.loads(line)["snapshot"], "relations": relations}

    assert chunk_at(5, 0)["relations"] == [("dn1", "R1")]  # (none in force: a table never streamed)
    versions[6] = (2, "R0")  # (an older version, in force since before the chunk began)
    assert chunk_at(6, 3)["relations"] == [("dn1", "R1")]
    versions[7] = (7, "R1")
    assert chunk_at(7, 3)["relations"] == []  # (the same version: nothing to keep)
    versions[8] = (5, "R2")  # (another version, in force since after the chunk began)
    got = chunk_at(8, 3)
    assert got["relations"] == [] and "columns changed" in got["marker"]["redo"]


def test_other_nodes_tables_and_transactions_pass_untouched() -> None:
    windows = Windows()
    w = _armed(windows, (1,))
    other = _line(5, 7, [_change("insert", None, {"id": 1, "v": 1}).replace('"dn1"', '"dn2"')])
    assert windows.observe(5, other) == (other, [])  # (dn2's change)
    assert w.tracker.history == []
    assert windows.observe(6, _line(6, 8, [])) == (_line(6, 8, []), [])  # (not the watermark's xid)
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


def test_a_stop_before_the_job_thread_has_started_is_quiet(tmp_path: Any) -> None:
    # (csnd serve stops at once when a signal comes at its ready line: the thread may not exist yet,
    # or exist and not have started -- joining it then raised RuntimeError and the stop exited 1)
    jobs, log = _jobs(tmp_path, [])
    try:
        jobs.stop()
        jobs._thread = threading.Thread(target=lambda: None)
        jobs.stop()
    finally:
        log.close()
