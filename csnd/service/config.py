"""`csnd serve`'s settings: command-line flags over a TOML file over defaults.

Each source carries its own live settings (slot, publication, mode,
until-LSN, ...): several live nodes need their own slot and publication.  On
the command line they ride on the source's URL as query parameters that
csnd takes off before the URL reaches libpq::

    dn1=postgresql://app@db1/shop?slot=csnd_dn1&publication=shop&mode=gtm

and the replay-style flags (`--slot`, `--publication`, `--mode`, ...) give
the default for every source that does not say.  The TOML file says the same
with one `[[source]]` table per source (see `docs/service.md`); a flag given on
the command line overrides the file's value.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from csnd.core.errors import ConfigError
from csnd.core.ids import lsn_from_str
from csnd.runtime.config import LiveSourceConfig

DEFAULT_LISTEN: Final = "127.0.0.1:7070"
# How long a live source that was flowing keeps reconnecting before the service gives up on it.
DEFAULT_GIVE_UP_S: Final = 300.0

# Query parameters of a postgresql:// source that are csnd's, not libpq's.
_LIVE_PARAMS: Final = ("slot", "publication", "mode", "until_lsn", "create_slot", "text")
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


@dataclass(frozen=True)
class ServedSource:
    """One source of the service: a recorded file, a live node or a node agent."""

    target: str  # a path, a postgresql:// URL without csnd's parameters, or grpc://HOST:PORT
    name: str | None = None
    live: LiveSourceConfig = field(default_factory=LiveSourceConfig)

    @property
    def is_live(self) -> bool:
        return self.target.startswith(("postgresql://", "postgres://"))

    @property
    def is_agent(self) -> bool:
        return self.target.startswith("grpc://")


@dataclass(frozen=True)
class ServeConfig:
    sources: tuple[ServedSource, ...]
    changelog: str
    listen: str = DEFAULT_LISTEN
    http: str | None = None
    decoders: int = 2
    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    retention_bytes: int | None = None
    retention_hours: float | None = None
    give_up_s: float = DEFAULT_GIVE_UP_S
    thresholds: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    spill_dir: str | None = None  # [spill] dir: big transactions' spill files (None: the temp directory)
    spill_bytes: int | None = None  # [spill] bytes: one transaction's memory before it spills


def _bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigError(f"{what}: expected true or false, got {value!r}")


def _live_from(values: dict[str, Any], base: LiveSourceConfig, where: str) -> LiveSourceConfig:
    """`base` with the csnd live settings of `values` (from a URL's query or a [[source]] table)."""
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key == "slot" or key == "publication":
            changes[key] = str(value)
        elif key == "mode":
            if value not in ("single", "gtm"):
                raise ConfigError(f"{where}: mode must be 'single' or 'gtm', got {value!r}")
            changes["mode"] = value
        elif key == "until_lsn":
            try:
                changes["until_lsn"] = lsn_from_str(str(value))
            except ValueError:
                raise ConfigError(f"{where}: until_lsn {value!r} is not an LSN like 0/16B3748") from None
        elif key == "create_slot":
            changes["create_slot"] = _bool(value, f"{where}: create_slot")
        elif key == "text":
            changes["binary"] = not _bool(value, f"{where}: text")
    return replace(base, **changes)


def split_source(spec: str, defaults: LiveSourceConfig) -> ServedSource:
    """`[NAME=]TARGET` with csnd's query parameters taken off a postgresql:// TARGET."""
    name: str | None = None
    head, sep, rest = spec.partition("=")
    if sep and "://" not in head and "/" not in head and head:
        name, spec = head, rest
    if not spec.startswith(("postgresql://", "postgres://")):
        return ServedSource(spec, name, defaults)
    url = urlsplit(spec)
    ours = {k: v for k, v in parse_qsl(url.query, keep_blank_values=True) if k in _LIVE_PARAMS}
    theirs = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k not in _LIVE_PARAMS]
    target = urlunsplit(url._replace(query=urlencode(theirs)))
    return ServedSource(target, name, _live_from(ours, defaults, f"source {name or target}"))


