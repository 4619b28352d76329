"""The table of `csnd serve`'s settings, typed: what each one takes and where it may come from.

Loading them into a `ServeConfig` is `csnd.service.config`'s job; the
runtime's own options are `csnd.runtime.options`.

    --decoders 2 ────────┐
    CSND_DECODERS=2 ─────┼─► Kind: one typed value ─► ServeConfig (csnd.service.config)
    decoders = 2 (TOML) ─┘   or one line naming the flag, variable or key and what it takes

Every setting has one `Kind`, read the same way wherever its value comes
from.  A flag, an environment variable or a source URL's parameter gives
text; a TOML value is taken as its own type, and a TOML string is read as
that text would be (so `decoders = "2"` works as it always did, while
`decoders = "two"`, `decoders = true` or `decoders = 2.5` are refused).

The variables, `CSND_` and the flag's name in capitals (CSND_DECODERS,
CSND_LISTEN, CSND_CHANGELOG, ...; CSND_CONFIG names the file), are for
containers: the command line is fixed in the image and the settings come
from the deployment.  An empty variable counts as unset (what a template
renders for a value it was not given).  A flag beats its variable, a
variable the file, the file the defaults.  A variable csnd cannot take is a
usage error, exit 2, as a flag's is; a bad file is a configuration error,
exit 1 (docs/design.md section 8).
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from csnd.core import addresses
from csnd.core.errors import ConfigError, UsageError
from csnd.core.ids import lsn_from_str
from csnd.core.modes import Mode, is_mode
from csnd.runtime.options import SNAPSHOT_MODES
from csnd.service.http_guard import check_allowed_host

# The variable naming the config file (--config).
CONFIG_ENV: Final = "CSND_CONFIG"
# CSND_* variables read elsewhere than SETTINGS (the log format, the Python
# twins of the C modules; the tests' and benchmarks' own): not misspellings.
OTHER_VARIABLES: Final = (
    "CSND_LOG_FORMAT",
    "CSND_IMPL",
    "CSND_NEW_TABLES_EVERY_S",
    "CSND_RETENTION_EVERY_S",
    "CSND_SEGMENT_BYTES",
    "CSND_PG_BIN",
    "CSND_PG_VERSION",
    "CSND_FAULT_RUNS",
    "CSND_FAULT_OUT",
    "CSND_POWERLOSS_POINTS",
    "CSND_SCREENSHOT",
    "CSND_BENCH_DIR",
)

_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Kind:
    """A setting's type: `expected` says it in messages; `convert` takes text or a TOML value to it.

    `convert` raises ValueError (with any message) for a value it cannot take;
    `read_text` and `read_toml` turn that into "expected ..., got ..." with
    the value shown as it was written.
    """

    expected: str
    convert: Callable[[object], Any]

    def read_text(self, text: str) -> Any:
        """A flag's, variable's or URL parameter's text."""
        return self._read(text, repr(text))

    def read_toml(self, value: object) -> Any:
        """A value of a TOML file."""
        return self._read(value, toml_text(value))

    def _read(self, value: object, shown: str) -> Any:
        try:
            return self.convert(value)
        except ValueError:
            raise ValueError(f"expected {self.expected}, got {shown}") from None


