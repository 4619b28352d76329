"""The final confirmation of a live source that was stopped before anything of it was durable."""

from __future__ import annotations

from csnd.core.ids import Lsn, lsn_from_str
from csnd.reader.live import LiveOptions, LiveSource
from tests.fixtures.pg import PgDatabase


def _confirmed(pg: PgDatabase) -> int:
    (row,) = pg.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'csnd'")
    return lsn_from_str(str(row[0]))


def test_a_final_confirmation_of_nothing_leaves_the_slot_alone(pg: PgDatabase) -> None:
    """A service stopped right after it started confirms its runtime's safe position, 0: not an LSN.

    It used to ask the server to advance the slot to 0/0, which it refuses
    ("invalid target WAL LSN"), so the stop failed with exit 1.
    """
    pg.execute("CREATE PUBLICATION csnd_pub FOR ALL TABLES")
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    before = _confirmed(pg)
    LiveSource("dn1", LiveOptions(pg.url, "csnd", "csnd_pub")).confirm_final(Lsn(0))
    assert _confirmed(pg) == before
