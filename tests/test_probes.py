"""No capability probed by name where a seam declares it: no `hasattr(x, "name")`, no `getattr(x, "name", ...)`.

A probe hides what a seam carries: a renamed method turns a call into a
silent skip, and mypy cannot see it.  Every module of csnd was cleared of
its probes (a typed source, `isinstance(e, grpc.Call)`, an `Interrupted`
that carries its output path, psycopg's RangeInfo by type); this keeps them
so.  A probe on a value of a type that is not ours to declare (argparse's
Namespace, `fcntl`'s platform constants) takes a `vars()` look or a typed
helper instead.  (A `getattr` whose name is a variable -- a log record's
extra keys, a settings table walked by name -- is reflection, not a probe.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLEARED = sorted(p for p in (ROOT / "csnd").rglob("*.py") if not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))


def probes(text: str, name: str) -> list[str]:
    """`hasattr`/`getattr` calls with a literal attribute name in the source `text`, as `name:line: call`."""
    found = []
    for node in ast.walk(ast.parse(text, name)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", CLEARED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_capability_is_probed_by_name(path: Path) -> None:
    assert probes(path.read_text(), str(path.relative_to(ROOT))) == []


def test_the_scan_finds_probes_and_only_probes() -> None:
    text = 'a = getattr(e, "partial", None)\nif hasattr(e, "code"):\n    b = getattr(e, name)\n'
    assert probes(text, "x.py") == ["x.py:1: getattr(e, 'partial', None)", "x.py:2: hasattr(e, 'code')"]
