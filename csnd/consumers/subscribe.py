"""`csnd subscribe HOST:PORT ...`: the changefeed as JSON lines on stdout (docs/design.md section 8).

Each transaction's section 7 line is printed, and acknowledged once it is
flushed to stdout -- never before, so a named subscription's stored mark
never covers a line that was not written.  Lines are flushed whenever nothing
more is waiting (and every ACK_EVERY lines), so a backlog is written in large
writes and a quiet stream a batch as it arrives.  Acknowledgements are paced
(csnd.consumers.acking): the newest line written out, every ACK_INTERVAL_S
or ACK_EVERY lines, and a quiet stream's last line once its interval ends --
not one message a transaction when they come one at a time.  Reconnects are the client's
(csnd.consumers.client): the output has no gap and no duplicate across a
service restart.  Exit 0 after --limit lines or --idle-timeout seconds with
nothing new, or when stdout is closed (`| head`); Ctrl-C 130; nothing
reachable, refused or unauthenticated: one line on stderr, exit 1.  The idle
clock starts once the service first answers: a subscriber that never
reached it is not idle, and exiting 0 in silence would pass a mistyped
address off as a quiet service.  With --schemas a relation line (a table's
column names and types) is printed before the first transaction each
version of a table is in force with, the ones in force at the start first;
it is neither counted by --limit nor acknowledged.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from typing import Any, Final

from csnd.consumers.acking import ACK_EVERY, ACK_INTERVAL_S, AckPacer

# At most this many lines are written in one go (a run the client has received).
RUN_LINES: Final = 512
# stdout's buffer: lines are written out when it fills, or before an acknowledgement.
OUT_BUFFER_BYTES: Final = 1 << 16
# A spooled large line is copied to stdout in reads of this size.
SPOOL_COPY_BYTES: Final = 1 << 20
# The switch interval while the stream is live (csnd.cli sets 20 ms for throughput; the
# service's merger does the same, csnd.runtime.switching): a live line crosses two
# Python threads here (gRPC's channel thread, this one, which reads the stream itself),
# and a woken thread that finds another running Python waits the interval.
LIVE_SWITCH_S: Final = 0.005


def add_subscribe_parser(sub: Any) -> None:
    p = sub.add_parser(
        "subscribe",
        help="print a csnd service's transactions as JSON lines, acknowledging them",
        description="Subscribe to the changefeed of a running `csnd serve` and print the transaction "
        "JSON lines (docs/design.md section 7) of every transaction with csn > X in CSN order, acknowledging "
        "each once it is written. Exit 0 after N transactions, after S seconds with nothing new, or "
        "when stdout is closed; without --limit and --idle-timeout it runs until Ctrl-C (exit 130). "
        "If the service goes away it reconnects with backoff and continues exactly after the last "
        "line printed: no gap, no duplicate. With --table, a transaction keeps only the changes of "
        "those tables (and its csn, gid, commit_time and nodes); one with none left is skipped. "
        "Nothing reachable, refused or unauthenticated: one line on stderr, exit 1.",
    )
    p.add_argument("target", metavar="HOST:PORT", help="the service's address (grpc://HOST:PORT also works)")
    p.add_argument(
        "--from-csn",
        type=_csn,
        default=None,
        metavar="X",
        help="print transactions with csn > X (0: from the oldest retained; default 0, or with --name "
        "after the subscription's last acknowledged csn); X may be written as an LSN, 0/16B3748 (in single "
        "mode a csn is the commit LSN)",
    )
    p.add_argument("--limit", type=_count, metavar="N", help="exit 0 after N transactions")
    p.add_argument(
        "--idle-timeout", type=_seconds, metavar="S", help="exit 0 after S seconds with no new transaction"
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        metavar="SCHEMA.TABLE",
        help="only changes of this table; SCHEMA.* for every table of a schema (repeatable)",
    )
    p.add_argument("--token-file", metavar="F", help="file holding the service's bearer token")
    p.add_argument(
        "--name",
        metavar="NAME",
        help="a named subscription: the service stores what is acknowledged, so a restart without "
        "--from-csn continues after it",
    )
    p.add_argument("--tls-ca", metavar="FILE", help="CA certificate (PEM) of a service that uses TLS")
    p.add_argument(
        "--format",
        choices=("native", "debezium", "debezium-adaptive"),
        default="native",
        help="native: one line per transaction (docs/design.md section 7); debezium: one Debezium change "
        'event per change, each on its own line (section 7, "Debezium envelope"); debezium-adaptive: the '
        "same, with dates, times and intervals as Debezium's connector writes them by default (numbers)",
    )
    p.add_argument(
        "--schemas",
        action="store_true",
        help="also print relation lines: each table's column names and types, the versions in force at the "
        "start first, then each new one before the first transaction it is in force with (docs/design.md "
        "section 7)",
    )


def _whole(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _csn(text: str) -> int:
    from csnd.core.ids import csn_from_str

    try:
        return csn_from_str(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    return _whole(text, 1, "a whole number >= 1")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def cmd_subscribe(args: argparse.Namespace) -> int:
    from csnd.consumers.grpcpoll import prefer_channel_thread_poller

    prefer_channel_thread_poller()  # (before gRPC is imported: it reads its experiments once)
    from csnd.consumers.client import ChangefeedClient
    from csnd.core.tokens import read_token_file

    token = read_token_file(args.token_file) if args.token_file else None
    feed = ChangefeedClient(
        args.target,
        after_csn=args.from_csn,
        name=args.name,
        tables=args.table,
        token=token,
        tls_ca=args.tls_ca,
        schemas=args.schemas,
        format=args.format,
        read_on_caller=True,  # (this thread only waits for lines: no response thread, no hand-off)
    )
    try:
        feed.connect()
        # A buffer of our own: under PYTHONUNBUFFERED (common in containers) sys.stdout's
        # is none, and every line cost two write system calls.  It is flushed before
        # each acknowledgement, so nothing is acknowledged before it is written.
        with os.fdopen(sys.stdout.fileno(), "wb", buffering=OUT_BUFFER_BYTES, closefd=False) as out:
            _print(feed, out, args.limit, args.idle_timeout)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly.  Python would try to
        # flush stdout again at exit and complain; point it at /dev/null.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    finally:
        feed.close()
    return 0


class _Switching:
    """The interpreter's switch interval by regime: LIVE_SWITCH_S while waiting for lines, the
    process's own (csnd.cli's 20 ms) while a backlog comes in full runs; only a change calls
    `sys.setswitchinterval`."""

    __slots__ = ("drain_s", "live_s", "live")

    def __init__(self) -> None:
        self.drain_s = sys.getswitchinterval()
        self.live_s = min(LIVE_SWITCH_S, self.drain_s)
        self.live = False

    def waiting(self) -> None:
        if not self.live:
            self.live = True
            sys.setswitchinterval(self.live_s)

    def backlog(self) -> None:
        if self.live:
            self.live = False
            sys.setswitchinterval(self.drain_s)


def _print(feed: Any, out: Any, limit: int | None, idle: float | None) -> None:
    """Prints the feed's lines to `out`, acknowledging each only once it is flushed (paced: AckPacer)."""
    pacer = AckPacer(time.monotonic(), ACK_INTERVAL_S, ACK_EVERY)  # (the module's, read each run)
    switching = _Switching()
    try:
        _print_lines(feed, out, limit, idle, pacer, switching)
    except BaseException:
        # Ctrl-C, a closed stdout: what was flushed is written, so acknowledged as before; a
        # line written but not flushed is not (the client's close sends what is asked here).
        csn = pacer.take_all(time.monotonic())
        if csn is not None:
            feed.ack(csn)
        raise
    finally:
        switching.backlog()  # (the process's own interval again)


