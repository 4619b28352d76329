"""How csnd's log records look on stderr: timestamped text, or one JSON object a line.

    log.info("...", extra={"node": "dn1", "lsn": 0x16B3748}) ─► handler on stderr
        text: 2026-11-29T00:24:24.123Z csnd: node dn1 resumes at csn 42, lsn 0/16B3748
        json: {"time": "2026-11-29T00:24:24.123Z", "level": "info", "logger": "csnd.service",
               "message": "...", "node": "dn1", "lsn": "0/16B3748"}

Only log records get a timestamp.  The lines a command prints itself -- its
one `csnd COMMAND: error: ...` line, a node's or the service's ready line --
are an interface scripts read whole (docs/design.md section 8), so they stay
as they are.  The text format keeps `csnd: MESSAGE` after the timestamp, so
a search for a message finds it in either version.  Times are UTC with
milliseconds (ISO 8601, `Z`): lines of several hosts sort together.

JSON is for log shippers: every line one object with `time`, `level`,
`logger` and `message`, and `node`, `lsn` (as `X/X`), `xid` and `csn` when the
record carries them -- given as `extra`, or on the csnd error it logs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any, Final

from csnd.core.ids import lsn_to_str

FORMATS: Final = ("text", "json")
# The variable that chooses the format for every command (`--log-format` wins).
FORMAT_ENV: Final = "CSND_LOG_FORMAT"


def utc_timestamp(created: float) -> str:
    """`created` (seconds since the epoch) as ISO 8601 UTC with milliseconds: 2026-11-29T00:24:24.123Z."""
    whole = int(created)
    ms = int((created - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{ms:03d}Z"


# csnd's messages about one node start "node NAME: " (csnd.core.errors renders them so).
_NODE_PREFIX: Final = re.compile(r"node ([A-Za-z_][A-Za-z0-9_.-]*)[: ]")


def _where(record: logging.LogRecord) -> dict[str, Any]:
    """The node, LSN, xid and csn a record carries: its `extra`, else the csnd error it logs, else
    (the node) the "node NAME: " its message starts with."""
    found: dict[str, Any] = {}
    err = record.exc_info[1] if record.exc_info else None
    for key in ("node", "lsn", "xid", "csn"):
        value = getattr(record, key, None)
        if value is None and err is not None:
            value = getattr(err, key, None)
        if value is None:
            continue
        found[key] = lsn_to_str(value) if key == "lsn" and isinstance(value, int) else value
    if "node" not in found:
        m = _NODE_PREFIX.match(record.getMessage())
        if m:
            found["node"] = m.group(1)
    return found


class TextFormatter(logging.Formatter):
    """`TIME csnd: MESSAGE` (and the traceback of an exception, below it)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{utc_timestamp(record.created)} csnd: {record.getMessage()}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, then node, lsn, xid and exception if any."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": utc_timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_where(record),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def chosen_format(flag: str | None, environ: dict[str, str] | None = None) -> str:
    """The format `--log-format` (else CSND_LOG_FORMAT, else text) names; ValueError for any other."""
    env = os.environ if environ is None else environ
    value = flag or env.get(FORMAT_ENV, "").strip() or "text"
    if value not in FORMATS:
        where = "--log-format" if flag else FORMAT_ENV
        raise ValueError(f"{where}: expected text or json, got {value!r}")
    return value


_HANDLER_NAME: Final = "csnd-stderr"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time (a test may have swapped it since)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)
        self.set_name(_HANDLER_NAME)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure(verbose: bool, fmt: str) -> None:
    """The root logger: INFO with -v (else WARNING), one handler on stderr in format `fmt`.

    As `logging.basicConfig`: a process whose root logger has handlers already
    (an embedding program, pytest's capture) keeps them and gets no handler.
    """
    root = logging.getLogger()
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    if not root.handlers:
        root.addHandler(_StderrHandler())
    set_format(fmt)


def set_format(fmt: str) -> None:
    """Switch csnd's stderr handler to `fmt` (`serve` reads `log_format` from its config file later)."""
    for h in logging.getLogger().handlers:
        if h.get_name() == _HANDLER_NAME:
            h.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
