"""The cluster kit's commands: `csnd gtm recover` and `csnd workload` (registered by csnd.cli)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import psycopg

from csnd.core.errors import ConfigError, CsndError
from csnd.gtm.pggtm import DEFAULT_NAME
from csnd.gtm.ticker import TICK_INTERVAL


def _node(text: str) -> tuple[str, str]:
    name, sep, url = text.partition("=")
    if not sep or not name or not url:
        raise argparse.ArgumentTypeError(f"expected NAME=URL, got {text!r}")
    return name, url


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "gtm",
        help="shared GTM tools (in-doubt recovery)",
        description="Tools of the shared GTM (a PostgreSQL sequence and commit log on a designated server).",
    )
    gsub = p.add_subparsers(dest="gtm_command", metavar="SUBCOMMAND", required=True)
    r = gsub.add_parser(
        "recover",
        help="finish the global transactions of writers that died mid-commit",
        description="Find in-doubt global transactions of dead writers in the GTM's commit log: "
        "COMMIT PREPARED those whose commit was decided, ROLLBACK PREPARED the rest and log 'abort' "
        "where 'committing' was logged (read from the WAL with pg_walinspect). Transactions of live "
        "writers are left alone. Exit 0 when nothing is left unresolved, 1 otherwise.",
    )
    r.add_argument("--gtm", required=True, metavar="URL", help="the GTM server")
    r.add_argument("--gtm-name", default=DEFAULT_NAME, help=f"sequence name (default {DEFAULT_NAME})")
    r.add_argument("--node", action="append", type=_node, required=True, metavar="NAME=URL")
    r.add_argument("--wait", type=float, default=2.0, help="seconds to wait for writers' sessions to end")

    t = gsub.add_parser(
        "tick",
        help="write 'tick' watermarks to every node until stopped",
        description="The GTM's ticker as a process of its own: every --interval seconds it writes "
        "'tick <the GTM's current CSN>' to every node, flushed, so an idle node never holds back the "
        "merge of a csnd in GTM mode (a keepalive is no tick there). Shorter intervals: lower latency "
        "for transactions waiting on an idle node; longer: less WAL and fewer walsender wake-ups. "
        "Runs until SIGTERM or Ctrl-C.",
    )
    t.add_argument("--gtm", required=True, metavar="URL", help="the GTM server")
    t.add_argument("--gtm-name", default=DEFAULT_NAME, help=f"sequence name (default {DEFAULT_NAME})")
    t.add_argument("--node", action="append", type=_node, required=True, metavar="NAME=URL")
    t.add_argument("--interval", type=float, default=TICK_INTERVAL, metavar="SECONDS")

    w = sub.add_parser(
        "workload",
        help="run concurrent distributed writers on live nodes through the shared GTM",
        description="Run W writer processes doing distributed transactions (transfers, inserts, "
        "updates, deletes, rollbacks, aborts after committing) on the nodes through the shared GTM, "
        "with a ticker writing 'tick' watermarks to every node and in-doubt recovery at start. "
        "Prints progress every second on stderr and a summary; --out writes every committed "
        "transaction (gid, csn, row changes per node) as JSON lines by CSN.",
    )
    w.add_argument(
        "--nodes", nargs="+", required=True, metavar="[NAME=]URL", help="nodes (default names dn1..)"
    )
    w.add_argument("--gtm", metavar="URL", help="the GTM server (default: the first node)")
    w.add_argument("--gtm-name", default=DEFAULT_NAME)
    w.add_argument("--writers", type=int, default=4)
    w.add_argument("--rate", type=float, default=0.0, help="transactions/s over all writers (0: unlimited)")
    w.add_argument(
        "--duration",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long the writers run (default 10); Ctrl-C or SIGTERM ends the run early the same "
        "way: every writer finishes its transaction, then the summary and --out are written",
    )
    w.add_argument("--tick-interval", type=float, default=TICK_INTERVAL, metavar="SECONDS")
    w.add_argument("--accounts", type=int, default=50, help="accounts per node")
    w.add_argument("--seed", type=int, default=1)
    w.add_argument("--publication", help="create this publication for the workload's tables")
    w.add_argument("--out", metavar="FILE.jsonl", help="write the committed transactions here")


def cmd_gtm(args: argparse.Namespace) -> int:
    if args.gtm_command == "tick":
        return _tick(args)
    return _recover(args)


def _tick(args: argparse.Namespace) -> int:
    import threading

    from csnd.gtm.pggtm import PgGtm
    from csnd.gtm.ticker import Ticker

    if args.interval <= 0:
        raise ConfigError("--interval must be > 0")
    with PgGtm(args.gtm, args.gtm_name) as gtm:
        ticker = Ticker(gtm, dict(args.node), args.interval).start()
        print(f"csnd gtm tick: ticking {len(args.node)} nodes every {args.interval}s", file=sys.stderr)
        try:
            threading.Event().wait()  # until SIGTERM / Ctrl-C (KeyboardInterrupt)
        finally:
            ticker.stop()
    return 0


def _recover(args: argparse.Namespace) -> int:
    from csnd.gtm.pggtm import PgGtm
    from csnd.gtm.recovery import recover_in_doubt

    nodes = dict(args.node)
    conns: dict[str, psycopg.Connection[Any]] = {}
    try:
        for name, url in nodes.items():
            try:
                conns[name] = psycopg.connect(url, autocommit=True, connect_timeout=10)
            except psycopg.Error as e:
                raise CsndError(f"cannot connect: {str(e).strip().splitlines()[0]}", node=name) from e
        with PgGtm(args.gtm, args.gtm_name) as gtm:
            report = recover_in_doubt(conns, gtm, settle=args.wait)
    finally:
        for c in conns.values():
            c.close()
    for gid in report.committed:
        print(f"committed {gid}")
    for gid in report.aborted:
        print(
            f"aborted {gid}"
            + (
                f" (abort logged on {','.join(report.aborts_logged[gid])})"
                if gid in report.aborts_logged
                else ""
            )
        )
    for gid in report.in_flight:
        print(f"in flight {gid} (its writer is alive; left alone)")
    for local in report.unknown_prepared:
        print(f"unknown prepared transaction {local} (no gtm record; left alone)")
    for problem in report.errors:
        print(f"csnd gtm recover: error: {problem}", file=sys.stderr)
    print(f"csnd gtm recover: {report.summary()}", file=sys.stderr)
    return 1 if report.errors else 0


def cmd_workload(args: argparse.Namespace) -> int:
    from csnd.gtm.liveload import LoadOptions, run_workload

    nodes: dict[str, str] = {}
    for i, spec in enumerate(args.nodes):
        name, sep, url = spec.partition("=")
        if not sep or "://" in name:
            name, url = f"dn{i + 1}", spec
        if name in nodes:
            raise ConfigError(f"node {name} given twice")
        nodes[name] = url
    if args.writers < 1 or args.duration <= 0 or args.rate < 0 or args.tick_interval <= 0:
        raise ConfigError("--writers must be >= 1, --duration and --tick-interval > 0, --rate >= 0")
    opts = LoadOptions(
        nodes=nodes,
        gtm=args.gtm or next(iter(nodes.values())),
        gtm_name=args.gtm_name,
        writers=args.writers,
        rate=args.rate,
        duration=args.duration,
        tick_interval=args.tick_interval,
        accounts=args.accounts,
        seed=args.seed,
        publication=args.publication,
        out=args.out,
    )
    try:
        summary = run_workload(opts)
    except psycopg.Error as e:
        raise CsndError(f"workload: {str(e).strip().splitlines()[0]}") from e
    print(f"csnd workload: {summary.line()}", file=sys.stderr)
    for problem in summary.errors:
        print(f"csnd workload: error: {problem}", file=sys.stderr)
    return 1 if summary.errors else 0


COMMANDS = {"gtm": cmd_gtm, "workload": cmd_workload}