def _print_lines(
    feed: Any, out: Any, limit: int | None, idle: float | None, pacer: AckPacer, switching: _Switching
) -> None:
    from csnd.consumers.client import LargeLine, RelationRecord

    printed = 0
    unflushed: int | None = None  # csn of the newest line written but not yet flushed
    unflushed_lines = 0
    last_line_at = time.monotonic()

    def flush(end: bool = False) -> None:
        nonlocal unflushed, unflushed_lines
        if unflushed is not None:
            out.flush()
            pacer.flushed(unflushed, unflushed_lines)
            unflushed, unflushed_lines = None, 0
        now = time.monotonic()
        csn = pacer.take_all(now) if end else pacer.take(now)
        if csn is not None:
            feed.ack(csn)

    while limit is None or printed < limit:
        run = feed.take_ready(RUN_LINES if limit is None else min(RUN_LINES, limit - printed))
        if run:  # (a backlog: written a run at a time)
            out.write(b"\n".join([line for _, line in run]))
            out.write(b"\n")
            before, printed = printed, printed + len(run)
            unflushed = run[-1][0]
            unflushed_lines += len(run)
            last_line_at = time.monotonic()
            if len(run) == RUN_LINES:
                switching.backlog()
            if printed // ACK_EVERY != before // ACK_EVERY:
                flush()
            continue
        rec = feed.next_spooled(timeout=0)
        if rec is None:
            flush()
            now = time.monotonic()
            wait = None if idle is None else idle - (now - last_line_at)
            if wait is not None and wait <= 0:
                break
            switching.waiting()
            ack_due = pacer.due_in(now)  # (a quiet stream's last line is acknowledged when due)
            if ack_due is not None and (wait is None or ack_due < wait):
                wait = ack_due
            rec = feed.next_spooled(timeout=wait)
            if rec is None:
                continue
        csn, line = rec
        if isinstance(line, LargeLine):  # (came in pieces: copied from its spool, never held whole)
            shutil.copyfileobj(line, out, SPOOL_COPY_BYTES)
        else:
            out.write(line)
        out.write(b"\n")
        if type(rec) is RelationRecord:
            continue  # (not a transaction: neither counted nor acknowledged)
        printed += 1
        unflushed = csn
        unflushed_lines += 1
        last_line_at = time.monotonic()
        if printed % ACK_EVERY == 0:
            flush()
    flush(end=True)
