"""Which implementation runs: a compiled module, or the Python twins it was written from.

Each of csnd's C modules (`setup.py`) has a pure-Python twin that is its
specification, its fallback where no C compiler was there at install, and
what `CSND_IMPL=python` in the environment runs on purpose (to compare
them); tests hold each pair to the same output.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def twins_asked() -> bool:
    """Whether `CSND_IMPL=python` asks for the Python twins."""
    return os.environ.get("CSND_IMPL", "").lower() == "python"


def compiled_module(name: str) -> ModuleType | None:
    """The compiled module `name`, unless it was not built or the twins are asked for."""
    if twins_asked():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # (no compiler at install: the twins run)
        return None