def toml_text(value: object) -> str:
    """`value` as a TOML file writes it (for messages): "two", true, 2.5, [1]; a table as `a table`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a table"
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)  # (a TOML date or time)


def _integer(least: int) -> Callable[[object], int]:
    """A whole number (a TOML integer or its text) of at least `least`."""

    def convert(value: object) -> int:
        if isinstance(value, str):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(value)
        return value

    return convert


def _number(above: float | None = None, at_least: float | None = None) -> Callable[[object], float]:
    """A finite number (a TOML integer or float, or its text) above `above` or at least `at_least`."""

    def convert(value: object) -> float:
        if isinstance(value, str):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(value)
        if (above is not None and value <= above) or (at_least is not None and value < at_least):
            raise ValueError(value)
        return float(value)

    return convert


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(value)
    return value


def _address(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return addresses.listen_address(value)


def _boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _TRUE:
        return True
    if isinstance(value, str) and value.lower() in _FALSE:
        return False
    raise ValueError(value)


def _mode(value: object) -> Mode:
    if not is_mode(value):
        raise ValueError(value)
    return value


def _snapshot(value: object) -> str:
    if value not in SNAPSHOT_MODES:
        raise ValueError(value)
    return str(value)


def _log_format(value: object) -> str:
    if value not in ("text", "json"):
        raise ValueError(value)
    return str(value)


def _lsn(value: object) -> int:
    if not isinstance(value, str):
        raise ValueError(value)
    return lsn_from_str(value)


def _hosts(value: object) -> tuple[str, ...]:
    """Host names: a TOML list of them, or text with commas between them."""
    names = [n.strip() for n in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, list):
        raise ValueError(value)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(value)
    return tuple(check_allowed_host(n) for n in names if n)


WHOLE: Final = Kind("a whole number >= 1", _integer(1))
BYTES: Final = Kind("a whole number >= 0", _integer(0))
POSITIVE: Final = Kind("a number > 0", _number(above=0))
NOT_NEGATIVE: Final = Kind("a number >= 0", _number(at_least=0))
TEXT: Final = Kind("a string", _text)
ADDRESS: Final = Kind(addresses.EXPECTED, _address)
BOOLEAN: Final = Kind("true or false", _boolean)
MODE: Final = Kind("single or gtm", _mode)
LSN: Final = Kind("an LSN like 0/16B3748", _lsn)
SNAPSHOT: Final = Kind("initial, never or when_needed", _snapshot)
LOG_FORMAT: Final = Kind("text or json", _log_format)
HOSTS: Final = Kind("host names separated by commas (a TOML list of them; * for any)", _hosts)


@dataclass(frozen=True)
class Setting:
    """One setting of `csnd serve`: its TOML key, its flag and variable, its kind, its value in help.

    `live`: a default for every live source (`[defaults]` in the file), which
    a source's URL parameters or `[[source]]` table override.
    """

    key: str
    kind: Kind
    metavar: str
    live: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    @property
    def env(self) -> str:
        return "CSND_" + self.key.upper()


SETTINGS: Final = (
    Setting("changelog", TEXT, "DIR"),
    Setting("listen", ADDRESS, "HOST:PORT"),
    Setting("http", ADDRESS, "HOST:PORT"),
    Setting("http_allowed_hosts", HOSTS, "HOST,..."),
    Setting("decoders", WHOLE, "N"),
    Setting("token_file", TEXT, "FILE"),
    Setting("tls_cert", TEXT, "PEM"),
    Setting("tls_key", TEXT, "PEM"),
    Setting("health_needs_token", BOOLEAN, "true|false"),
    Setting("credentials_file", TEXT, "FILE"),
    Setting("max_streams", WHOLE, "N"),
    Setting("max_streams_per_peer", WHOLE, "N"),
    Setting("retention_bytes", WHOLE, "BYTES"),
    Setting("retention_hours", POSITIVE, "HOURS"),
    Setting("retention_hold_bytes", WHOLE, "BYTES"),
    Setting("retention_hold_hours", POSITIVE, "HOURS"),
    Setting("give_up", POSITIVE, "SECONDS"),
    Setting("readiness_grace", NOT_NEGATIVE, "SECONDS"),
    Setting("parquet_dir", TEXT, "DIR"),
    Setting("arrow_files_bytes", BYTES, "BYTES"),
    Setting("log_format", LOG_FORMAT, "text|json"),
    # the shared GTM (csnd.gtm.pggtm): GTM-mode snapshots are taken under its commit barrier
    Setting("gtm", TEXT, "URL"),
    # how long that barrier may hold the GTM before it gives up (csnd.gtm.barrier.BARRIER_TIMEOUT_S)
    Setting("gtm_barrier_timeout", POSITIVE, "SECONDS"),
    # how the service reaches grpc:// node agents (csnd.runtime.options.AgentDialConfig)
    Setting("agent_token_file", TEXT, "FILE"),
    Setting("agent_ca", TEXT, "PEM"),
    Setting("agent_cert", TEXT, "PEM"),
    Setting("agent_key", TEXT, "PEM"),
    Setting("slot", TEXT, "SLOT", live=True),
    Setting("publication", TEXT, "PUBLICATION", live=True),
    Setting("create_slot", BOOLEAN, "true|false", live=True),
    Setting("failover_slot", BOOLEAN, "true|false", live=True),
    Setting("until_lsn", LSN, "LSN", live=True),
    Setting("text", BOOLEAN, "true|false", live=True),
    Setting("mode", MODE, "single|gtm", live=True),
    Setting("snapshot", SNAPSHOT, "WHEN", live=True),
    Setting("receive_timeout", POSITIVE, "SECONDS", live=True),
    Setting("slot_wait_timeout", POSITIVE, "SECONDS", live=True),
)
_BY_KEY: Final = {s.key: s for s in SETTINGS}
# The live settings: a source URL's query parameters that are csnd's, not libpq's.
LIVE_KEYS: Final = tuple(s.key for s in SETTINGS if s.live)


def environment_help() -> str:
    """The `csnd serve --help` epilog: every variable and the flag it stands for."""
    rows = [(f"{CONFIG_ENV}=FILE", "--config")] + [(f"{s.env}={s.metavar}", s.flag) for s in SETTINGS]
    width = max(len(var) for var, _ in rows) + 2  # (the longest must not run into its flag)
    return (
        "environment (containers): each variable stands for the flag beside it (CSND_ and\n"
        "the flag's name in capitals, _ for -); an empty one counts as unset; a value of\n"
        "the wrong type is a usage error (exit 2).\n"
        "precedence: flags > environment > config file > defaults.\n"
        + "".join(f"  {var:<{width}}{flag}\n" for var, flag in rows)
    )


def flag_type(kind: Kind) -> Callable[[str], Any]:
    """An argparse `type=` reading a flag as `kind` (argparse then says `argument --FLAG: expected ...`)."""

    def parse(text: str) -> Any:
        try:
            return kind.read_text(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def read_environment(environ: Mapping[str, str]) -> tuple[str | None, dict[str, Any]]:
    """The config file CSND_CONFIG names (or None) and the typed value of every CSND_<KEY> that is set.

    A value its setting cannot take is a UsageError naming the variable.
    """
    values: dict[str, Any] = {}
    for s in SETTINGS:
        text = environ.get(s.env, "")
        if text:
            try:
                values[s.key] = s.kind.read_text(text)
            except ValueError as e:
                raise UsageError(f"{s.env}: {e}") from None
    return environ.get(CONFIG_ENV) or None, values


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A line for each CSND_* variable of `environ` that csnd does not read, naming the closest it does.

    A misspelt variable (CSND_LISTN) is otherwise ignored in silence, and the
    service runs with the default the operator meant to change.
    """
    known = [CONFIG_ENV, *(s.env for s in SETTINGS), *OTHER_VARIABLES]
    lines = []
    for name in sorted(v for v in environ if v.startswith("CSND_") and v not in known):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        meant = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"the environment variable {name} is not a setting of csnd and is ignored{meant}")
    return lines


