"""`csnd changelog DIR`: a changelog's transactions as JSON lines, without a running service.

For backfills, audits and "what did the service keep" at 3 a.m.: prints the
DESIGN section 7 lines of every transaction with `--from-csn` < csn <=
`--until-csn`, exactly what `csnd subscribe` would print for that range.
`--check` reads every record of every segment (CRC, framing, CSN order) and
prints a summary on stderr instead.

Opening a changelog takes its lock and cuts a torn tail, as the service does
at start, so it refuses a directory a running service holds (ask the service
with `csnd subscribe` or Fetch instead).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from csnd.coordinator.changelog import Changelog
from csnd.core.errors import ConfigError


@dataclass(frozen=True)
class ChangelogQuery:
    directory: str
    from_csn: int = 0
    until_csn: int | None = None
    check: bool = False


def run_changelog(q: ChangelogQuery) -> int:
    if not os.path.isdir(q.directory):
        raise ConfigError(f"changelog {q.directory}: no such directory")
    if q.until_csn is not None and q.until_csn < q.from_csn:
        raise ConfigError(f"--until-csn {q.until_csn} is before --from-csn {q.from_csn}")
    with Changelog(q.directory) as log:
        if q.check:
            records = size = 0
            for _csn, line in log.read(0):
                records += 1
                size += len(line)
            print(
                f"csnd changelog: {q.directory}: ok: {records} transactions in {log.segment_count} segments, "
                f"csn {log.oldest_csn}..{log.newest_csn}, {log.size_bytes} bytes on disk",
                file=sys.stderr,
            )
            return 0
        out = sys.stdout.buffer
        try:
            for _csn, line in log.read(q.from_csn, q.until_csn):
                out.write(line)
                out.write(b"\n")
            out.flush()
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            _quiet_stdout()
    return 0


def _quiet_stdout() -> None:
    # Python would report the broken pipe again when it flushes stdout at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
