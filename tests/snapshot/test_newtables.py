"""Tables new to a GTM-mode `when_needed` publication: a job with the GTM, a warning without it.

`look_for_new_tables` against a live server, as the job thread calls it:
the first look takes the publication as it is, a table added afterwards is
new.  A GTM-mode node with `--gtm` gets a job for it, as a single-mode node
does (its watermarks then take CSNs from the GTM); without `--gtm` the
table is named in one warning, not counted as known (a start with `--gtm`
takes it), and not submitted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from csnd.snapshot import newtables
from csnd.snapshot.jobstore import Known, NodeAccess
from tests.fixtures.pg import PgDatabase


def _look(access: NodeAccess, known: Known) -> list[tuple[list[str], str]]:
    submitted: list[tuple[list[str], str]] = []

    def submit(specs: list[str], node: str) -> object:
        submitted.append((specs, node))
        return None

    def update(change: Callable[[], None]) -> None:
        change()

    newtables.look_for_new_tables({access.node: access}, known, submit, update)
    return submitted


@pytest.mark.parametrize("gtm", [None, "postgresql://gtm/db"])
def test_a_table_new_to_a_gtm_mode_when_needed_publication(
    pg: PgDatabase, gtm: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    pg.execute("CREATE TABLE acct (id int PRIMARY KEY)")
    pg.execute("CREATE TABLE item (id int PRIMARY KEY)")
    pg.execute("CREATE PUBLICATION wn_pub FOR TABLE acct")
    node = f"wn{0 if gtm is None else 1}"
    newtables._told_no_gtm.discard(node)
    access = NodeAccess(node, pg.dsn, "wn_pub", True, "gtm", lambda: [], when_needed=True, gtm=gtm)
    known: Known = {}
    assert _look(access, known) == [] and known == {node: [["public", "acct"]]}  # (as it is at first)
    pg.execute("ALTER PUBLICATION wn_pub ADD TABLE item")
    with caplog.at_level(logging.WARNING, logger="csnd.snapshot"):
        first, second = _look(access, known), _look(access, known)
    told = [r.getMessage() for r in caplog.records if "public.item" in r.getMessage()]
    if gtm is not None:
        assert first == [(["public.item"], node)] and second == [] and not told
        assert known[node] == [["public", "acct"], ["public", "item"]]
    else:
        assert first == second == [] and known[node] == [["public", "acct"]]  # (left for a start with --gtm)
        assert len(told) == 1 and "--gtm" in told[0] and node in told[0], told
