"""What a run is asked to do, as plain values: built once by the command line (or a service), read by the runtime.

The runtime never sees `argparse.Namespace`: the command line turns its
arguments into these dataclasses (checking them on the way), and a service
that embeds the runtime builds them the same way from its own configuration.
`LiveSourceConfig.options` is the one place a live node's `LiveOptions` are
made, for `replay`, `record` and `node` alike.  Each checks its values when
it is made (a ConfigError naming the setting), so an embedding service that
fills them from its own configuration gets the command line's checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from csnd.core.errors import ConfigError
from csnd.core.modes import MODES, Mode, is_mode

if TYPE_CHECKING:
    from csnd.reader.live import LiveOptions

# How long the coordinator keeps trying to reach a node agent that went away.
AGENT_GIVE_UP_S: Final = 30.0
# A live source's initial snapshot in `csnd serve` (docs/design.md section 5): none (today's
# behaviour), on the first start, or on the first start when the slot is new.
SNAPSHOT_MODES: Final = ("never", "initial", "when_needed")


@dataclass(frozen=True)
class LiveSourceConfig:
    """How to stream a live node (the command line's "live sources" options)."""

    slot: str | None = None
    publication: str | None = None
    create_slot: bool = False
    until_lsn: int | None = None  # end at the first transaction boundary at or after it
    binary: bool = True
    mode: Mode = "single"
    # how long a stream that was flowing is reconnected to before the run fails (--give-up)
    give_up_s: float = 300.0
    # `csnd serve` only: the initial snapshot (docs/design.md section 5) -- never, initial or when_needed
    snapshot: str = "never"

    def __post_init__(self) -> None:
        if not is_mode(self.mode):
            raise ConfigError(f"mode: expected {' or '.join(MODES)}, got {self.mode!r}")
        if self.snapshot not in SNAPSHOT_MODES:
            raise ConfigError(f"snapshot: expected {', '.join(SNAPSHOT_MODES)}, got {self.snapshot!r}")
        if not self.give_up_s > 0:
            raise ConfigError(f"give_up: expected a number of seconds > 0, got {self.give_up_s!r}")

    def options(self, conninfo: str) -> LiveOptions:
        """The reader's options for the live node at `conninfo`; ConfigError if slot or publication is missing."""
        from csnd.reader.live import LiveOptions

        if not self.slot or not self.publication:
            raise ConfigError(f"live source {conninfo}: --slot and --publication are required")
        return LiveOptions(
            conninfo=conninfo,
            slot=self.slot,
            publication=self.publication,
            create_slot=self.create_slot,
            until_lsn=self.until_lsn,
            binary=self.binary,
            reconnect_give_up_s=self.give_up_s,
        )


@dataclass(frozen=True)
class ReplayConfig:
    """`csnd replay`: the sources to merge and where the JSON lines go."""

    sources: tuple[str, ...]
    output: str | None = None  # None: standard output
    decoders: int = field(default_factory=lambda: os.cpu_count() or 1)
    live: LiveSourceConfig = field(default_factory=LiveSourceConfig)
    agent_give_up_s: float = AGENT_GIVE_UP_S
    verbose: bool = False
    schemas: bool = False  # relation lines before the transactions (docs/design.md section 7)

    def __post_init__(self) -> None:
        _check_decoders(self.decoders)


@dataclass(frozen=True)
class NodeAgentConfig:
    """`csnd node`: one source served to a coordinator over gRPC."""

    source: str
    listen: str
    decoders: int = field(default_factory=lambda: os.cpu_count() or 1)
    live: LiveSourceConfig = field(default_factory=LiveSourceConfig)

    def __post_init__(self) -> None:
        _check_decoders(self.decoders)


def _check_decoders(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"decoders: expected a whole number >= 1, got {n!r}")
