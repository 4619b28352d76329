"""A transaction line as Debezium change events: `csnd subscribe --format debezium` (pure: no I/O, no clock).

For consumers that already speak Debezium's PostgreSQL connector envelope
(docs/design.md section 7, "Debezium envelope"): each change of a transaction
line becomes one event, a JSON object on a line of its own, in the change's
order, with `before`, `after`, `source`, `op`, `ts_ms` and `transaction`:

    {"csn": 1042, ..., "changes": [{"op": "insert", ...}, {"op": "update", ...}]}
        ─►  {"before": null, "after": {...}, "source": {...}, "op": "c", ...}
            {"before": null, "after": {...}, "source": {...}, "op": "u", ...}

Everything comes from the line itself, so a transaction converts the same
way every time it is read (`ts_ms` is the commit time, not the time it was
read).  What Debezium fills in from its own connection and csnd's line does
not carry (the database name, xmin) is null.  Integers beyond 2^53 - 1 in a
row's columns become strings, as JSON readers that hold numbers in doubles
need (the native format keeps them exact as numbers).  A transaction with no
change gives no event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from csnd import __version__

OPS: Final = {"insert": "c", "update": "u", "delete": "d", "truncate": "t", "read": "r"}
# Debezium's placeholder for a TOAST column left out because its value did not
# change (the connector's `unavailable.value.placeholder` default).
UNAVAILABLE: Final = "__debezium_unavailable_value"
MAX_SAFE_INT: Final = 2**53 - 1
_dumps: Final = json.JSONEncoder(ensure_ascii=False).encode
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)


def to_debezium(line: bytes) -> bytes | None:
    """The Debezium events of a transaction line, one per line (no newline at the end); None: no change.

    ValueError when the line is not a transaction line.
    """
    try:
        txn = json.loads(line)
        changes = txn["changes"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a transaction line: {e}") from None
    event = debezium_events(txn)
    if not changes:
        return None
    return "\n".join(event(change) for change in changes).encode("utf-8")


def debezium_events(txn: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], str]:
    """What turns each change of the transaction `txn` (its keys; its changes are not needed) into its event.

    Called with the transaction's changes in their order, one at a time (a
    line read in pieces is converted so): the event's `total_order` and
    `data_collection_order` count the calls.  ValueError when `txn` lacks
    what an event needs.
    """
    try:
        csn = txn["csn"]
        ts_ms = _millis(txn["commit_time"])
        nodes = txn["nodes"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a transaction line: {e}") from None
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
            xid = nodes[node]["xid"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a transaction line: change {order} lacks {e}") from None
        per_table[table] = per_table.get(table, 0) + 1
        after = _row(change.get("new"))
        if after is not None:
            for column in change.get("unchanged") or ():
                after[column] = UNAVAILABLE
        event = {
            "before": _row(change.get("old")),
            "after": after,
            "source": {
                "version": __version__,
                "connector": "csnd",
                "name": "csnd",
                "ts_ms": ts_ms,
                "snapshot": snapshot,
                "db": None,
                "schema": table[0],
                "table": table[1],
                "txId": xid,
                "lsn": _lsn(change["lsn"]),
                "xmin": None,
                "csn": csn,
                "node": node,
                "gid": gid,
            },
            "op": op,
            "ts_ms": ts_ms,
            "transaction": {
                "id": str(csn),
                "total_order": order,
                "data_collection_order": per_table[table],
            },
        }
        return _dumps(event)

    return event_of


def _row(row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    if not isinstance(row, dict):
        raise ValueError(f"not a transaction line: a row is {type(row).__name__}, not an object")
    return {k: str(v) if type(v) is int and abs(v) > MAX_SAFE_INT else v for k, v in row.items()}


def _millis(text: str) -> int:
    """Milliseconds since the Unix epoch, exactly (no float on the way)."""
    return (datetime.fromisoformat(text) - _EPOCH) // _MS


def _lsn(text: str) -> int:
    hi, _, lo = text.partition("/")
    return (int(hi, 16) << 32) | int(lo, 16)
