"""The runtime's options: what a run is asked to do, as plain values, built once and read by the runtime.

Of the three places configuration lives, this one is the runtime's: typed
options for `csnd replay`, `csnd node` and a live source.  The service's
own settings are listed in `csnd.service.settings` (what each takes, from
flag, variable or file) and loaded into its `ServeConfig` by
`csnd.service.config`, which builds these options for the runtime it embeds.

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

from csnd.core.addresses import is_loopback, split_host_port
from csnd.core.errors import ConfigError, UsageError
from csnd.core.ids import Lsn
from csnd.core.modes import MODES, Mode, is_mode
from csnd.core.tls import TlsFiles

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
    # a slot made by create_slot is a failover slot (PostgreSQL 17+; docs/failover.md)
    failover_slot: bool = False
    until_lsn: Lsn | None = None  # end at the first transaction boundary at or after it
    binary: bool = True
    mode: Mode = "single"
    # how long a stream that was flowing is reconnected to before the run fails (--give-up)
    give_up_s: float = 300.0
    # `csnd serve` only: the initial snapshot (docs/design.md section 5) -- never, initial or when_needed
    snapshot: str = "never"
    # silence on the replication connection that counts as a lost one (reader.live.RECEIVE_TIMEOUT_S)
    receive_timeout_s: float = 60.0
    # how long a slot made here may wait for its consistent point before it is given up (None: no limit)
    slot_wait_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not is_mode(self.mode):
            raise ConfigError(f"mode: expected {' or '.join(MODES)}, got {self.mode!r}")
        if self.snapshot not in SNAPSHOT_MODES:
            raise ConfigError(f"snapshot: expected {', '.join(SNAPSHOT_MODES)}, got {self.snapshot!r}")
        if not self.give_up_s > 0:
            raise ConfigError(f"give_up: expected a number of seconds > 0, got {self.give_up_s!r}")
        if not self.receive_timeout_s > 0:
            raise ConfigError(
                f"receive_timeout: expected a number of seconds > 0, got {self.receive_timeout_s!r}"
            )
        if self.slot_wait_timeout_s is not None and not self.slot_wait_timeout_s > 0:
            raise ConfigError(
                f"slot_wait_timeout: expected a number of seconds > 0, got {self.slot_wait_timeout_s!r}"
            )

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
            failover_slot=self.failover_slot,
            until_lsn=self.until_lsn,
            binary=self.binary,
            reconnect_give_up_s=self.give_up_s,
            receive_timeout_s=self.receive_timeout_s,
            slot_wait_timeout_s=self.slot_wait_timeout_s,
        )


@dataclass(frozen=True)
class AgentDialConfig:
    """How a coordinator reaches its node agents (`replay --agent-*`, `serve`'s `agent_*`): one for all.

    `token_file`: send its token as `authorization: Bearer` (the agents'
    --token-file).  `ca`: dial over TLS, trusting this CA for the agents'
    certificates.  `cert` and `key`: present this client certificate (the
    agents' --tls-client-ca), over TLS with the system's CAs if `ca` is not
    given.
    """

    token_file: str | None = None
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise UsageError("a client certificate for node agents needs both --agent-cert and --agent-key")

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None


@dataclass(frozen=True)
class ReplayConfig:
    """`csnd replay`: the sources to merge and where the JSON lines go."""

    sources: tuple[str, ...]
    output: str | None = None  # None: standard output
    decoders: int = field(default_factory=lambda: os.cpu_count() or 1)
    live: LiveSourceConfig = field(default_factory=LiveSourceConfig)
    agent_give_up_s: float = AGENT_GIVE_UP_S
    agent_dial: AgentDialConfig = field(default_factory=AgentDialConfig)
    verbose: bool = False
    schemas: bool = False  # relation lines before the transactions (docs/design.md section 7)

    def __post_init__(self) -> None:
        _check_decoders(self.decoders)


@dataclass(frozen=True)
class NodeAgentConfig:
    """`csnd node`: one source served to a coordinator over gRPC.

    Whoever reaches an agent reads every decoded row and can move its slot,
    so one that listens beyond the loopback needs a token (`token_file`)
    and TLS (`tls`; with `tls.client_ca` the coordinator's certificate too),
    unless `insecure_listen` says to serve without them anyway (the agent
    then warns on every start).
    """

    source: str
    listen: str
    decoders: int = field(default_factory=lambda: os.cpu_count() or 1)
    live: LiveSourceConfig = field(default_factory=LiveSourceConfig)
    token_file: str | None = None
    tls: TlsFiles | None = None
    insecure_listen: bool = False

    def __post_init__(self) -> None:
        _check_decoders(self.decoders)
        if self.exposed and not self.insecure_listen:
            missing = " and ".join(
                what
                for what, given in (("--token-file", self.token_file), ("--tls-cert/--tls-key", self.tls))
                if not given
            )
            raise UsageError(
                f"--listen {self.listen} is reachable from other machines, and without {missing} anyone "
                "there could read every row and move the slot: give --token-file and --tls-cert/--tls-key "
                "(and --tls-client-ca for the coordinator's certificate), listen on 127.0.0.1, or add "
                "--insecure-listen to serve it unprotected anyway"
            )

    @property
    def exposed(self) -> bool:
        """Listening beyond the loopback without both a token and TLS."""
        host, _ = split_host_port(self.listen)
        return not is_loopback(host) and not (self.token_file and self.tls)


def _check_decoders(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"decoders: expected a whole number >= 1, got {n!r}")
