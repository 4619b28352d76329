"""Loading `csnd serve`'s settings into its `ServeConfig`: flags over CSND_* variables over a TOML file over defaults.

The table of the settings -- what each takes and where it may come from --
is `csnd.service.settings`; this module reads them (`build_config`) and
builds the runtime's options (`csnd.runtime.options`) for each source.

Each source carries its own live settings (slot, publication, mode,
until-LSN, ...): several live nodes need their own slot and publication.  On
the command line they ride on the source's URL as query parameters that
csnd takes off before the URL reaches libpq::

    dn1=postgresql://app@db1/shop?slot=csnd_dn1&publication=shop&mode=gtm

and the replay-style flags (`--slot`, `--publication`, `--mode`, ...) give
the default for every source that does not say.  The TOML file says the same
with one `[[source]]` table per source (see `docs/service.md`).  What each
setting takes, and the `CSND_<KEY>` environment variables for containers,
are in `csnd.service.settings`.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from csnd.core.errors import ConfigError
from csnd.runtime.options import AgentDialConfig, LiveSourceConfig
from csnd.service.limits import MAX_STREAMS, MAX_STREAMS_PER_PEER
from csnd.service.settings import (
    CONFIG_ENV,
    LIVE_KEYS,
    SETTINGS,
    check_file,
    live_values,
    read_environment,
    unknown_variables,
)

log = logging.getLogger("csnd.service.config")

DEFAULT_LISTEN: Final = "127.0.0.1:7070"
DEFAULT_DECODERS: Final = 2
# How long a live source that was flowing keeps reconnecting before the service gives up on it.
DEFAULT_GIVE_UP_S: Final = 300.0
# How long a node may be reconnecting or restarting before /readyz says 503.  A
# PostgreSQL restart or a pipeline restart passes within seconds; longer, and a
# load balancer should send consumers to a service that is flowing.
DEFAULT_READINESS_GRACE_S: Final = 30.0


@dataclass(frozen=True)
class ServedSource:
    """One source of the service: a recorded file, a live node or a node agent."""

    target: str  # a path, a postgresql:// URL without csnd's parameters, or grpc://HOST:PORT
    name: str | None = None
    live: LiveSourceConfig = field(default_factory=LiveSourceConfig)

    @property
    def is_live(self) -> bool:
        return self.target.startswith(("postgresql://", "postgres://")) or is_conninfo(self.target)

    @property
    def is_agent(self) -> bool:
        return self.target.startswith("grpc://")


@dataclass(frozen=True)
class ServeConfig:
    sources: tuple[ServedSource, ...]
    changelog: str
    listen: str = DEFAULT_LISTEN
    http: str | None = None
    # Host names the HTTP side answers to besides localhost and addresses (DNS rebinding)
    http_allowed_hosts: tuple[str, ...] = ()
    decoders: int = 2
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    # With a token: gRPC health checking needs it too (default: open to probes).
    health_needs_token: bool = False
    # Per-consumer credentials with roles (csnd.core.auth; docs/design.md section 8)
    credentials_file: str | None = None
    # Streams served at once, in all and per host (csnd.service.limits)
    max_streams: int = MAX_STREAMS
    max_streams_per_peer: int = MAX_STREAMS_PER_PEER
    retention_bytes: int | None = None
    retention_hours: float | None = None
    # How far past those named subscriptions and the Parquet export may hold records they have
    # not read (csnd.changelog.retention; None: twice the retention limit)
    retention_hold_bytes: int | None = None
    retention_hold_hours: float | None = None
    give_up_s: float = DEFAULT_GIVE_UP_S
    readiness_grace_s: float = DEFAULT_READINESS_GRACE_S
    thresholds: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    spill_dir: str | None = None  # [spill] dir: big transactions' spill files (None: the temp directory)
    spill_bytes: int | None = None  # [spill] bytes: one transaction's memory before it spills
    # [snapshot] chunk_rows, readers, split: an initial snapshot's tunables (None: csnd.snapshot's defaults)
    snapshot_chunk_rows: int | None = None
    snapshot_readers: int | None = None
    snapshot_split: str | None = None
    parquet_dir: str | None = (
        None  # --parquet-dir: the changelog also as Parquet files (csnd.service.parquet)
    )
    # --arrow-files-bytes: disk the Spark source's rows may take as files for
    # executors on this host (csnd.service.arrow_rows); 0: none, None: its default
    arrow_files_bytes: int | None = None
    # --log-format: log records as timestamped text or JSON lines (csnd.runtime.logsetup)
    log_format: str = "text"
    # --gtm: the shared GTM's server (csnd.gtm.pggtm), for GTM-mode snapshots at one CSN (csnd.gtm.barrier)
    gtm: str | None = None
    # --gtm-barrier-timeout: how long that barrier may hold the GTM (None: csnd.gtm.barrier's default)
    gtm_barrier_timeout_s: float | None = None
    # --agent-token-file, --agent-ca, --agent-cert, --agent-key: how grpc:// node agents are reached
    agent_dial: AgentDialConfig = field(default_factory=AgentDialConfig)


def _live_from(values: Mapping[str, Any], base: LiveSourceConfig) -> LiveSourceConfig:
    """`base` with the typed live settings of `values` (`settings.live_values`)."""
    changes = {k: v for k, v in values.items() if k != "text"}
    if "text" in values:
        changes["binary"] = not values["text"]
    if "receive_timeout" in changes:  # (seconds, as the field's name says)
        changes["receive_timeout_s"] = changes.pop("receive_timeout")
    if "slot_wait_timeout" in changes:
        changes["slot_wait_timeout_s"] = changes.pop("slot_wait_timeout")
    return replace(base, **changes)


def is_conninfo(text: str) -> bool:
    """Whether `text` is a libpq `key=value` conninfo (`host=db1 dbname=shop user=csnd`), as `csnd slot` takes.

    Only libpq's own keywords parse, so `dn1=x.pgstream` (a named file) is not
    one; it names `host` (or `hostaddr`), as `csnd record` asks of one too.
    """
    if "=" not in text or "://" in text:
        return False
    import psycopg
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(text)
    except psycopg.Error:  # (an option libpq does not know, or a syntax error)
        return False
    return "host" in params or "hostaddr" in params


def split_source(spec: str, defaults: LiveSourceConfig) -> ServedSource:
    """`[NAME=]TARGET` with csnd's query parameters taken off a postgresql:// TARGET.

    A key=value conninfo TARGET is taken whole (csnd's settings then come from
    the flags, `[defaults]` or its `[[source]]` table).
    """
    name: str | None = None
    head, sep, rest = spec.partition("=")
    if sep and "://" not in head and "/" not in head and head and not is_conninfo(spec):
        name, spec = head, rest
    if not spec.startswith(("postgresql://", "postgres://")):
        return ServedSource(spec, name, defaults)
    url = urlsplit(spec)
    ours = {k: v for k, v in parse_qsl(url.query, keep_blank_values=True) if k in LIVE_KEYS}
    theirs = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k not in LIVE_KEYS]
    # (quote, not urlencode's default quote_plus: libpq decodes %20 as a space, never '+')
    target = urlunsplit(url._replace(query=urlencode(theirs, quote_via=quote)))
    live = live_values(ours, f"source {name or target}", text=True)
    return ServedSource(target, name, _live_from(live, defaults))


def load_toml(path: str, what: str = "--config") -> dict[str, Any]:
    """The TOML file at `path`, named `what` (the flag or variable that gave it) in errors."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path}: not valid TOML: {e}") from None


