"""check_modes: only node sets with a common commit order may be merged."""

from __future__ import annotations

import pytest

from csnd.core.errors import ConfigError
from csnd.core.modes import check_modes


def test_valid_sets() -> None:
    assert check_modes({"dn1": "single"}) == "single"
    assert check_modes({"dn1": "gtm"}) == "gtm"
    assert check_modes({"dn1": "gtm", "dn2": "gtm", "dn3": "gtm"}) == "gtm"


def test_several_plain_nodes_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        check_modes({"pg1": "single", "pg2": "single"})
    text = str(info.value)
    assert "pg1" in text and "pg2" in text and "no common order" in text


def test_mixed_modes_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        check_modes({"dn1": "gtm", "pg": "single", "dn2": "gtm"})
    text = str(info.value)
    assert "pg" in text and "dn1, dn2" in text and "gtm" in text


def test_unknown_mode_and_no_nodes() -> None:
    with pytest.raises(ConfigError, match="node dn2: unknown csn mode 'lsn'"):
        check_modes({"dn1": "gtm", "dn2": "lsn"})
    with pytest.raises(ConfigError):
        check_modes({})
