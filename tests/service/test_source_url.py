"""A source URL keeps libpq's own parameters as libpq reads them once csnd's are taken off."""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict

from csnd.runtime.options import LiveSourceConfig
from csnd.service.config import split_source


def test_a_libpq_parameter_with_spaces_reaches_libpq_intact() -> None:
    """`options=-c%20wal_sender_timeout%3D5s`: libpq decodes %20, never '+', as a space."""
    served = split_source(
        "dn1=postgresql://u@h:5432/db?slot=s&options=-c%20wal_sender_timeout%3D5s&sslmode=disable",
        LiveSourceConfig(),
    )
    params = conninfo_to_dict(served.target)
    assert params["options"] == "-c wal_sender_timeout=5s"
    assert params["sslmode"] == "disable" and "slot" not in params