def live_values(values: Mapping[str, object], where: str, *, text: bool) -> dict[str, Any]:
    """The live settings among `values` (a URL's parameters: `text`; a TOML table), typed."""
    typed: dict[str, Any] = {}
    for key, value in values.items():
        s = _BY_KEY.get(key)
        if s is None or not s.live:
            continue
        try:
            typed[key] = s.kind.read_text(str(value)) if text else s.kind.read_toml(value)
        except ValueError as e:
            raise ConfigError(f"{where}: {key}: {e}") from None
    return typed


def check_file(file: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A parsed TOML config with every setting typed; ConfigError (`where`: key: expected ...) otherwise.

    The tables keep their shape: `[defaults]`, `[[source]]` (name and target
    strings, live settings typed), `[dashboard]` (numbers >= 0) and
    `[spill]` (dir a string, bytes a whole number).  Keys it does not know
    are left for the caller to refuse.
    """
    typed = dict(file)
    for key, value in file.items():
        s = _BY_KEY.get(key)
        if s is not None and not s.live:
            typed[key] = _toml(s.kind, value, f"{where}: {key}")
    if "defaults" in file:
        table = _table(file["defaults"], f"{where}: defaults", "a table ([defaults])")
        unknown = sorted(set(table) - set(LIVE_KEYS))
        if unknown:
            raise ConfigError(
                f"{where}: [defaults]: unknown setting {unknown[0]!r}; known: {', '.join(sorted(LIVE_KEYS))}"
            )
        typed["defaults"] = live_values(table, f"{where}: [defaults]", text=False)
    if "source" in file:
        tables = file["source"]
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise ConfigError(f"{where}: source: expected [[source]] tables, got {toml_text(tables)}")
        typed["source"] = [_source_table(t, f"{where}: [[source]] #{i + 1}") for i, t in enumerate(tables)]
    if "dashboard" in file:
        table = _table(file["dashboard"], f"{where}: dashboard", "a table of thresholds ([dashboard])")
        typed["dashboard"] = {
            k: _toml(NOT_NEGATIVE, v, f"{where}: [dashboard]: {k}") for k, v in table.items()
        }
    if "spill" in file:
        table = dict(_table(file["spill"], f"{where}: spill", "a table ([spill]: dir, bytes)"))
        for key, kind in (("dir", TEXT), ("bytes", WHOLE)):
            if key in table:
                table[key] = _toml(kind, table[key], f"{where}: [spill]: {key}")
        typed["spill"] = table
    if "snapshot" in file:
        table = dict(
            _table(file["snapshot"], f"{where}: snapshot", "a table ([snapshot]: chunk_rows, readers, split)")
        )
        for key in ("chunk_rows", "readers"):
            if key in table:
                table[key] = _toml(WHOLE, table[key], f"{where}: [snapshot]: {key}")
        if "split" in table:
            table["split"] = _toml(TEXT, table["split"], f"{where}: [snapshot]: split")
        typed["snapshot"] = table
    return typed


def _source_table(table: Mapping[str, Any], where: str) -> dict[str, Any]:
    typed = dict(table)
    for key in ("name", "target"):
        if key in table:
            typed[key] = _toml(TEXT, table[key], f"{where}: {key}")
    typed.update(live_values(table, where, text=False))
    return typed


def _table(value: object, where: str, expected: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected {expected}, got {toml_text(value)}")
    return value


def _toml(kind: Kind, value: object, where: str) -> Any:
    try:
        return kind.read_toml(value)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
