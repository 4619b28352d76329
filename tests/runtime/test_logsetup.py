"""Log records as operators and log shippers read them: a UTC timestamp, or one JSON object a line."""

from __future__ import annotations

import json
import logging
import re

import pytest

from csnd.core.errors import SourceError
from csnd.runtime.logsetup import JsonFormatter, TextFormatter, chosen_format, utc_timestamp


def _record(msg: str, *args: object, exc: BaseException | None = None, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("csnd.service", logging.WARNING, __file__, 1, msg, args, None)
    if exc is not None:
        record.exc_info = (type(exc), exc, None)
    record.__dict__.update(extra)
    record.created = 1_795_911_864.0071  # 2026-11-29T00:24:24.007Z
    return record


def test_utc_timestamps_with_milliseconds() -> None:
    assert utc_timestamp(0.0) == "1970-01-01T00:00:00.000Z"
    assert utc_timestamp(1_795_911_864.0071) == "2026-11-29T00:24:24.007Z"
    assert utc_timestamp(1_795_911_864.9999) == "2026-11-29T00:24:24.999Z"


def test_text_keeps_csnd_message_after_the_timestamp() -> None:
    line = TextFormatter().format(_record("node %s: reconnecting", "dn1"))
    assert line == "2026-11-29T00:24:24.007Z csnd: node dn1: reconnecting"


def test_json_is_one_object_with_what_the_record_concerns() -> None:
    fmt = JsonFormatter()
    doc = json.loads(fmt.format(_record("resumes", node="dn2", lsn=0x16B3748, csn=42)))
    assert doc == {
        "time": "2026-11-29T00:24:24.007Z",
        "level": "warning",
        "logger": "csnd.service",
        "message": "resumes",
        "node": "dn2",
        "lsn": "0/16B3748",
        "csn": 42,
    }
    err = SourceError("stream ended inside transaction", node="dn3", lsn=0x10, xid=745)
    doc = json.loads(fmt.format(_record("pipeline failed:\n%s", err, exc=err)))
    assert (doc["node"], doc["lsn"], doc["xid"]) == ("dn3", "0/10", 745)
    assert "\n" not in fmt.format(_record("two\nlines", exc=err))  # (one line, whatever the message)
    assert json.loads(fmt.format(_record("node dn1: created slot csnd")))["node"] == "dn1"
    assert "node" not in json.loads(fmt.format(_record("nodes dn1 and dn2")))


def test_the_format_comes_from_the_flag_then_the_environment() -> None:
    assert chosen_format(None, {}) == "text"
    assert chosen_format(None, {"CSND_LOG_FORMAT": "json"}) == "json"
    assert chosen_format("text", {"CSND_LOG_FORMAT": "json"}) == "text"
    assert chosen_format(None, {"CSND_LOG_FORMAT": " "}) == "text"  # (empty counts as unset)
    with pytest.raises(ValueError, match=re.escape("CSND_LOG_FORMAT: expected text or json, got 'xml'")):
        chosen_format(None, {"CSND_LOG_FORMAT": "xml"})
