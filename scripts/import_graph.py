"""Prints which csnd packages import which: `python scripts/import_graph.py [--check]`.

Reads the source with `ast` (nothing is imported).  A module belongs to the
package under `csnd.` that holds it (`csnd.reader.live` -> reader; a module
directly in csnd/, like `csnd.cli`, is its own unit).  Every edge is listed
with the modules that make it, so an unwanted dependency names its culprit.

--check denies by default: every unit has its allowed imports listed in
ALLOWED below, and fails on an edge that is not listed, on a unit that has
no entry (a new package must say what it may import), and on an entry for a
unit that no longer exists.  The layering it keeps:

    core                    imports nothing of ours
    proto                   the generated wire schema: nothing of ours
    reader, decoder,        core and the stages upstream of them
    sender, coordinator     (reader -> decoder -> sender -> coordinator; the
                            coordinator also proto, for the node agent's wire)
    changelog               core, and the coordinator's JSON line format for the
                            relation lines it keeps: the service's durable log
    gtm                     core and reader (it writes recorded streams)
    consumers               core and proto: a consumer reaches the service only
                            over the wire, never its code or the stages (Spark
                            executors import it)
    snapshot                core, the stages that render its rows, the changelog;
                            gtm, through which a GTM-mode watermark commits
    runtime                 wires the stages together: core, proto and the stages;
                            never the service, the command line, the demo or testing
    service                 core, proto, the stages, the changelog, runtime and snapshot;
                            the consumers' row schema too (its Parquet export); gtm
                            (the commit barrier of a GTM-mode snapshot)
    testing                 core and what it writes recordings with (reader, gtm);
                            imported by tests, the demo and bench only
    demo                    core, gtm and testing (it starts its servers)
    cli                     the thin shell on top: the commands' packages
    csnd                    the package root (`csnd/__init__.py`): nothing
"""

from __future__ import annotations

import ast
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What each unit may import (besides itself).  Every unit is listed: a unit
# missing here fails --check, so a new package states its place.
STAGES_UP_TO_SENDER: set[str] = {"core", "reader", "decoder", "sender"}
ALLOWED: dict[str, set[str]] = {
    "csnd": set(),
    "core": set(),
    "proto": set(),
    "reader": {"core"},
    "decoder": {"core", "reader"},
    "sender": {"core", "reader", "decoder"},
    "coordinator": STAGES_UP_TO_SENDER | {"proto"},
    "changelog": {"core", "coordinator"},
    "gtm": {"core", "reader"},
    "consumers": {"core", "proto"},
    "snapshot": {"core", "reader", "decoder", "coordinator", "changelog", "gtm"},
    "runtime": STAGES_UP_TO_SENDER | {"coordinator", "proto"},
    "service": STAGES_UP_TO_SENDER
    | {"coordinator", "changelog", "proto", "runtime", "snapshot", "consumers", "gtm"},
    "testing": {"core", "reader", "gtm"},
    "demo": {"core", "gtm", "testing"},
    "cli": {"core", "reader", "decoder", "gtm", "consumers", "runtime", "service", "demo"},
}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "csnd" or len(parts) < 2:
        return None
    return parts[1]


def modules() -> dict[str, str]:
    """module name -> file, for every package of csnd/ (each has its one home there)."""
    found: dict[str, str] = {}
    base = os.path.join(ROOT, "csnd")
    for dirpath, _dirnames, filenames in os.walk(base):
        for f in filenames:
            if f.endswith(".py") and "_pb2" not in f:
                rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].replace(os.sep, ".")
                name = "csnd" if rel == "__init__" else f"csnd.{rel.removesuffix('.__init__')}"
                found[name] = os.path.join(dirpath, f)
    return found


def imports_of(path: str) -> set[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def graph() -> dict[tuple[str, str], set[str]]:
    known = modules()
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, path in known.items():
        src = package_of(name) or name
        for imp in imports_of(path):
            dst = package_of(imp)
            if dst is None or dst == src or (f"csnd.{dst}" not in known and imp not in known):
                continue
            edges[(src, dst)].add(name)
    return edges


def units(known: dict[str, str]) -> set[str]:
    """Every unit the modules fall into (`csnd` itself for the package root)."""
    return {package_of(name) or name for name in known}


def main() -> int:
    known = modules()
    edges = graph()
    bad = []
    for (src, dst), who in sorted(edges.items()):
        allowed = ALLOWED.get(src)
        flag = "" if allowed is not None and dst in allowed else "   <-- breaks the layering"
        if flag:
            bad.append((src, dst))
        print(f"{src:>12} -> {dst:<12} {', '.join(sorted(who))}{flag}")
    found = units(known)
    problems = [f"import_graph: {src} -> {dst} is not in ALLOWED[{src!r}]" for src, dst in bad]
    problems += [
        f"import_graph: package {u} has no entry in ALLOWED: list what it may import"
        for u in sorted(found - ALLOWED.keys())
    ]
    problems += [
        f"import_graph: ALLOWED names {u}, which is no package of csnd (renamed or removed?)"
        for u in sorted((ALLOWED.keys() | set().union(*ALLOWED.values())) - found)
    ]
    if "--check" in sys.argv[1:] and problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
