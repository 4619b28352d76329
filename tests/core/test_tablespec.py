"""Table filter syntax (csnd.core.tablespec): `schema.table`, `schema.*`, double-quoted parts."""

from __future__ import annotations

import pytest

from csnd.core.tablespec import parse_table


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ("public.acct", ("public", "acct")),
        ('public."a.b"', ("public", "a.b")),
        ('"my ""s"".x".t', ('my "s".x', "t")),
        ("ünï.çode", ("ünï", "çode")),
        ("public.*", ("public", None)),
        ('public."*"', ("public", "*")),
    ],
)
def test_parse_table(spec: str, expect: tuple[str, str | None]) -> None:
    assert parse_table(spec) == expect


@pytest.mark.parametrize("spec", ["acct", "", ".acct", "public.", "a.b.c", 'a."b', "a b.c", "*.acct"])
def test_parse_table_refuses(spec: str) -> None:
    with pytest.raises(ValueError, match=r"is not SCHEMA\.TABLE"):
        parse_table(spec)
