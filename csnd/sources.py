"""SOURCE arguments (DESIGN section 8): `[NAME=]PATH` or `[NAME=]postgresql://...`."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from csnd.core.errors import ConfigError
from csnd.core.ids import lsn_from_str

_NAME_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.+)$")


@dataclass
class SourceSpec:
    name: str | None
    target: str

    @property
    def is_live(self) -> bool:
        return self.target.startswith(("postgresql://", "postgres://")) or (
            "=" in self.target and "host" in self.target and not os.path.exists(self.target)
        )

    @property
    def is_grpc(self) -> bool:
        return self.target.startswith("grpc://")


def parse_source(text: str) -> SourceSpec:
    if text.startswith(("postgresql://", "postgres://", "grpc://")):
        return SourceSpec(None, text)
    m = _NAME_RE.match(text)
    if m and not os.path.exists(text):
        return SourceSpec(m.group(1), m.group(2))
    return SourceSpec(None, text)


def parse_lsn_arg(text: str) -> int:
    try:
        return lsn_from_str(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None
