"""A source naming several hosts (libpq's failover form) is shown, watched and served like any other.

libpq takes the hosts two ways, `postgresql://u@a:p1,b:p2/db` and
`postgresql://u@/db?host=a,b&port=p1,p2`; `target_session_attrs=read-write`
then picks the primary.  Status shows the source without a password either
way, and never breaks on a netloc that holds more than one port.
"""

from __future__ import annotations

from csnd.runtime.options import LiveSourceConfig
from csnd.service.config import split_source
from csnd.service.serve_sources import safe_target, slot_of

HOSTS_IN_NETLOC = (
    "dn1=postgresql://app:secret@10.0.0.1:5432,10.0.0.2:5433/shop"
    "?target_session_attrs=read-write&slot=s1&publication=p"
)
HOSTS_AS_PARAMETERS = (
    "dn1=postgresql://app:secret@/shop?host=10.0.0.1,10.0.0.2&port=5432,5433"
    "&target_session_attrs=read-write&slot=s1&publication=p"
)


def test_hosts_in_the_netloc_are_shown_without_the_password() -> None:
    src = split_source(HOSTS_IN_NETLOC, LiveSourceConfig())
    shown = safe_target(src)
    assert shown == "postgresql://app@10.0.0.1:5432,10.0.0.2:5433/shop", shown


def test_hosts_as_parameters_are_shown_with_their_hosts() -> None:
    src = split_source(HOSTS_AS_PARAMETERS, LiveSourceConfig())
    shown = safe_target(src)
    assert "secret" not in shown
    assert shown == "postgresql://app@/shop?host=10.0.0.1,10.0.0.2&port=5432,5433", shown


def test_a_password_given_as_a_parameter_is_never_shown() -> None:
    src = split_source(
        "postgresql://app@/shop?host=h1,h2&password=secret&slot=s&publication=p", LiveSourceConfig()
    )
    assert "secret" not in safe_target(src)


def test_the_slot_monitor_connects_with_every_host() -> None:
    for spec in (HOSTS_IN_NETLOC, HOSTS_AS_PARAMETERS):
        src = split_source(spec, LiveSourceConfig())
        slot = slot_of(src)
        assert slot is not None and slot.slot == "s1"
        assert "10.0.0.2" in slot.conninfo and "target_session_attrs=read-write" in slot.conninfo
