"""Prints which csnd packages import which: `python scripts/import_graph.py [--check]`.

Reads the source with `ast` (nothing is imported).  A module belongs to the
package under `csnd.` that holds it (`csnd.reader.live` -> reader; a module
directly in csnd/, like `csnd.cli`, is its own unit).  Every edge is listed
with the modules that make it, so an unwanted dependency names its culprit.

--check fails when an edge breaks the layering the project keeps:

    core                    imports nothing of ours
    reader, decoder,        import core and the stages upstream of them
    sender, coordinator     (reader -> decoder -> sender -> coordinator)
    consumers, gtm          import core, proto and the stages
    runtime                 wires the stages together (core, proto and the stages;
                            never the command line, the demo or testing)
    cli                     the thin shell on top: anything
    testing                 imports core and what it writes recordings with
                            (reader, gtm); imported by tests, the demo and bench only
"""

from __future__ import annotations

import ast
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folders at the top of the repository that csnd/<name> links to.
STAGES = ("reader", "decoder", "sender", "coordinator", "consumers", "gtm", "proto")
# What each package may import (besides itself); missing: anything.
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "proto": set(),
    "reader": {"core"},
    "decoder": {"core", "reader"},
    "sender": {"core", "reader", "decoder"},
    "coordinator": {"core", "reader", "decoder", "sender", "proto"},
    "gtm": {"core", "reader", "proto"},
    "runtime": {"core", "reader", "decoder", "sender", "coordinator", "proto"},
    "testing": {"core", "reader", "gtm"},
}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "csnd" or len(parts) < 2:
        return None
    return parts[1]


def modules() -> dict[str, str]:
    """module name -> file, for csnd/ and the stage folders it links to."""
    found: dict[str, str] = {}
    for top, prefix in [("csnd", "csnd"), *((s, f"csnd.{s}") for s in STAGES)]:
        base = os.path.join(ROOT, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for f in filenames:
                if f.endswith(".py") and "_pb2" not in f:
                    rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].replace(os.sep, ".")
                    name = prefix if rel == "__init__" else f"{prefix}.{rel.removesuffix('.__init__')}"
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


def main() -> int:
    edges = graph()
    bad = []
    for (src, dst), who in sorted(edges.items()):
        allowed = ALLOWED.get(src)
        flag = "" if allowed is None or dst in allowed else "   <-- breaks the layering"
        if flag:
            bad.append((src, dst))
        print(f"{src:>12} -> {dst:<12} {', '.join(sorted(who))}{flag}")
    if "--check" in sys.argv[1:] and bad:
        print(f"import_graph: {len(bad)} edge(s) break the layering", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
