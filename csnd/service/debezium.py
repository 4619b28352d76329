"""A transaction line as Debezium change events: `csnd subscribe --format debezium` (pure: no I/O, no clock).

For consumers that already speak Debezium's PostgreSQL connector envelope
(docs/design.md section 7, "Debezium envelope"): each change of a transaction
line becomes one event, a JSON object on a line of its own, in the change's
order, with `before`, `after`, `source`, `op`, `ts_ms`, `transaction` and,
added since, `ts_us`, `ts_ns` and `key` (the record key a Kafka consumer of
Debezium reads beside the value):

    {"csn": 1042, ..., "changes": [{"op": "insert", ...}, {"op": "update", ...}]}
        ─►  {"before": null, "after": {...}, "source": {...}, "op": "c", ..., "key": {"id": 7}}
            {"before": null, "after": {...}, "source": {...}, "op": "u", ..., "key": {"id": 8}}

Everything comes from the line itself and from what the format is built
with (`DebeziumFormat`: each node's database name, and for the `adaptive`
variant the column types of the changelog's relation versions), so a
transaction converts the same way every time it is read (`ts_ms` is the
commit time, not the time it was read).  What Debezium fills in from its
own connection and csnd does not know (xmin; the database of a node the
service does not connect to itself) is null.  Integers beyond 2^53 - 1 in a
row's columns become strings, as JSON readers that hold numbers in doubles
need (the native format keeps them exact as numbers).  A transaction with no
change gives no event.

Two variants: `debezium` writes column values as the native lines do
(dates and times as ISO text); `debezium-adaptive` writes temporal values
as Debezium's connector does by default (`time.precision.mode=adaptive`:
csnd.service.debezium_time), for which it needs each column's type.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from csnd import __version__
from csnd.service.debezium_time import Convert, converter

OPS: Final = {"insert": "c", "update": "u", "delete": "d", "truncate": "t", "read": "r"}
# Debezium's placeholder for a TOAST column left out because its value did not
# change (the connector's `unavailable.value.placeholder` default).
UNAVAILABLE: Final = "__debezium_unavailable_value"
MAX_SAFE_INT: Final = 2**53 - 1
# The subscriber formats this module writes (Subscribe's `format`).
FORMATS: Final = ("debezium", "debezium-adaptive")
_dumps: Final = json.JSONEncoder(ensure_ascii=False).encode
_compact: Final = json.JSONEncoder(separators=(",", ":")).encode  # (as Jackson writes `sequence`)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_US: Final = timedelta(microseconds=1)

# The column converters of a node's table at a CSN: column name -> converter
# (absent: the value passes as it is); None when no relation version of the
# table is in force there.
ColumnRules = Mapping[str, Convert]
TypesAt = Callable[[str, str, str, int], "ColumnRules | None"]


class ColumnTypesUnknown(ValueError):
    """`debezium-adaptive` met a change of a table whose column types the changelog does not hold."""


class RelationVersions(Protocol):
    """What `RelationTypes` reads: csnd.changelog.RelationStore's lookups."""

    def has_between(self, lo: int, hi: int) -> bool: ...

    def in_force(self, node: str, schema: str, table: str, csn: int) -> tuple[int, str] | None: ...


class RelationTypes:
    """The column converters of each table's relation version in force at a CSN, for CSNs read in order.

    A table's converters are looked up again only when a relation version
    came into force since they were (`has_between`: two bisects per change).
    """

    __slots__ = ("_store", "_cache")

    def __init__(self, store: RelationVersions) -> None:
        self._store = store
        self._cache: dict[tuple[str, str, str], tuple[int, ColumnRules | None]] = {}

    def __call__(self, node: str, schema: str, table: str, csn: int) -> ColumnRules | None:
        key = (node, schema, table)
        hit = self._cache.get(key)
        if hit is not None and hit[0] <= csn and not self._store.has_between(hit[0], csn):
            return hit[1]
        found = self._store.in_force(node, schema, table, csn)
        rules = None if found is None else column_rules(json.loads("{" + found[1] + "}")["columns"])
        self._cache[key] = (csn, rules)
        return rules


def column_rules(columns: list[dict[str, Any]]) -> dict[str, Convert]:
    """The converters of a relation line's `columns` (only its temporal ones have one)."""
    rules = {}
    for c in columns:
        rule = converter(c["type"], c["typmod"])
        if rule is not None:
            rules[c["name"]] = rule
    return rules


