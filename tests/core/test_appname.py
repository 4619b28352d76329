"""Whose `application_name` a connection gets: the operator's, else csnd's for this command."""

from __future__ import annotations

import pytest

from csnd.core.appname import ENV, default_application_name, for_node


def test_the_operators_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "etl-nightly")
    default_application_name("serve")
    assert for_node("postgresql://h/db", "dn1") == {}


def test_a_name_an_earlier_csnd_command_left_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """`csnd generate` run in a process (or a parent's name) must not name a later `csnd serve`."""
    monkeypatch.setenv(ENV, "csnd generate")
    default_application_name("serve")
    assert for_node("postgresql://h/db", "dn1") == {"application_name": "csnd serve dn1"}


def test_a_url_that_names_itself_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    default_application_name("serve")
    assert for_node("postgresql://h/db?application_name=ops", "dn1") == {}
