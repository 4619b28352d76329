"""SOURCE arguments (docs/design.md section 8), and what a node pipeline may do with each kind of source.

A SOURCE is `[NAME=]PATH`, `[NAME=]postgresql://...` or `grpc://HOST:PORT`.

`parse_source` reads the text (no I/O beyond asking whether a file of that
name exists); `open_source` makes the reader-side object for one and says
which kind it is: a `LiveNode` (a live node's `LiveSource`: a slot to
confirm, a stream that pauses) or a `RecordedNode` (a `RecordedSource`: a
file read from start to end).  A node agent is a whole node input of its
own (`csnd.runtime.remote`).

The kinds are declared here, where the source is opened, and a pipeline is
given one: it never asks a source by name what it can do.  `NodeSource` is
what every source has; `SlotSource` and `FileSource` add what only a live
node or only a file has.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from csnd.core.errors import ConfigError
from csnd.core.ids import Lsn, lsn_from_str
from csnd.core.modes import check_modes
from csnd.runtime.options import LiveSourceConfig

if TYPE_CHECKING:  # (only for types: each is imported where it is opened, as late as it can be)
    from csnd.reader.events import EventStream, PauseListener
    from csnd.reader.live import LiveOptions, LiveSource
    from csnd.runtime.inputs import NodeInput


class NodeSource(Protocol):
    """What a node pipeline reads from every source (csnd.reader)."""

    node: str
    mode: str  # "gtm" or "single" (csnd.core.modes)
    binary: bool  # pgoutput's binary mode: how the decoders read values

    def events(self, raw_changes: bool = False) -> EventStream:
        """The stream; `raw_changes`: row changes as unparsed `ChangeFrames` runs.

        A pipeline's decoder pool closes it in the thread that reads it when it stops early.
        """

    def enum_types(self) -> list[tuple[int, int]]:
        """(type OID, array type OID) of the source's enums, which binary pgoutput sends as labels."""

    def user_types(self) -> list[tuple[int, str, int, int]]:
        """The source's enums, composites, ranges, multiranges and domains (`decoder.rows.USER_TYPES_QUERY`)."""

    def confirm(self, lsn: Lsn) -> None:
        """Everything committed before `lsn` is durable downstream (a file: nothing to do)."""

    def close(self) -> None:
        """Stop reading and let go of the source (idempotent; from any thread)."""


class FileSource(NodeSource, Protocol):
    """A recorded file (`RecordedSource`): no slot, read from its start to its end."""

    path: str  # (named in a read error)

    def read_fraction(self) -> float | None:
        """How much of the file has been read, 0.0-1.0 (None for a pipe)."""


class SlotSource(NodeSource, Protocol):
    """A live node (`LiveSource`): a replication slot confirmed as the output becomes durable."""

    options: LiveOptions  # its slot, conninfo and `until_lsn`
    reconnecting: bool  # between connections (for status)

    def events(self, raw_changes: bool = False, pauses: PauseListener | None = None) -> EventStream:
        """As `NodeSource.events`; `pauses` is told, in the thread iterating it, when the stream pauses.

        A pipeline gives its decoder pool, so that a batch gathered there goes
        on when the server has nothing more to send.
        """

    @property
    def received_lsn(self) -> int:
        """The newest WAL position the server has sent (any thread)."""

    @property
    def confirmed_lsn(self) -> int:
        """The position confirmed to the slot so far (any thread)."""

    def prepare(self) -> object:
        """The slot at its consistent point (made now if asked), in the calling thread."""

    def confirm_final(self, lsn: Lsn) -> None:
        """As `confirm`, once the stream has ended: the slot moves although streaming stopped."""


@dataclass(frozen=True)
class LiveNode:
    """A live node's source, opened: a pipeline over it confirms its slot and passes on its pauses."""

    source: SlotSource

    @property
    def node(self) -> str:
        return self.source.node

    @property
    def mode(self) -> str:
        return self.source.mode


@dataclass(frozen=True)
class RecordedNode:
    """A recorded file, opened: a pipeline over it has no slot and reads it to its end."""

    source: FileSource

    @property
    def node(self) -> str:
        return self.source.node

    @property
    def mode(self) -> str:
        return self.source.mode


OpenedSource = LiveNode | RecordedNode


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


def parse_lsn_arg(text: str) -> Lsn:
    try:
        return lsn_from_str(text)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def open_live(spec: SourceSpec, live: LiveSourceConfig, default_name: str = "dn1") -> LiveSource:
    """The `LiveSource` of a live node's SOURCE (not yet connected)."""
    from csnd.reader.live import LiveSource

    return LiveSource(spec.name or default_name, live.options(spec.target), mode=live.mode)


def open_source(spec: SourceSpec, live: LiveSourceConfig, index: int) -> OpenedSource:
    """A live node's or a recorded file's source, of its kind; `index` names an unnamed live node dn<index+1>.

    A caller that does more with a live node (prepares its slot) opens it
    with `open_live` and hands the pipeline `LiveNode(source)`.
    """
    if spec.is_grpc:
        raise ConfigError(f"{spec.target} is a node agent, not a source to read")
    if spec.is_live:
        return LiveNode(open_live(spec, live, f"dn{index + 1}"))
    if not os.path.exists(spec.target):
        raise ConfigError(f"source {spec.target!r}: no such file (a live node is postgresql://...)")
    from csnd.reader.recorded import RecordedSource

    return RecordedNode(RecordedSource(spec.target, name=spec.name))


def check_nodes(opened: Sequence[OpenedSource | NodeInput]) -> None:
    """The opened sources of one run: unique node names and CSN modes that can be merged (ConfigError)."""
    names = [s.node for s in opened]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ConfigError(f"node name {sorted(dup)[0]!r} is used by several sources; name them NAME=SOURCE")
    check_modes({s.node: s.mode for s in opened})
