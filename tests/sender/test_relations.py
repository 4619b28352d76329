"""Which released transaction a new relation version travels with (csnd/sender/node.py, "Relation versions")."""

from __future__ import annotations

import json

from csnd.core.ids import Lsn, Xid
from csnd.decoder.change import DecodedItem, DecodedRun
from csnd.decoder.schema import relation_body
from csnd.reader.pgoutput import Begin, Column, Commit, LogicalMessage, Relation, TypeMsg
from csnd.sender import FinishedTxn, NodeSender

V1 = Relation(None, 16384, "public", "acct", "d", (Column(1, "id", 23, -1), Column(0, "note", 25, -1)))
V2 = Relation(None, 16384, "public", "acct", "d", (Column(1, "id", 23, -1), Column(0, "note", 1043, 24)))


def _feed(ns: NodeSender, *items: DecodedItem) -> list[FinishedTxn]:
    out: list[FinishedTxn] = []
    for item in items:
        lsn = getattr(item, "end_lsn", 0) or getattr(item, "lsn", 0) or 0
        out.extend(ns.feed(Lsn(lsn), item))
        ns._check()
    return out


def _marker(text: str, transactional: bool) -> LogicalMessage:
    return LogicalMessage(None, transactional, Lsn(0), "csn", text.encode("ascii"))


def _txn(xid: int, commit_lsn: int, *middle: DecodedItem) -> list[DecodedItem]:
    return [Begin(Lsn(commit_lsn), 5, Xid(xid)), *middle, Commit(0, Lsn(commit_lsn), Lsn(commit_lsn + 8), 5)]


def _change(lsn: int) -> DecodedRun:
    return DecodedRun(None, [Lsn(lsn)], ['"op": "insert"'], "insert")


def test_a_version_travels_with_the_transaction_it_arrived_in_once() -> None:
    ns = NodeSender("dn1", "single")
    [first] = _feed(ns, *_txn(700, 0x200, V1, _change(0x100)))
    assert first.relations == (relation_body(V1, {}),)
    # pgoutput sends it again at every reconnect and invalidation: no new version
    [second] = _feed(ns, *_txn(701, 0x400, V1, _change(0x300)))
    assert second.relations == ()
    # a type change is one
    [third] = _feed(ns, *_txn(702, 0x600, V2, _change(0x500)))
    assert third.relations == (relation_body(V2, {}),)
    assert json.loads("{" + third.relations[0] + "}")["columns"][1] == {
        "name": "note",
        "type": "varchar",
        "oid": 1043,
        "typmod": 24,
    }


def test_a_skipped_transaction_passes_its_version_on() -> None:
    ns = NodeSender("dn1", "single")
    assert _feed(ns, *_txn(700, 0x200, V1)) == []  # (its changes all rolled back: skipped)
    [txn] = _feed(ns, *_txn(701, 0x400, _change(0x300)))
    assert txn.relations == (relation_body(V1, {}),)


def test_the_first_released_of_the_later_transactions_takes_it_not_an_earlier_one_released_later() -> None:
    """GTM: A finishes before the Relation but waits behind B's committing marker; B, after it, goes first."""
    ns = NodeSender("dn1", "gtm")
    out = _feed(
        ns,
        _marker("committing gB 10", False),
        *_txn(700, 0x200, _change(0x100), _marker("commit gA 20", True)),  # waits: 20 > B's 10
        *_txn(701, 0x400, V2, _change(0x300), _marker("commit gB 15", True)),
    )
    assert [(t.gid, t.relations) for t in out] == [("gB", (relation_body(V2, {}),)), ("gA", ())]


def test_user_type_names_come_from_type_messages() -> None:
    ns = NodeSender("dn1", "single")
    rel = Relation(None, 5, "s", "t", "f", (Column(1, "m", 16510, -1), Column(1, "d", 16600, -1)))
    [txn] = _feed(
        ns,
        *_txn(
            9,
            0x200,
            TypeMsg(None, 16510, "public", "mood"),
            TypeMsg(None, 16600, "", "int4"),  # (a domain: pgoutput names its base type, in pg_catalog)
            rel,
            _change(0x100),
        ),
    )
    got = json.loads("{" + txn.relations[0] + "}")
    assert got["replica_identity"] == "full" and got["key"] == ["m", "d"]
    assert [(c["name"], c["type"]) for c in got["columns"]] == [("m", "public.mood"), ("d", "int4")]
