"""docs/reference.md is what the code says, and the other docs name only flags, variables and metrics that exist.

The reference is generated (scripts/gen_reference.py) from the parsers, the
settings table and the metrics list; a flag, setting or metric added
without regenerating fails here, as in `make lint`.  The prose of the
other docs still names variables and metrics: those names are checked
against the code, so a renamed one cannot linger in a doc.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from csnd.service.metrics import METRICS
from csnd.service.settings import CONFIG_ENV, OTHER_VARIABLES, SETTINGS

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_reference.py"
REFERENCE = ROOT / "docs" / "reference.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", "--out", str(path)], capture_output=True, text=True, cwd=ROOT
    )


def test_the_reference_is_what_the_code_says() -> None:
    done = _check(REFERENCE)
    assert done.returncode == 0, done.stderr


def test_a_stale_reference_fails_the_check(tmp_path: Path) -> None:
    stale = tmp_path / "reference.md"
    stale.write_text(REFERENCE.read_text().replace("`--snapshot WHEN`", "`--snapshot`"))
    done = _check(stale)
    assert done.returncode == 1
    assert "is stale: run `python scripts/gen_reference.py`" in done.stderr


def test_the_reference_holds_every_flag_setting_and_metric() -> None:
    """What the issue found missing in the hand-kept lists is there, with the rest."""
    text = REFERENCE.read_text()
    for s in SETTINGS:
        assert f"`{s.env}`" in text and f"`{s.key}" in text, s.key
    for name in METRICS:
        assert f"`{name}`" in text, name
    for heading in ("`csnd slot list`", "`csnd slot drop`", "`csnd subscriptions reset`", "`csnd snapshot`"):
        assert f"### {heading}" in text, heading
    for flag in ("`--readiness-grace`", "`--health-needs-token`", "`--tls-ca`", "`--append`", "`--replace`"):
        assert flag in text, flag


# Names the docs show as what a typo looks like (the warning for an unknown variable).
MISSPELT_ON_PURPOSE = {"CSND_LISTN"}


def test_the_docs_name_only_variables_that_exist() -> None:
    known = {CONFIG_ENV, *OTHER_VARIABLES, *(s.env for s in SETTINGS), *MISSPELT_ON_PURPOSE}
    for doc in DOCS:
        for name in set(re.findall(r"\bCSND_[A-Z_]*[A-Z]\b", doc.read_text())):
            assert name in known, f"{doc.name} names {name}, which csnd does not read"


def test_the_contract_lists_every_metric() -> None:
    """design.md section 8's metric table (the names dashboards script against) is METRICS, no more, no less."""
    design = (ROOT / "docs" / "design.md").read_text()
    section = design[design.index("## 8. ") : design.index("## 9. ")]
    table = section[section.index("| metric | type | labels | meaning |") :].split("\n\n")[0]
    assert set(re.findall(r"`(csnd_[a-z_]+)`", table)) == set(METRICS)
