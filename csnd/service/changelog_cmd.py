"""`csnd changelog DIR`: a changelog's transactions as JSON lines, without a running service.

For backfills, audits and "what did the service keep" at 3 a.m.: prints the
docs/design.md section 7 lines of every transaction with `--from-csn` < csn <=
`--until-csn`, exactly what `csnd subscribe` would print for that range.
`--check` reads every record of every segment (CRC, framing, CSN order) and
prints a summary on stderr instead.  `--schemas` adds the relation lines
from the changelog's relation store where `csnd subscribe --schemas` puts
them: those in force after `--from-csn` first, then each new version before
the first transaction it is in force with.

Opening a changelog takes its lock and cuts a torn tail, as the service does
at start, so it refuses a directory a running service holds (ask the service
with `csnd subscribe` or Fetch instead).  Opening would also make a LOCK in
any directory at all, so a directory is first recognised as a changelog by
its files, without writing: segment files, or (a service that has appended
nothing yet) only the files a changelog keeps beside them.  Anything else --
a mistyped path, the wrong volume -- is refused untouched, never reported as
an empty changelog that is "ok".
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from csnd.changelog import Changelog
from csnd.changelog.clock import CLOCK_NAME
from csnd.changelog.lock import LOCK_NAME
from csnd.changelog.record import parse_segment_name, segment_name
from csnd.changelog.relations import FILE_NAME as RELATIONS_NAME
from csnd.changelog.subscriptions import FILE_NAME as SUBSCRIPTIONS_NAME
from csnd.core.errors import ConfigError


@dataclass(frozen=True)
class ChangelogQuery:
    directory: str
    from_csn: int = 0
    until_csn: int | None = None
    check: bool = False
    schemas: bool = False


def run_changelog(q: ChangelogQuery) -> int:
    check_is_changelog(q.directory)
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
        if q.from_csn > log.newest_csn:  # (an empty answer that says why: not a silent one)
            print(
                f"csnd changelog: --from-csn {q.from_csn} is past the newest csn {log.newest_csn}: nothing to print",
                file=sys.stderr,
            )
        out = sys.stdout.buffer
        relations = log.relations if q.schemas else None
        pos = q.from_csn
        try:
            if relations is not None:
                for e in relations.between(0, pos):
                    out.write(e.line.encode("utf-8") + b"\n")
            for csn, line in log.read(q.from_csn, q.until_csn):
                if relations is not None and relations.has_between(pos, csn):
                    for e in relations.between(pos, csn):
                        out.write(e.line.encode("utf-8") + b"\n")
                pos = csn
                out.write(line)
                out.write(b"\n")
            out.flush()
        except BrokenPipeError:  # `| head`: the reader has what it wanted
            _quiet_stdout()
    return 0


def check_is_changelog(directory: str) -> None:
    """ConfigError unless `directory` holds a changelog; reads the directory only, writes nothing."""
    if not os.path.exists(directory):
        raise ConfigError(f"{directory}: no such directory")
    if not os.path.isdir(directory):
        raise ConfigError(f"{directory}: not a directory")
    names = os.listdir(directory)
    if any(parse_segment_name(n) for n in names):
        return
    # No segment yet: a changelog a service opened and has appended nothing to holds its lock
    # (and maybe its subscriptions), nothing else.
    ours = {LOCK_NAME, CLOCK_NAME, SUBSCRIPTIONS_NAME, SUBSCRIPTIONS_NAME + ".tmp", RELATIONS_NAME}
    if LOCK_NAME in names and set(names) <= ours:
        return
    raise ConfigError(
        f"{directory} is not a changelog directory (no segment files like {segment_name(1, 1)}); "
        "give the directory of csnd serve --changelog"
    )


def _quiet_stdout() -> None:
    # Python would report the broken pipe again when it flushes stdout at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
