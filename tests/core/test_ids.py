"""LSN and time text forms."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from csnd.core.ids import PG_EPOCH, pg_time_to_datetime, pg_time_to_iso

_MIN_US = -int((PG_EPOCH.replace(tzinfo=None) - PG_EPOCH.replace(tzinfo=None).min).total_seconds() * 1e6)


@given(
    st.one_of(st.integers(_MIN_US, 10**17), st.integers(-(10**12), 10**12), st.sampled_from([0, -1, 10**6]))
)
def test_commit_time_text_is_what_isoformat_writes(us: int) -> None:
    assert pg_time_to_iso(us) == pg_time_to_datetime(us).isoformat()
