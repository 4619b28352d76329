"""Which implementation runs: a compiled module, or the Python twins it was written from.

Each of csnd's C modules (`setup.py`) has a pure-Python twin that is its
specification, its fallback where no C compiler was there at install, and
what `CSND_IMPL=python` in the environment runs on purpose (to compare
them; `CSND_IMPL=python:csnd.decoder._rows` for one module's); tests hold
each pair to the same output.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def twins_asked() -> bool:
    """Whether `CSND_IMPL=python` asks for the Python twins (of every module)."""
    return os.environ.get("CSND_IMPL", "").lower() == "python"


def twin_asked(name: str) -> bool:
    """Whether the twin of module `name` is asked for: `CSND_IMPL=python`, or `python:NAME[,NAME...]`.

    (The second form runs one module's twin beside the others compiled, as
    bench/types_bench.py does to measure one C module against its twin.)
    """
    impl = os.environ.get("CSND_IMPL", "").lower()
    if impl == "python":
        return True
    kind, _, names = impl.partition(":")
    return kind == "python" and name.lower() in names.split(",")


def compiled_module(name: str) -> ModuleType | None:
    """The compiled module `name`, unless it was not built or its twin is asked for."""
    if twin_asked(name):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # (no compiler at install: the twins run)
        return None