class DebeziumFormat:
    """One subscriber's Debezium format: what converts its lines, whole (`convert`) or a change at a time (`events`).

    `databases`: each node's database name (`source.db`; a node not in it
    gives null).  `types`: the column converters by table and CSN, for
    `debezium-adaptive` (None: `debezium`, values as the native lines).
    """

    __slots__ = ("databases", "types")

    def __init__(self, databases: Mapping[str, str] | None = None, types: TypesAt | None = None) -> None:
        self.databases = dict(databases or {})
        self.types = types

    def convert(self, line: bytes) -> bytes | None:
        """The Debezium events of a transaction line, one per line (no newline at the end); None: no change.

        ValueError when the line is not a transaction line (ColumnTypesUnknown:
        `debezium-adaptive` lacks a table's column types).
        """
        try:
            txn = json.loads(line)
            changes = txn["changes"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"not a transaction line: {e}") from None
        event = self.events(txn)
        if not changes:
            return None
        return "\n".join(event(change) for change in changes).encode("utf-8")

    def events(self, txn: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], str]:
        """What turns each change of the transaction `txn` (its keys; its changes are not needed) into its event.

        Called with the transaction's changes in their order, one at a time (a
        line read in pieces is converted so): the event's `total_order` and
        `data_collection_order` count the calls.  ValueError when `txn` lacks
        what an event needs.
        """
        return _events(txn, self.databases, self.types)


def to_debezium(line: bytes) -> bytes | None:
    """`DebeziumFormat().convert(line)`: the `debezium` events of a line (no database names known)."""
    return DebeziumFormat().convert(line)


def debezium_events(txn: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], str]:
    """`DebeziumFormat().events(txn)`."""
    return _events(txn, {}, None)


def _events(
    txn: Mapping[str, Any], databases: Mapping[str, str], types: TypesAt | None
) -> Callable[[Mapping[str, Any]], str]:
    try:
        csn = txn["csn"]
        ts_us = _micros(txn["commit_time"])
        nodes = txn["nodes"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a transaction line: {e}") from None
    ts_ms, ts_ns = ts_us // 1000, ts_us * 1000
    marker = txn.get("snapshot")
    # Debezium's own values: "true" for an initial snapshot's rows, "incremental" for a signal's chunks
    snapshot = "false" if marker is None else "incremental" if "incremental" in marker else "true"
    gid = txn.get("gid")
    per_table: dict[tuple[str, str], int] = {}
    counted = [0]

    def event_of(change: Mapping[str, Any]) -> str:
        counted[0] += 1
        order = counted[0]
        try:
            table = (change["schema"], change["table"])
            op = OPS[change["op"]]
            node = change["node"]
            part = nodes[node]
            xid = part["xid"]
            lsn = _lsn(change["lsn"])
            commit_lsn = part.get("commit_lsn")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a transaction line: change {order} lacks {e}") from None
        per_table[table] = per_table.get(table, 0) + 1
        rules: ColumnRules | None = None
        if types is not None and (change.get("old") is not None or change.get("new") is not None):
            rules = types(node, table[0], table[1], csn)
            if rules is None:
                raise ColumnTypesUnknown(
                    f"format debezium-adaptive needs the column types of node {node}'s "
                    f"{table[0]}.{table[1]} at csn {csn}, and the changelog holds no relation version of it "
                    "(a changelog written before csnd kept them); subscribe with format debezium (dates and "
                    "times as ISO text), or from a later csn"
                )
        before = _row(change.get("old"), rules)
        after = _row(change.get("new"), rules)
        if after is not None:
            for column in change.get("unchanged") or ():
                after[column] = UNAVAILABLE
        event = {
            "before": before,
            "after": after,
            "source": {
                "version": __version__,
                "connector": "csnd",
                "name": "csnd",
                "ts_ms": ts_ms,
                "snapshot": snapshot,
                "db": databases.get(node),
                "schema": table[0],
                "table": table[1],
                "txId": xid,
                "lsn": lsn,
                "xmin": None,
                "csn": csn,
                "node": node,
                "gid": gid,
                "ts_us": ts_us,
                "ts_ns": ts_ns,
                "sequence": _compact([None if commit_lsn is None else str(_lsn(commit_lsn)), str(lsn)]),
            },
            "op": op,
            "ts_ms": ts_ms,
            "transaction": {
                "id": str(csn),
                "total_order": order,
                "data_collection_order": per_table[table],
            },
            "ts_us": ts_us,
            "ts_ns": ts_ns,
            "key": _key(change.get("key"), after if after is not None else before),
        }
        return _dumps(event)

    return event_of


def _row(row: Any, rules: ColumnRules | None) -> dict[str, Any] | None:
    if row is None:
        return None
    if not isinstance(row, dict):
        raise ValueError(f"not a transaction line: a row is {type(row).__name__}, not an object")
    out = {k: str(v) if type(v) is int and abs(v) > MAX_SAFE_INT else v for k, v in row.items()}
    if rules:
        for name, rule in rules.items():
            value = out.get(name)
            if value is not None:
                try:
                    out[name] = rule(value)
                except ValueError as e:
                    raise ValueError(f"not a transaction line: column {name!r}: {e}") from None
    return out


def _key(columns: Any, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The record key: the change's key columns with their values from its row (null: no key named)."""
    if not columns or row is None:
        return None
    try:
        return {c: row[c] for c in columns}
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a transaction line: key column {e} is not in the change's row") from None


def _micros(text: str) -> int:
    """Microseconds since the Unix epoch, exactly (no float on the way)."""
    return (datetime.fromisoformat(text) - _EPOCH) // _US


def _lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)
