"""The runtime's seams say what they carry: no capability looked up by name, ids typed.

A capability an input, a source or a sink may have is declared where it is
made -- `csnd.runtime.sources.LiveNode` / `RecordedNode`, a sink's
`group_commit` -- and handed to whoever uses it, never probed with
`hasattr`/`getattr`.  And the ids that cross a seam carry their `NewType`
(csnd.core.ids), so mypy strict refuses a CSN confirmed to a slot.
"""

from __future__ import annotations

import ast
from pathlib import Path

from mypy import api

RUNTIME = Path(__file__).resolve().parents[2] / "csnd" / "runtime"
# getattr kept for what is no seam: a log record's `extra` fields are its
# attributes (logging's own interface), and argparse's subcommands differ in
# their arguments.
NOT_A_SEAM = {"logsetup.py", "slot_cmd.py"}


def _probes_in(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("hasattr", "getattr")
            ):
                found.append(f"{path.relative_to(RUNTIME.parent)}:{node.lineno} {node.func.id}")
    return found


def _probes(root: Path) -> list[str]:
    return _probes_in([path for path in sorted(root.glob("*.py")) if path.name not in NOT_A_SEAM])


def test_the_runtime_probes_no_capability_by_name() -> None:
    assert _probes(RUNTIME) == []


def test_the_stages_seams_probe_no_capability_by_name() -> None:
    """Reader -> decoder pool -> sender -> merge: each takes what the one before hands it by its type.

    (Not the decoder package's module `__getattr__`: that is its lazy import of the decoding layer.)
    """
    csnd = RUNTIME.parent
    seams = [csnd / "reader" / "events.py"]
    seams += [
        csnd / "decoder" / name for name in ("pool.py", "feed.py", "messages.py", "worker.py", "change.py")
    ]
    seams += sorted((csnd / "sender").glob("*.py")) + sorted((csnd / "coordinator").glob("*.py"))
    assert _probes_in(seams) == []


# Every line but the first is a mix-up the types exist to catch.
_MIXED_UP = """
from csnd.core.ids import Csn
from csnd.reader.live import LiveOptions, LiveSource
from csnd.runtime.inputs import NodeInput
from csnd.runtime.sources import SlotSource

def mixed_up(p: NodeInput, s: SlotSource, live: LiveSource, csn: Csn) -> None:
    p.confirm(csn)
    p.confirm_final(csn)
    s.confirm(csn)
    live.confirm(csn)
    live.confirm_final(csn)
    LiveOptions("postgresql://", "slot", "pub", until_lsn=csn)
"""


def test_a_csn_confirmed_to_a_slot_is_a_type_error(tmp_path: Path) -> None:
    snippet = tmp_path / "mixed_up.py"
    snippet.write_text(_MIXED_UP, encoding="utf-8")
    config = str(RUNTIME.parents[1] / "pyproject.toml")
    out, err, _ = api.run(["--strict", "--no-color-output", "--config-file", config, str(snippet)])
    errors = [line for line in out.splitlines() if "mixed_up.py:" in line and '"Csn"' in line]
    assert len(errors) == 6, out + err
