"""The line between each package's public API and its internals, kept (as trio's test_exports keeps its own).

Each package of csnd states its API in its `__init__`: `__all__` lists the
names and the submodules other packages may use, and its docstring says
which of them are for users.  What it does not list is internal to it:
importable by its own modules and by the tests, by no other package.
Modules were not renamed with a leading underscore: the layout is shared
by every stage's tests and by scripts that import module paths, and a
listed `__all__` that a test holds draws the same line without moving them.

    a name in a package's `__all__` exists (an attribute, or a submodule)
    no module of csnd imports across packages what they keep internal:
        a name with a leading underscore, a module no `__all__` lists, or a
        name a module's own `__all__` leaves out
    docs/reference.md lists each package's `__all__` as the code has it
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parent.parent
CSND: Final = ROOT / "csnd"
# Crossings into the packages whose `__all__` their own change will list (each entry the
# importing module, then the module and name it imports).  The test fails when one is no
# longer made, so the list only shrinks.  (None now: every package lists what others import.)
PENDING: Final[frozenset[tuple[str, str, str | None]]] = frozenset()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache  # (asked for every imported name the checks look at: walking csnd/ each time took 20 s)
def sources() -> dict[str, Path]:
    """Every module of csnd but the generated ones, by name."""
    return {module_name(p): p for p in sorted(CSND.rglob("*.py")) if "_pb2" not in p.name}


@cache
def declared_all(module: str) -> tuple[str, ...] | None:
    """A module's API, read without importing it: its literal `__all__`, or else (a package that
    re-exports as PEP 484 says, `from .x import Name as Name`) the names it re-exports so; None: neither."""
    path = sources().get(module)
    if path is None:
        return None
    body = ast.parse(path.read_text()).body
    for node in body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return tuple(ast.literal_eval(node.value))
    reexported = tuple(
        alias.name
        for node in body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.asname == alias.name
    )
    return reexported if reexported and path.name == "__init__.py" else None


def is_package(module: str) -> bool:
    path = sources().get(module)
    return path is not None and path.name == "__init__.py"


def packages() -> list[str]:
    return [m for m in sources() if is_package(m)]


def top_package(module: str) -> str:
    """csnd.X for every module under csnd/X/; csnd itself for csnd's own top-level modules."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and is_package(".".join(parts[:2])) else "csnd"


def crossing_refused(importer: str, module: str, name: str | None) -> str | None:
    """Why `importer` may not import `name` from `module` (None: it may); name None: the module itself."""
    if module == "csnd" or top_package(module) == top_package(importer):
        return None
    if name is not None and name.startswith("_") and not (name.startswith("__") and name.endswith("__")):
        return f"{name} is internal (a leading underscore)"
    parts = module.split(".")
    for depth in range(2, len(parts) + 1):
        package = ".".join(parts[:depth])
        exported = declared_all(package) if is_package(package) else None
        if name is not None and exported is not None and name in exported and is_package(package):
            return None  # (re-exported by a package on the way: public from any of its modules)
        if depth == len(parts):
            break
        child = parts[depth]
        if child.startswith("_"):
            return f"{package}.{child} is internal (a leading underscore)"
        if exported is None or child not in exported:
            return f"{package}.{child} is internal to {package} (not in its __all__)"
    if name is None:
        return None
    own = declared_all(module)
    if is_package(module):
        return f"{name} is not in {module}.__all__"
    if own is not None and name not in own:
        return f"{name} is not in {module}.__all__"
    return None


@dataclass(frozen=True)
class Crossing:
    importer: str
    line: int
    module: str
    name: str | None
    why: str


def crossings() -> list[Crossing]:
    found = []
    for importer, path in sources().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("csnd")
            ):
                assert node.module is not None
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    if target in sources():  # (a submodule: `from csnd.core import backoff`)
                        why = crossing_refused(importer, target, None)
                    else:
                        why = crossing_refused(importer, node.module, alias.name)
                    if why is not None:
                        found.append(Crossing(importer, node.lineno, node.module, alias.name, why))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("csnd."):
                        why = crossing_refused(importer, alias.name, None)
                        if why is not None:
                            found.append(Crossing(importer, node.lineno, alias.name, None, why))
    return found


@pytest.mark.parametrize("package", packages())
def test_every_package_states_its_api(package: str) -> None:
    exported = declared_all(package)
    assert exported is not None, f"{package}/__init__.py declares no __all__ (nor re-exports `X as X`)"
    assert list(exported) == sorted(set(exported), key=exported.index), f"{package}.__all__ repeats a name"
    doc = ast.get_docstring(ast.parse(sources()[package].read_text()))
    assert doc, f"{package} has no docstring saying what it offers"


@pytest.mark.parametrize("package", packages())
def test_every_name_in_all_exists(package: str) -> None:
    module = importlib.import_module(package)
    for name in declared_all(package) or ():
        if not hasattr(module, name):
            importlib.import_module(f"{package}.{name}")  # (a public submodule)


def test_no_package_imports_what_another_keeps_internal() -> None:
    found = crossings()
    refused = [
        f"{c.importer}:{c.line}: from {c.module} import {c.name}: {c.why}"
        for c in found
        if (c.importer, c.module, c.name) not in PENDING
    ]
    assert refused == []
    gone = PENDING - {(c.importer, c.module, c.name) for c in found}
    assert not gone, f"no longer imported (take them out of PENDING): {sorted(gone)}"


def test_the_check_refuses_each_kind_of_internal_import() -> None:
    """(the rule itself, on names the packages keep internal today)"""
    assert crossing_refused("csnd.service.server", "csnd.consumers.client", "_anything") is not None
    assert crossing_refused("csnd.service.server", "csnd.consumers.delivery", "Delivery") is not None
    assert crossing_refused("csnd.service.server", "csnd.consumers.client", "ChangefeedClient") is None
    assert crossing_refused("csnd.consumers.client", "csnd.consumers.delivery", "Delivery") is None
    assert crossing_refused("csnd.cli", "csnd.runtime.window", None) is not None


def test_the_reference_lists_each_package_s_api() -> None:
    text = (ROOT / "docs" / "reference.md").read_text()
    section = text.split("\n## Python packages\n", 1)
    assert len(section) == 2, "docs/reference.md has no Python packages section"
    listed = dict(re.findall(r"^### `(csnd[\w.]*)`\n\n(?:.*\n)*?Public: (.*)$", section[1], re.M))
    for package in packages():
        names = ", ".join(f"`{n}`" for n in declared_all(package) or ())
        assert listed.get(package) == (names or "nothing"), package
