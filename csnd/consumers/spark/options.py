"""The options of the `csnd` Spark source, checked once when a query starts.

Spark passes options as a case-insensitive map of strings.  Every option is
read here, into `SourceOptions`; a name we do not know or a value that does
not parse is one ConfigError that names it and lists what is known -- a typo
(`maxTransactionPerTrigger`) must not be silently ignored the way Spark's
own sources ignore it, because it would change what a micro-batch holds.

Pure: no I/O (`tokenFile` and `tlsCaFile` are read where they are used).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from csnd.consumers.client import parse_target
from csnd.core.errors import ConfigError
from csnd.core.tablespec import parse_table

# Known options and what each takes (also the text of the error that lists them).
KNOWN: Final = {
    "target": "HOST:PORT of csnd serve (required)",
    "startingCsn": "read transactions with csn > this; 0 (default) = from the oldest retained",
    "endingCsn": "batch reads: up to and including this csn (default: the newest durable now)",
    "tables": "comma-separated schema.table list; only their changes are read",
    "maxTransactionsPerTrigger": "streams: at most this many transactions per micro-batch",
    "numPartitions": "split each range into up to this many CSN ranges read in parallel (default 2)",
    "name": "the subscription name commit() acknowledges under (default: from target, tables, startingCsn)",
    "tokenFile": "file holding the service's bearer token",
    "tlsCaFile": "PEM CA certificate: connect with TLS, trusting it",
    "connectTimeout": "seconds to wait for the service before failing (default 10)",
    "rowsBuiltBy": "service (default): the service sends Arrow rows it built once; "
    "executor: it sends JSON lines and each executor builds the rows",
    "localFiles": "true (default): an executor on the service's host maps the rows the service "
    "left in files instead of receiving them; false: always receive them",
}
ROWS_BUILT_BY: Final = ("service", "executor")
_LOWER: Final = {k.lower(): k for k in KNOWN}
DEFAULT_PARTITIONS: Final = 2  # (a 2-core local Spark; a cluster sets it to its executor cores)
DEFAULT_CONNECT_TIMEOUT_S: Final = 10.0


@dataclass(frozen=True)
class SourceOptions:
    target: str
    starting_csn: int = 0
    ending_csn: int | None = None
    tables: tuple[str, ...] = ()
    max_transactions: int | None = None
    partitions: int = DEFAULT_PARTITIONS
    name: str | None = None
    token_file: str | None = None
    tls_ca_file: str | None = None
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S
    rows_built_by: str = "service"
    local_files: bool = True


def _known_list() -> str:
    return ", ".join(KNOWN)


def _int(key: str, text: str, least: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"csnd source: option {key}={text!r} is not a whole number") from None
    if value < least:
        raise ConfigError(f"csnd source: option {key}={value} must be at least {least}")
    return value


def parse_options(raw: Mapping[str, str], *, stream: bool | None) -> SourceOptions:
    """`raw` (Spark's options) checked and typed; ConfigError naming the first bad one.

    stream: True for readStream, False for read, None when not known yet
    (DataSource.schema, called for both): the checks that differ are left out.
    """
    given: dict[str, str] = {}
    for key, value in raw.items():
        canonical = _LOWER.get(key.lower())
        if canonical is None:
            if key.lower() == "path":  # (Spark adds load(PATH)'s argument as `path`)
                raise ConfigError("csnd source: load() takes no path; give the service as option target")
            raise ConfigError(f"csnd source: unknown option {key!r}; the known options are: {_known_list()}")
        given[canonical] = str(value)
    if "target" not in given:
        raise ConfigError(
            f"csnd source: option target (HOST:PORT of csnd serve) is required; the known options are: {_known_list()}"
        )
    try:
        target = parse_target(given["target"].strip())
    except ConfigError as e:
        raise ConfigError(f"csnd source: option {e}") from None
    opts = SourceOptions(target=target)
    starting = _int("startingCsn", given["startingCsn"], 0) if "startingCsn" in given else 0
    ending = _int("endingCsn", given["endingCsn"], 1) if "endingCsn" in given else None
    if ending is not None and ending < starting:
        raise ConfigError(f"csnd source: endingCsn {ending} is before startingCsn {starting}")
    if stream is True and ending is not None:
        raise ConfigError("csnd source: endingCsn is for batch reads (spark.read); a stream has no end")
    max_txns = None
    if "maxTransactionsPerTrigger" in given:
        if stream is False:
            raise ConfigError("csnd source: maxTransactionsPerTrigger is for streams (spark.readStream)")
        max_txns = _int("maxTransactionsPerTrigger", given["maxTransactionsPerTrigger"], 1)
    tables: tuple[str, ...] = ()
    if "tables" in given:
        tables = tuple(t.strip() for t in given["tables"].split(",") if t.strip())
        for t in tables:
            _check_table(t)
        if not tables:
            raise ConfigError("csnd source: option tables is empty; leave it out to read every table")
    partitions = (
        _int("numPartitions", given["numPartitions"], 1) if "numPartitions" in given else DEFAULT_PARTITIONS
    )
    timeout = DEFAULT_CONNECT_TIMEOUT_S
    if "connectTimeout" in given:
        try:
            timeout = float(given["connectTimeout"])
        except ValueError:
            timeout = -1.0
        if not timeout > 0:
            raise ConfigError(
                f"csnd source: option connectTimeout={given['connectTimeout']!r} is not seconds > 0"
            )
    name = given.get("name", "").strip() or None
    built_by = given.get("rowsBuiltBy", "service").strip().lower()
    if built_by not in ROWS_BUILT_BY:
        raise ConfigError(
            f"csnd source: option rowsBuiltBy={given['rowsBuiltBy']!r} is not one of {', '.join(ROWS_BUILT_BY)}"
        )
    local_files = given.get("localFiles", "true").strip().lower()
    if local_files not in ("true", "false"):
        raise ConfigError(f"csnd source: option localFiles={given['localFiles']!r} is not true or false")
    return SourceOptions(
        target=opts.target,
        starting_csn=starting,
        ending_csn=ending,
        tables=tables,
        max_transactions=max_txns,
        partitions=partitions,
        name=name,
        token_file=given.get("tokenFile") or None,
        tls_ca_file=given.get("tlsCaFile") or None,
        connect_timeout=timeout,
        rows_built_by=built_by,
        local_files=local_files == "true",
    )


def _check_table(spec: str) -> None:
    """SCHEMA.TABLE as the service's filter takes it (a part may be "double-quoted")."""
    try:
        parse_table(spec)
    except ValueError as e:
        raise ConfigError(f"csnd source: option tables: {e}") from None