def serve_config(
    flags: Mapping[str, Any], cli_sources: list[str], environ: Mapping[str, str] | None = None
) -> ServeConfig:
    """`csnd serve`'s settings from its flags, the CSND_* variables and the file --config or CSND_CONFIG names."""
    environ = os.environ if environ is None else environ
    for line in unknown_variables(environ):
        log.warning("%s", line)
    path, what = flags.get("config"), "--config"
    if not path:
        path, what = environ.get(CONFIG_ENV) or None, CONFIG_ENV
    file = load_toml(path, what) if path else {}
    return build_config(file, flags, cli_sources, environ=environ, where=f"{what} {path}")


# Every top-level setting of SETTINGS (so a flag always has its TOML key), and the tables.
_TOP_KEYS: Final = {s.key for s in SETTINGS if not s.live} | {
    "source",
    "dashboard",
    "defaults",
    "spill",
    "snapshot",
}
_SPILL_KEYS: Final = {"dir", "bytes"}
_SNAPSHOT_KEYS: Final = {"chunk_rows", "readers", "split"}
_SOURCE_KEYS: Final = {"name", "target", *LIVE_KEYS}


def build_config(
    file: Mapping[str, Any],
    flags: Mapping[str, Any],
    cli_sources: list[str],
    *,
    environ: Mapping[str, str] | None = None,
    where: str = "--config",
) -> ServeConfig:
    """The service's settings: `flags` over the CSND_* variables of `environ` over `file` over defaults.

    `flags`: each setting by its key (`settings.SETTINGS`), as its flag type
    made it, None when not given.  `environ`: default `os.environ`.  `file`:
    a parsed TOML, called `where` in errors.
    """
    unknown = sorted(set(file) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown setting {unknown[0]!r}; known: {', '.join(sorted(_TOP_KEYS))}")
    file = check_file(file, where)
    _, env = read_environment(os.environ if environ is None else environ)
    file_defaults = file.get("defaults", {})

    def pick(key: str, default: Any = None, file_layer: Mapping[str, Any] = file) -> Any:
        for layer in (flags, env, file_layer):
            value = layer.get(key)
            if value is not None:
                return value
        return default

    given = {k: pick(k, file_layer=file_defaults) for k in LIVE_KEYS}
    defaults = _live_from({k: v for k, v in given.items() if v is not None}, LiveSourceConfig())
    sources: list[ServedSource] = []
    for i, table in enumerate(file.get("source", [])):
        at = f"{where}: [[source]] #{i + 1}"
        bad = sorted(set(table) - _SOURCE_KEYS)
        if bad:
            raise ConfigError(f"{at}: unknown setting {bad[0]!r}; known: {', '.join(sorted(_SOURCE_KEYS))}")
        if "target" not in table:
            raise ConfigError(f"{at}: needs a target (a file, postgresql://... or grpc://...)")
        src = split_source(table["target"], defaults)
        live = _live_from({k: v for k, v in table.items() if k in LIVE_KEYS}, src.live)
        sources.append(ServedSource(src.target, table.get("name") or src.name, live))
    sources += [split_source(s, defaults) for s in cli_sources]
    if not sources:
        raise ConfigError("no sources: name at least one on the command line or as [[source]] in --config")
    changelog = pick("changelog")
    if not changelog:
        raise ConfigError("--changelog DIR is required (or `changelog = ...` in --config)")
    if os.path.exists(changelog) and not os.path.isdir(changelog):
        raise ConfigError(
            f"--changelog {changelog} is a file, not a directory: name a directory "
            "(csnd serve creates it when it does not exist)"
        )
    cert, key = pick("tls_cert"), pick("tls_key")
    if bool(cert) != bool(key):
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    dashboard = file.get("dashboard", {})
    spill_dir, spill_bytes = _spill(file.get("spill", {}))
    snapshot = file.get("snapshot", {})
    bad = sorted(set(snapshot) - _SNAPSHOT_KEYS)
    if bad:
        raise ConfigError(
            f"{where}: [snapshot]: unknown setting {bad[0]!r}; known: {', '.join(sorted(_SNAPSHOT_KEYS))}"
        )
    if snapshot.get("split", "ctid") not in ("key", "ctid"):
        raise ConfigError(f'{where}: [snapshot]: split must be "key" or "ctid", not {snapshot["split"]!r}')
    return ServeConfig(
        sources=tuple(sources),
        changelog=str(changelog),
        listen=pick("listen", default=DEFAULT_LISTEN),
        http=pick("http"),
        http_allowed_hosts=tuple(pick("http_allowed_hosts", default=())),
        decoders=pick("decoders", default=DEFAULT_DECODERS),
        token_file=pick("token_file"),
        tls_cert=cert,
        tls_key=key,
        health_needs_token=bool(pick("health_needs_token", default=False)),
        credentials_file=pick("credentials_file"),
        max_streams=pick("max_streams", default=MAX_STREAMS),
        max_streams_per_peer=pick("max_streams_per_peer", default=MAX_STREAMS_PER_PEER),
        retention_bytes=pick("retention_bytes"),
        retention_hours=pick("retention_hours"),
        retention_hold_bytes=pick("retention_hold_bytes"),
        retention_hold_hours=pick("retention_hold_hours"),
        give_up_s=pick("give_up", default=DEFAULT_GIVE_UP_S),
        readiness_grace_s=pick("readiness_grace", default=DEFAULT_READINESS_GRACE_S),
        thresholds=dict(dashboard),
        verbose=bool(flags.get("verbose")),
        spill_dir=spill_dir,
        spill_bytes=spill_bytes,
        snapshot_chunk_rows=snapshot.get("chunk_rows"),
        snapshot_readers=snapshot.get("readers"),
        snapshot_split=snapshot.get("split"),
        parquet_dir=pick("parquet_dir"),
        arrow_files_bytes=pick("arrow_files_bytes"),
        log_format=pick("log_format", default="text"),
        gtm=pick("gtm"),
        gtm_barrier_timeout_s=pick("gtm_barrier_timeout"),
        agent_dial=AgentDialConfig(
            token_file=pick("agent_token_file"),
            ca=pick("agent_ca"),
            cert=pick("agent_cert"),
            key=pick("agent_key"),
        ),
    )


def _spill(table: Any) -> tuple[str | None, int | None]:
    """`[spill]`: the directory of spill files (it must exist) and the memory bound in bytes."""
    if not isinstance(table, dict):
        raise ConfigError("--config: [spill] must be a table (dir, bytes)")
    bad = sorted(set(table) - _SPILL_KEYS)
    if bad:
        raise ConfigError(
            f"--config [spill]: unknown setting {bad[0]!r}; known: {', '.join(sorted(_SPILL_KEYS))}"
        )
    directory = table.get("dir")
    if directory is not None and not os.path.isdir(str(directory)):
        raise ConfigError(f"--config [spill]: dir {directory!r} is not a directory")
    return (None if directory is None else str(directory)), _opt_int(table.get("bytes"), "[spill] bytes")


def _opt_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if int(value) <= 0:
        raise ConfigError(f"{what} must be positive, got {value}")
    return int(value)
