"""The `csnd` command line (docs/design.md section 8; other tools script against it).

A command imports its own modules only, when it runs: `main` builds the parser
of the command it was given in full and every other command from its one help
line (`_HELP`), so `csnd --help` and a `csnd subscribe` do not pay for psycopg,
grpc, the service or the GTM kit (together ~0.25 s of a process's start, paid
by every `csnd` the tests and the demo start).  `build_parser()` still builds
every command in full (docs/reference.md is generated from it).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from csnd import __version__
from csnd.core.addresses import listen_address
from csnd.core.appname import default_application_name
from csnd.core.errors import ConfigError, CsndError, UsageError, os_error_text
from csnd.core.ids import lsn_from_str, lsn_to_str
from csnd.runtime.logsetup import FORMATS, chosen_format
from csnd.runtime.logsetup import configure as configure_logging
from csnd.runtime.stopping import Interrupted, Terminated, install_stop_handlers

if TYPE_CHECKING:
    from csnd.runtime.options import AgentDialConfig, LiveSourceConfig, NodeAgentConfig, ReplayConfig

DESCRIPTION = """\
csnd: parallel, CSN-ordered logical decoding for PostgreSQL-family clusters.

Reads the pgoutput change streams of one or more nodes (live, or recorded
*.pgstream files), decodes them in parallel, orders every node's committed
transactions by commit CSN, merges the nodes into one transaction-consistent
stream and writes it as JSON lines.
"""

SOURCE_HELP = (
    "a recorded stream file [NAME=]PATH, or a live node [NAME=]postgresql://... "
    "(live nodes need --slot and --publication)"
)


# --decoders at most: a few per core keeps every core busy while a decoder
# waits; far more only costs memory (each is a process of ~6 MB and more).
MAX_DECODERS = 4 * (os.cpu_count() or 1)


def _decoders(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number from 1 to {MAX_DECODERS} (4 per core), got {text!r}"
        ) from None
    if not 1 <= n <= MAX_DECODERS:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_DECODERS} (4 per core), got {n}")
    return n


def _listen(text: str) -> str:
    """--listen as `--http` takes it (csnd.core.addresses): HOST:PORT, PORT 0 to 65535."""
    try:
        return listen_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _lsn(text: str) -> str:
    try:  # (checked here whatever the source; kept as text)
        lsn_from_str(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        s = math.nan
    if not s > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return s


_LOG_FORMAT_HELP = (
    "log records as text (a UTC timestamp, then csnd: MESSAGE) or json (one object a line); "
    "default text, or CSND_LOG_FORMAT"
)

_VERBOSE = argparse.ArgumentParser(add_help=False)  # (-v after the subcommand too)
_VERBOSE.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress")


def _add_live_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live sources")
    g.add_argument("--slot", help="logical replication slot (pgoutput) on the live node")
    g.add_argument("--publication", help="publication the slot streams")
    g.add_argument("--create-slot", action="store_true", help="create the slot if it does not exist")
    g.add_argument(
        "--failover-slot",
        action="store_true",
        help="with --create-slot: make it a failover slot, which standbys with sync_replication_slots "
        "keep a copy of, so a promoted standby can be followed (PostgreSQL 17+; docs/failover.md)",
    )
    g.add_argument(
        "--until-lsn",
        metavar="LSN",
        type=_lsn,
        help="end the source at the first transaction boundary at or after LSN (X/X)",
    )
    g.add_argument(
        "--give-up",
        type=_seconds,
        default=300.0,
        metavar="SECONDS",
        help="how long a stream that was flowing may stay lost before the run fails (default 300); "
        "a failing first connection or a permanent error (authentication, no such slot, "
        "publication or database) fails at once",
    )
    g.add_argument(
        "--slot-wait-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="give up making a slot (--create-slot) that has waited this long for the transactions "
        "open on its server, leaving no slot behind (default: no limit; the wait names them)",
    )
    g.add_argument("--text", action="store_true", help="ask for values in text form instead of binary")
    g.add_argument(
        "--mode",
        choices=("single", "gtm"),
        default="single",
        help="CSN mode of the node: single (CSN = commit LSN) or gtm (csn markers); default single",
    )


def _add_record_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "record",
        parents=[_VERBOSE],
        help=_HELP["record"],
        description="Capture a live node's replication stream (pgoutput v2) into FILE.pgstream. "
        "The slot is confirmed only to what is fsynced to the file, so a second recording on the "
        "same slot continues exactly where this one ended. The file is synced every second, every "
        "8 MiB and at each lull in the stream; Ctrl-C or SIGTERM syncs it and confirms what it holds "
        "before exiting (130 / 143).",
    )
    p.add_argument("source", metavar="SOURCE", help="a live node [NAME=]postgresql://...")
    p.add_argument("--out", required=True, metavar="FILE.pgstream", help="file to write")
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--append",
        dest="how",
        action="store_const",
        const="append",
        default="create",
        help="continue an existing FILE: its header must match, a torn last frame is cut, and it must "
        "hold the stream up to where the slot resumes (an existing FILE is refused without "
        "--append or --replace: its transactions are already confirmed to the slot)",
    )
    how.add_argument(
        "--replace", dest="how", action="store_const", const="replace", help="overwrite an existing FILE"
    )
    _add_live_options(p)


def _add_replay_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.runtime.options import AGENT_GIVE_UP_S
    from csnd.service.serve_cmd import add_agent_dial_options

    p = sub.add_parser(
        "replay",
        parents=[_VERBOSE],
        help=_HELP["replay"],
        description="Run the whole pipeline (reader, decoder processes, sender, coordinator) over "
        "the sources and write the transaction JSON lines of docs/design.md section 7 in global CSN order. "
        "Exit 0 when every source has ended; on any error exit 1 with one line on stderr. "
        "With csnd -v (or when stderr is a terminal) a progress line every 2 s -- transactions and "
        "megabytes written, and per node how much of its recorded file was read, the changes "
        "decoded and how full the decoder inboxes are -- and a closing 'done:' line.",
    )
    p.add_argument("sources", nargs="+", metavar="SOURCE", help=SOURCE_HELP)
    p.add_argument(
        "--decoders",
        type=_decoders,
        default=os.cpu_count() or 1,
        help="decoder processes per node (default: the number of cores; at most 4 per core)",
    )
    p.add_argument(
        "--output",
        metavar="FILE",
        help="write JSON lines here instead of stdout: as FILE.partial, renamed to FILE once every source "
        "has ended (a device or FIFO is written directly; an input is refused). With a live source or a "
        "node agent, FILE and FILE.partial must not exist: an interrupted live run leaves FILE.partial "
        "holding everything its slot will not send again, and the next run refuses to start until it is "
        "moved away",
    )
    _add_live_options(p)

    p.add_argument(
        "--agent-give-up",
        type=_seconds,
        default=AGENT_GIVE_UP_S,
        metavar="SECONDS",
        help="how long to keep reconnecting to a grpc:// node agent that went away (default 30)",
    )
    add_agent_dial_options(p)
    p.add_argument(
        "--schemas",
        action="store_true",
        help="also write a relation line (a table's column names and types) before the first transaction "
        "that uses each version of a table (docs/design.md section 7)",
    )


def _add_node_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "node",
        parents=[_VERBOSE],
        help=_HELP["node"],
        description="Run reader, decoder processes and sender for one node (a live node or a "
        "recorded file) and serve its CSN-ordered batches and watermarks over gRPC to a "
        "coordinator (`csnd replay grpc://HOST:PORT`). Batches are kept until the coordinator "
        "acknowledges them, so a dropped connection or a restarted agent neither loses nor repeats "
        "one; a live slot is confirmed only as far as the coordinator says its output is durable. "
        "Prints 'listening on HOST:PORT' on stderr; runs until SIGTERM or Ctrl-C.",
    )
    p.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    p.add_argument(
        "--listen",
        required=True,
        type=_listen,
        metavar="HOST:PORT",
        help="address to serve on (port 0: any free port; :PORT is 127.0.0.1:PORT)",
    )
    p.add_argument(
        "--decoders",
        type=_decoders,
        default=os.cpu_count() or 1,
        help="decoder processes (default: the number of cores; at most 4 per core)",
    )
    g = p.add_argument_group(
        "security (a --listen address beyond the loopback needs --token-file and --tls-cert/--tls-key)"
    )
    g.add_argument(
        "--token-file",
        metavar="F",
        help="require 'authorization: Bearer <token in F>' on every call but health checks",
    )
    g.add_argument("--tls-cert", metavar="PEM", help="serve over TLS with this certificate chain")
    g.add_argument("--tls-key", metavar="PEM", help="... and this private key")
    g.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="mutual TLS: let in only clients with a certificate signed by this CA (the coordinator's "
        "--agent-cert)",
    )
    g.add_argument(
        "--insecure-listen",
        action="store_true",
        help="serve an address beyond the loopback without a token or TLS anyway (anyone who reaches it "
        "reads every row and can move the slot; warned on every start)",
    )
    _add_live_options(p)


def _add_slot_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.runtime.slot_cmd import add_slot_parser

    add_slot_parser(sub, _VERBOSE)


def _add_generate_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "generate",
        parents=[_VERBOSE],
        help=_HELP["generate"],
        description="Write DIR/dn1.pgstream ... DIR/dnK.pgstream: a GTM-mode cluster with interleaved "
        "and out-of-CSN-order commits, aborts after committing, distributed transactions, DDL, "
        "streamed large transactions, unchanged TOAST and every replica identity; plus "
        "DIR/expected.jsonl, the output csnd replay must produce.",
    )
    p.add_argument("--nodes", type=int, default=1, metavar="K")
    p.add_argument("--transactions", type=int, default=1000, metavar="N")
    p.add_argument("--seed", type=int, default=1, metavar="S")
    p.add_argument("--text", action="store_true", help="values in text form instead of binary")
    p.add_argument("--out", required=True, metavar="DIR")


def _add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.demo import add_demo_parser

    add_demo_parser(sub)


def _add_subscribe_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.consumers.subscribe import add_subscribe_parser

    add_subscribe_parser(sub)


def _add_subscriptions_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.consumers.subscriptions_cmd import add_subscriptions_parser

    add_subscriptions_parser(sub)


def _add_snapshot_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.consumers.snapshot_cmd import add_snapshot_parser

    add_snapshot_parser(sub)


def _add_service_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.service.serve_cmd import add_service_parsers

    add_service_parsers(sub)


def _add_cluster_kit_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from csnd.gtm.commands import add_parsers

    add_parsers(sub)


# Every command in the order --help lists them, with its one help line: what
# `csnd --help` prints without importing the command's modules.  The lines of
# the commands defined elsewhere are copies of their own parsers' help
# (tests/cli/test_lazy_commands.py holds the two equal).
_HELP: Final = {
    "record": "capture a live node's stream to a recorded stream file",
    "replay": "run the pipeline over sources and print transaction JSON lines in CSN order",
    "node": "run one node's pipeline as a node agent serving the coordinator over gRPC",
    "slot": "list or drop replication slots on a live node",
    "generate": "write a synthetic GaussDB-style cluster of recorded stream files",
    "demo": "run the embedded default: a local cluster, the service, a subscriber and Spark",
    "subscribe": "print a csnd service's transactions as JSON lines, acknowledging them",
    "subscriptions": "list, reset or delete a csnd service's named subscriptions",
    "snapshot": "take an incremental snapshot of tables in a running service",
    "serve": "run the service: durable changelog, gRPC changefeed, dashboard",
    "changelog": "print or check a changelog directory without a running service",
    "gtm": "shared GTM tools (in-doubt recovery)",
    "workload": "run concurrent distributed writers on live nodes through the shared GTM",
}

# What adds each command's parser (one call adds the commands named with it).
_PARSERS: Final = (
    (("record",), _add_record_parser),
    (("replay",), _add_replay_parser),
    (("node",), _add_node_parser),
    (("slot",), _add_slot_parser),
    (("generate",), _add_generate_parser),
    (("demo",), _add_demo_parser),
    (("subscribe",), _add_subscribe_parser),
    (("subscriptions",), _add_subscriptions_parser),
    (("snapshot",), _add_snapshot_parser),
    (("serve", "changelog"), _add_service_parsers),
    (("gtm", "workload"), _add_cluster_kit_parsers),
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command in full, or with `only`, that command alone and the others' help lines.

    Parsing a command's arguments with `build_parser(only=COMMAND)` gives what
    `build_parser()` gives; only that command's modules are imported.
    """
    parser = argparse.ArgumentParser(
        prog="csnd", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"csnd {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and reconnects")
    parser.add_argument("--log-format", choices=FORMATS, help=_LOG_FORMAT_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for names, add_parsers in _PARSERS:
        if only is None or only in names:
            add_parsers(sub)
        else:
            for name in names:
                sub.add_parser(name, help=_HELP[name])
    for command in sub.choices.values():  # -v after any subcommand, as before it
        if not any("--verbose" in a.option_strings for a in command._actions):
            command.add_argument(
                "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress"
            )
        if not any("--log-format" in a.option_strings for a in command._actions):
            command.add_argument(
                "--log-format", choices=FORMATS, default=argparse.SUPPRESS, help=_LOG_FORMAT_HELP
            )
    return parser


def _command_in(argv: Sequence[str]) -> str:
    """The command `argv` names: its first word that is neither an option nor --log-format's value ("" if none)."""
    words = iter(argv)
    for word in words:
        if word == "--":
            return next(words, "")
        if not word.startswith("-"):
            return word
        if "=" not in word and len(word) > 2 and "--log-format".startswith(word):
            next(words, None)  # (argparse takes any prefix of a long option, --log too)
    return ""


def parse_args(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """`build_parser().parse_args(argv)`, with the parser of the command `argv` names alone built in full."""
    command = _command_in(argv)
    parser = build_parser(only=command)
    args = parser.parse_args(argv)
    if args.command is not None and args.command != command:  # (argparse read it otherwise: parse in full)
        parser = build_parser()
        args = parser.parse_args(argv)
    return parser, args


def main(argv: Sequence[str] | None = None) -> int:
    parser, args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        log_format = chosen_format(args.log_format)
    except ValueError as e:
        print(f"csnd: error: {e}", file=sys.stderr)
        return 2
    configure_logging(args.verbose, log_format)
    if args.command is not None:
        default_application_name(args.command)
    if args.command is None:
        parser.print_help()
        return 2
    _tune_interpreter()
    if args.command in (
        "replay",
        "record",
        "subscribe",
        "serve",
        "gtm",
        "workload",
    ):  # (a node agent handles SIGTERM itself)
        install_stop_handlers()
    try:
        return int(COMMANDS[args.command](args))
    except CsndError as e:
        print(f"csnd {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1  # (2: called wrong, as argparse's usage errors)
    except OSError as e:
        # The net under the rest: the writers on the hot paths (recordings,
        # replay output) turn their own failures into errors naming node and
        # file; anything else a command cannot open or write still gets one
        # plain line, not a traceback.
        print(f"csnd {args.command}: error: {os_error_text(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        how, status = ("terminated", 143) if isinstance(e, Terminated) else ("interrupted", 130)
        partial = e.partial if isinstance(e, Interrupted) else ""  # (a replay that had started its output)
        where = f"; the incomplete output is in {partial}" if partial else ""
        print(f"csnd {args.command}: {how}{where}", file=sys.stderr)
        return status
    except Exception as e:  # not one of ours: a bug, still one line (the traceback with -v)
        if args.verbose:
            traceback.print_exc()
        print(
            f"csnd {args.command}: internal error: {type(e).__name__}: {e} (run with -v for the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        if "csnd.reader.live" in sys.modules:  # (a run that created slots says which hold WAL)
            from csnd.reader.live import CREATED_SLOTS
            from csnd.reader.slots import report_created

            report_created([(c.node, c.slot, c.conninfo) for c in CREATED_SLOTS], sys.stderr)
            CREATED_SLOTS.clear()  # (said once: a later run in this process names only its own)


# Python's cyclic collector looks at its youngest generation every N net
# allocations of container objects (700 by default).  csnd's main process
# makes a tuple per change and a few objects per transaction, nearly all
# freed by their reference counts within a batch: the young collections find
# nothing (none of the 60 in a 100,000-transaction drain collected an object),
# but each walks every young object still in flight -- the queues between
# the threads hold tens of thousands.  At 10,000 they took 1.5 s of the
# 9.5 s `csnd serve` spent on 100,000 one-row transactions; at 100,000 there
# are one or two, 0.1-0.3 s (docs/performance.md, "Garbage collection").
# Cycles are still collected; the older generations keep their thresholds,
# counted in young collections.
GC_YOUNG_THRESHOLD = 100_000

# How long a thread that wants the GIL waits before it makes the holder let
# go (Python's default is 5 ms).  The service's reader, decoder collector,
# sender, coordinator and gRPC threads all want it at once under load, and
# each forced hand-over costs a wake-up and a cache refill: csnd serve spent
# 105 us of CPU per one-row transaction at 1 ms, 86 at 5 ms and 76-78 at
# 20 ms (docs/performance.md, "Thread switching").  Latency is unchanged at
# moderate load: waiting threads are mostly woken by the holder blocking on
# I/O or a queue, long before the interval.
SWITCH_INTERVAL_S = 0.02


def _tune_interpreter() -> None:
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def live_config(args: argparse.Namespace) -> LiveSourceConfig:
    """The live-source options of a command, checked (an --until-lsn that is no LSN is refused for any source)."""
    from csnd.runtime.options import LiveSourceConfig
    from csnd.runtime.sources import parse_lsn_arg

    return LiveSourceConfig(
        slot=args.slot,
        publication=args.publication,
        create_slot=args.create_slot,
        failover_slot=args.failover_slot,
        until_lsn=parse_lsn_arg(args.until_lsn) if args.until_lsn else None,
        binary=not args.text,
        mode=args.mode,
        give_up_s=args.give_up,
        slot_wait_timeout_s=args.slot_wait_timeout,
    )


def replay_config(args: argparse.Namespace) -> ReplayConfig:
    from csnd.runtime.options import ReplayConfig

    return ReplayConfig(
        sources=tuple(args.sources),
        output=args.output,
        decoders=args.decoders,
        live=live_config(args),
        agent_give_up_s=args.agent_give_up,
        agent_dial=agent_dial_config(args),
        verbose=args.verbose,
        schemas=args.schemas,
    )


def agent_dial_config(args: argparse.Namespace) -> AgentDialConfig:
    from csnd.runtime.options import AgentDialConfig

    return AgentDialConfig(
        token_file=args.agent_token_file, ca=args.agent_ca, cert=args.agent_cert, key=args.agent_key
    )


def node_config(args: argparse.Namespace) -> NodeAgentConfig:
    from csnd.core.tls import TlsFiles
    from csnd.runtime.options import NodeAgentConfig

    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("TLS needs both --tls-cert and --tls-key")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs TLS: give --tls-cert and --tls-key too")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    return NodeAgentConfig(
        source=args.source,
        listen=args.listen,
        decoders=args.decoders,
        live=live_config(args),
        token_file=args.token_file,
        tls=tls,
        insecure_listen=args.insecure_listen,
    )


def cmd_record(args: argparse.Namespace) -> int:
    from csnd.reader.live import LiveSource
    from csnd.reader.record_cmd import record
    from csnd.runtime.sources import open_live, parse_source

    spec = parse_source(args.source)
    if not spec.is_live:
        raise ConfigError(f"record needs a live source (postgresql://...), got {args.source!r}")
    source = open_live(spec, live_config(args))
    assert isinstance(source, LiveSource)
    summary = record(source, args.out, how=args.how)
    print(
        f"recorded {summary.transactions} transactions ({summary.frames} frames, {summary.bytes} bytes) "
        f"from node {source.node} to {summary.path}; slot confirmed to {lsn_to_str(summary.confirmed_lsn)}",
        file=sys.stderr,
    )
    return 0


def install_agent_runtime() -> None:
    """What `csnd node` sets up before serving (for a caller that runs `serve` itself)."""
    _tune_interpreter()
    _start_decoder_server()


def _start_decoder_server() -> None:
    """Let the decoder workers' fork server load the decoding layer while this process imports its own."""
    from csnd.decoder.pool import start_worker_server

    start_worker_server()


def cmd_replay(args: argparse.Namespace) -> int:
    from csnd.runtime.sources import parse_source

    if not all(parse_source(s).is_grpc for s in args.sources):  # node agents decode for themselves
        _start_decoder_server()
    from csnd.runtime.replay import run_replay

    return run_replay(replay_config(args))


def cmd_node(args: argparse.Namespace) -> int:
    _start_decoder_server()
    from csnd.runtime.agent import serve

    return serve(node_config(args))


def cmd_generate(args: argparse.Namespace) -> int:
    from csnd.gtm.generate import generate_cluster

    if args.nodes < 1 or args.transactions < 0:
        raise ConfigError("--nodes must be >= 1 and --transactions >= 0")
    summary = generate_cluster(
        args.out, nodes=args.nodes, transactions=args.transactions, seed=args.seed, binary=not args.text
    )
    print(
        f"generated {summary.nodes} node(s) in {args.out}: {summary.transactions} global transactions "
        f"({summary.committed} committed, {summary.aborted} aborted), {summary.changes} changes, "
        f"{summary.bytes / 1e6:.1f} MB of streams; expected output in {summary.expected}",
        file=sys.stderr,
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from csnd.demo import run_demo

    return run_demo(args)


# The commands defined elsewhere, imported as they run.


def cmd_slot(args: argparse.Namespace) -> int:
    from csnd.runtime.slot_cmd import cmd_slot

    return cmd_slot(args)


def cmd_subscribe(args: argparse.Namespace) -> int:
    from csnd.consumers.subscribe import cmd_subscribe

    return cmd_subscribe(args)


def cmd_subscriptions(args: argparse.Namespace) -> int:
    from csnd.consumers.subscriptions_cmd import cmd_subscriptions

    return cmd_subscriptions(args)


def cmd_snapshot(args: argparse.Namespace) -> int:
    from csnd.consumers.snapshot_cmd import cmd_snapshot

    return cmd_snapshot(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from csnd.service.serve_cmd import cmd_serve

    return cmd_serve(args)


def cmd_changelog(args: argparse.Namespace) -> int:
    from csnd.service.serve_cmd import cmd_changelog

    return cmd_changelog(args)


def cmd_cluster_kit(args: argparse.Namespace) -> int:
    """`csnd gtm` and `csnd workload`."""
    from csnd.gtm.commands import COMMANDS as CLUSTER_KIT_COMMANDS

    return int(CLUSTER_KIT_COMMANDS[args.command](args))


COMMANDS = {
    "record": cmd_record,
    "replay": cmd_replay,
    "node": cmd_node,
    "slot": cmd_slot,
    "generate": cmd_generate,
    "demo": cmd_demo,
    "subscribe": cmd_subscribe,
    "subscriptions": cmd_subscriptions,
    "snapshot": cmd_snapshot,
    "serve": cmd_serve,
    "changelog": cmd_changelog,
    "gtm": cmd_cluster_kit,
    "workload": cmd_cluster_kit,
}

if __name__ == "__main__":
    sys.exit(main())
