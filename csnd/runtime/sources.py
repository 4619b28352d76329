"""SOURCE arguments (docs/design.md section 8).

A SOURCE is `[NAME=]PATH`, `[NAME=]postgresql://...` or `grpc://HOST:PORT`.

`parse_source` reads the text (no I/O beyond asking whether a file of that
name exists); `open_source` makes the reader-side object for one: a live
node's `LiveSource` or a `RecordedSource` (a node agent is a whole node input
of its own: `csnd.runtime.remote`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from csnd.core.errors import ConfigError
from csnd.core.ids import lsn_from_str
from csnd.core.modes import check_modes
from csnd.runtime.config import LiveSourceConfig

if TYPE_CHECKING:  # (only for types: each is imported where it is opened, as late as it can be)
    from csnd.reader.live import LiveSource
    from csnd.reader.recorded import RecordedSource
    from csnd.runtime.inputs import NodeInput, NodeSource

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

    @property
    def is_file(self) -> bool:
        return not self.is_live and not self.is_grpc


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


def open_live(spec: SourceSpec, live: LiveSourceConfig, default_name: str = "dn1") -> LiveSource:
    """The `LiveSource` of a live node's SOURCE (not yet connected)."""
    from csnd.reader.live import LiveSource

    return LiveSource(spec.name or default_name, live.options(spec.target), mode=live.mode)


def open_source(spec: SourceSpec, live: LiveSourceConfig, index: int) -> LiveSource | RecordedSource:
    """A live node's or a recorded file's source object; `index` names an unnamed live node dn<index+1>.

    Both are a `csnd.runtime.inputs.NodeSource`.  A caller that does more with
    a live node (prepares its slot) opens it with `open_live`.
    """
    if spec.is_grpc:
        raise ConfigError(f"{spec.target} is a node agent, not a source to read")
    if spec.is_live:
        return open_live(spec, live, f"dn{index + 1}")
    if not os.path.exists(spec.target):
        raise ConfigError(f"source {spec.target!r}: no such file (a live node is postgresql://...)")
    from csnd.reader.recorded import RecordedSource

    return RecordedSource(spec.target, name=spec.name)


def check_nodes(opened: Sequence[NodeSource | NodeInput]) -> None:
    """The opened sources of one run: unique node names and CSN modes that can be merged (ConfigError)."""
    names = [s.node for s in opened]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"node name {sorted(dup)[0]!r} is used by several sources; name them NAME=SOURCE")
    check_modes({s.node: s.mode for s in opened})
