"""gRPC Status and /api/status are one answer: the same fields, the same figures.

The dashboard's document used to be the servicer's answer with `totals` and
`snapshot` added on the side, so a gRPC client of a running `csnd serve`
saw neither what the run had appended nor its initial snapshot.  Both now
come from one builder (`csnd.service.status.build_status`); here a live
node is served with an initial snapshot and a few streamed transactions,
and the two answers are compared field by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.proto.changefeed.v1 import changefeed_pb2_grpc as pb_grpc
from tests.fixtures.pg import PgDatabase
from tests.service.servekit import Served, start_serve, wait_for

# Figures that are when the answer was taken, not what it says.
TAKEN_AT = ("time_us",)


def _grpc_status(address: str) -> dict[str, Any]:
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.ChangefeedStub(channel).Status(pb.StatusRequest(), timeout=30)
    doc: dict[str, Any] = json_format.MessageToDict(
        answer, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return doc


def _without_time(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in TAKEN_AT}


def _agreeing(served: Served) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(gRPC answer, /api/status) taken between two gRPC answers that agree (None: the figures moved)."""
    before = _grpc_status(served.address)
    document = served.status()
    after = _grpc_status(served.address)
    if _without_time(before) != _without_time(after):
        return None  # (a figure moved meanwhile: a keepalive's WAL position, a slot poll; look again)
    return after, document


def test_grpc_status_and_api_status_agree_field_by_field(pg: PgDatabase, tmp_path: Path) -> None:
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY, v text)")
    pg.execute("INSERT INTO acct SELECT i, 'v' || i FROM generate_series(1, 30) AS i")
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    source = f"dn1={pg.url}?slot=csnd&publication=csnd_pub&snapshot=initial"
    served = start_serve([source], str(tmp_path / "log"))
    try:
        wait_for(lambda: served.status().get("snapshot", {}).get("state") == "complete", "the snapshot")
        for i in range(31, 34):
            pg.execute("INSERT INTO acct VALUES (%s, 'streamed')", (i,))
        wait_for(lambda: int(served.status()["totals"]["transactions"]) >= 3, "the streamed transactions")
        grpc_doc, api_doc = wait_for(
            lambda: _agreeing(served), "two gRPC answers with nothing moving between"
        )
    finally:
        code, err = served.terminate()
    assert code == 0, err
    assert set(grpc_doc) == set(api_doc), (sorted(grpc_doc), sorted(api_doc))
    for field in sorted(set(grpc_doc) - set(TAKEN_AT)):
        assert grpc_doc[field] == api_doc[field], (field, grpc_doc[field], api_doc[field])
    # (what was compared holds figures: the run's totals and its initial snapshot)
    assert int(grpc_doc["totals"]["transactions"]) >= 3
    assert grpc_doc["snapshot"]["state"] == "complete"
    assert [t["table"] for t in grpc_doc["snapshot"]["tables"]] == ["acct"]
    assert [n["name"] for n in grpc_doc["nodes"]] == ["dn1"]