def load_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config {path}: not valid TOML: {e}") from None


_TOP_KEYS: Final = {
    "changelog",
    "listen",
    "http",
    "decoders",
    "token_file",
    "tls_cert",
    "tls_key",
    "retention_bytes",
    "retention_hours",
    "give_up",
    "source",
    "dashboard",
    "defaults",
    "spill",
}
_SPILL_KEYS: Final = {"dir", "bytes"}
_SOURCE_KEYS: Final = {"name", "target", *_LIVE_PARAMS}


def build_config(file: dict[str, Any], flags: dict[str, Any], cli_sources: list[str]) -> ServeConfig:
    """The service's settings: `flags` (None = not given) over `file` (a parsed TOML) over defaults."""
    unknown = sorted(set(file) - _TOP_KEYS)
    if unknown:
        raise ConfigError(f"--config: unknown setting {unknown[0]!r}; known: {', '.join(sorted(_TOP_KEYS))}")

    def pick(key: str, file_key: str | None = None, default: Any = None) -> Any:
        value = flags.get(key)
        return value if value is not None else file.get(file_key or key, default)

    defaults = _live_from(dict(file.get("defaults", {})), LiveSourceConfig(), "--config [defaults]")
    defaults = _live_from(
        {k: v for k, v in flags.get("live", {}).items() if v is not None}, defaults, "flags"
    )
    sources: list[ServedSource] = []
    for i, table in enumerate(file.get("source", [])):
        where = f"--config [[source]] #{i + 1}"
        bad = sorted(set(table) - _SOURCE_KEYS)
        if bad:
            raise ConfigError(
                f"{where}: unknown setting {bad[0]!r}; known: {', '.join(sorted(_SOURCE_KEYS))}"
            )
        if "target" not in table:
            raise ConfigError(f"{where}: needs a target (a file, postgresql://... or grpc://...)")
        src = split_source(str(table["target"]), defaults)
        live = _live_from({k: v for k, v in table.items() if k in _LIVE_PARAMS}, src.live, where)
        sources.append(ServedSource(src.target, table.get("name") or src.name, live))
    sources += [split_source(s, defaults) for s in cli_sources]
    if not sources:
        raise ConfigError("no sources: name at least one on the command line or as [[source]] in --config")
    changelog = pick("changelog")
    if not changelog:
        raise ConfigError("--changelog DIR is required (or `changelog = ...` in --config)")
    decoders = int(pick("decoders", default=2))
    if decoders < 1:
        raise ConfigError(f"decoders must be at least 1, got {decoders}")
    cert, key = pick("tls_cert"), pick("tls_key")
    if bool(cert) != bool(key):
        raise ConfigError("TLS needs both --tls-cert and --tls-key")
    dashboard = file.get("dashboard", {})
    if not isinstance(dashboard, dict):
        raise ConfigError("--config: [dashboard] must be a table of thresholds")
    spill_dir, spill_bytes = _spill(file.get("spill", {}))
    return ServeConfig(
        sources=tuple(sources),
        changelog=str(changelog),
        listen=str(pick("listen", default=DEFAULT_LISTEN)),
        http=pick("http"),
        decoders=decoders,
        token_file=pick("token_file"),
        tls_cert=cert,
        tls_key=key,
        retention_bytes=_opt_int(pick("retention_bytes"), "retention_bytes"),
        retention_hours=_opt_float(pick("retention_hours"), "retention_hours"),
        give_up_s=float(pick("give_up", "give_up", DEFAULT_GIVE_UP_S)),
        thresholds=dict(dashboard),
        verbose=bool(flags.get("verbose")),
        spill_dir=spill_dir,
        spill_bytes=spill_bytes,
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


def _opt_float(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if float(value) <= 0:
        raise ConfigError(f"{what} must be positive, got {value}")
    return float(value)
