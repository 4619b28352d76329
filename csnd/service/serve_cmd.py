"""The command-line side of the service: `csnd serve` and `csnd changelog` (docs/design.md section 8)."""

from __future__ import annotations

import argparse
import os

from csnd.core.errors import ConfigError
from csnd.core.ids import csn_from_str
from csnd.runtime.logsetup import set_format as set_log_format
from csnd.service import settings
from csnd.service.settings import SETTINGS, flag_type

SERVE_DESCRIPTION = """\
Run csnd as a service: the pipeline over the sources, every merged transaction
appended in CSN order to the durable changelog in DIR (fsynced before anyone
sees it, group-committed), the gRPC changefeed (Subscribe, Fetch, Status,
health, reflection) on --listen and, with --http, the dashboard, /metrics and
/api/status. Each live source's slot is confirmed exactly as far as the
changelog is durable, also while the node is idle.

Ready: once every live source's slot exists (--create-slot makes it first)
it prints 'csnd serve: listening on HOST:PORT' (and 'csnd serve: dashboard on
http://HOST:PORT/', https:// with --tls-cert), and every transaction committed after that line is
delivered; port 0 picks a free port. Sources that end (files, until_lsn)
leave it serving what it has. SIGTERM or Ctrl-C: stop taking input, make
durable, confirm the slots, exit 0. A restart resumes from
the changelog: nothing lost, nothing twice. A dead decoder or a lost node
agent restarts the pipeline with backoff (5 failures in 5 minutes: exit 1);
a protocol error is one line naming node, LSN and xid, exit 1.

Probes (--http; open without the token, HEAD as GET): /healthz answers 200
while the process is up, from before the ready line on. /readyz answers 200
once it is ready (slots prepared, changelog open, pipeline running or its
sources ended) and 503 with a one-line reason otherwise: still starting,
stopping, the pipeline failed, a node failed, or a node reconnecting or
restarting for longer than --readiness-grace. With --token-file the dashboard
asks for the token in a form (never in the URL) and keeps a session cookie,
Secure over TLS; scripts send 'Authorization: Bearer <token>'.

Per-source live settings ride on the URL:
  dn1=postgresql://app@db1/shop?slot=csnd_dn1&publication=shop&mode=gtm
(parameters slot, publication, mode, until_lsn, create_slot, failover_slot, text, snapshot,
receive_timeout, slot_wait_timeout); the
--slot/--publication/... flags are the default for every source. --config
FILE holds the same settings as TOML (docs/service.md).
"""


def _csn(text: str) -> int:
    try:
        return csn_from_str(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_service_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="run the service: durable changelog, gRPC changefeed, dashboard",
        description=SERVE_DESCRIPTION,
        epilog=settings.environment_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sources",
        nargs="*",
        metavar="SOURCE",
        help="[NAME=]FILE.pgstream, [NAME=]postgresql://...?slot=S&publication=P, or grpc://HOST:PORT",
    )
    p.add_argument("--changelog", metavar="DIR", help="the changelog directory (created if missing)")
    p.add_argument(
        "--listen",
        type=flag_type(settings.ADDRESS),
        metavar="HOST:PORT",
        help="gRPC address (default 127.0.0.1:7070; port 0: any; :PORT is 127.0.0.1:PORT)",
    )
    p.add_argument(
        "--http",
        type=flag_type(settings.ADDRESS),
        metavar="HOST:PORT",
        help="serve the dashboard, /metrics, /api/status, /healthz and /readyz here (HTTPS with --tls-cert)",
    )
    p.add_argument(
        "--http-allowed-hosts",
        type=flag_type(settings.HOSTS),
        metavar="HOST,...",
        help="host names --http answers to besides localhost, addresses and its own (a guard against "
        "DNS rebinding; the probes answer any): the names a browser or scraper reaches it by; * for any",
    )
    p.add_argument(
        "--decoders",
        type=flag_type(settings.WHOLE),
        metavar="N",
        help="decoder processes per node (default 2)",
    )
    p.add_argument(
        "--token-file",
        metavar="F",
        help="require 'authorization: Bearer <token in F>' on every call (but health checks)",
    )
    p.add_argument(
        "--credentials-file",
        metavar="F",
        help="per-consumer tokens with roles (read, admin) and the named subscriptions each may hold: lines "
        "NAME ROLE TOKEN-SHA256 [SUBSCRIPTION,...] (docs/design.md section 8); --token-file's token stays admin",
    )
    p.add_argument(
        "--max-streams",
        type=flag_type(settings.WHOLE),
        metavar="N",
        help="streams (Subscribe, Fetch) served at once; one more is refused RESOURCE_EXHAUSTED while "
        "Status and health keep answering (default 256)",
    )
    p.add_argument(
        "--max-streams-per-peer",
        type=flag_type(settings.WHOLE),
        metavar="N",
        help="streams one client host may hold at once (default 64)",
    )
    p.add_argument(
        "--tls-cert", metavar="PEM", help="serve gRPC and --http over TLS with this certificate chain"
    )
    p.add_argument("--tls-key", metavar="PEM", help="... and this private key")
    p.add_argument(
        "--health-needs-token",
        action="store_const",
        const=True,
        help="with --token-file, gRPC health checking needs the token too (default: open, for probes "
        "that cannot send one; reflection and every other call always need it)",
    )
    p.add_argument(
        "--retention-bytes",
        type=flag_type(settings.WHOLE),
        metavar="B",
        help="keep at most B bytes of changelog",
    )
    p.add_argument(
        "--retention-hours",
        type=flag_type(settings.POSITIVE),
        metavar="H",
        help="drop segments older than H hours",
    )
    p.add_argument(
        "--retention-hold-bytes",
        type=flag_type(settings.WHOLE),
        metavar="B",
        help="named subscriptions and the Parquet export keep the records they have not read while the "
        "changelog is at most B bytes (default: twice --retention-bytes); past it those go, and the "
        "consumer behind is told out of range",
    )
    p.add_argument(
        "--retention-hold-hours",
        type=flag_type(settings.POSITIVE),
        metavar="H",
        help="... and while those records are at most H hours old (default: twice --retention-hours)",
    )
    p.add_argument(
        "--parquet-dir",
        type=flag_type(settings.TEXT),
        metavar="DIR",
        help="also write the changelog to DIR as Parquet files of CSN ranges, in the csnd Spark source's "
        "row schema, for spark.read.parquet and Spark's file-stream source (docs/design.md section 8)",
    )
    p.add_argument(
        "--gtm",
        type=flag_type(settings.TEXT),
        metavar="URL",
        help="the shared GTM's server (as csnd gtm and csnd workload take it): in GTM mode the initial "
        "snapshot is taken under a short commit barrier, at one CSN on every node (docs/design.md section 5)",
    )
    p.add_argument(
        "--gtm-barrier-timeout",
        type=flag_type(settings.POSITIVE),
        metavar="SECONDS",
        help="how long that commit barrier may hold the GTM, waiting for commits under way and the nodes, "
        "before it releases it and the start fails naming the gid or node that held it (default 10)",
    )
    p.add_argument(
        "--arrow-files-bytes",
        type=flag_type(settings.BYTES),
        metavar="B",
        help="disk the Spark source's rows may take, uncompressed, in CHANGELOG/arrow-files, where executors "
        "on this host map them instead of receiving them (default 1 GiB; 0: none, every executor receives them)",
    )
    p.add_argument(
        "--give-up",
        type=flag_type(settings.POSITIVE),
        metavar="SECONDS",
        help="how long a live source or node agent that was flowing is reconnected to (default 300)",
    )
    p.add_argument(
        "--readiness-grace",
        type=flag_type(settings.NOT_NEGATIVE),
        metavar="SECONDS",
        help="how long a node may be reconnecting or restarting before /readyz answers 503 (default 30)",
    )
    p.add_argument(
        "--config", metavar="FILE", help="settings as TOML; flags and CSND_* variables override it"
    )
    add_agent_dial_options(p)
    g = p.add_argument_group("live sources (defaults for every postgresql:// source)")
    g.add_argument("--slot", help="logical replication slot (pgoutput)")
    g.add_argument("--publication", help="publication the slot streams")
    g.add_argument("--create-slot", action="store_const", const=True, help="create the slot if missing")
    g.add_argument(
        "--failover-slot",
        action="store_const",
        const=True,
        help="a slot --create-slot makes is a failover slot, followed after a promotion "
        "(PostgreSQL 17+; docs/failover.md)",
    )
    g.add_argument(
        "--until-lsn", type=flag_type(settings.LSN), metavar="LSN", help="end the source at this LSN"
    )
    g.add_argument("--text", action="store_const", const=True, help="values in text form instead of binary")
    g.add_argument("--mode", choices=("single", "gtm"), help="CSN mode of the nodes (default single)")
    g.add_argument(
        "--snapshot",
        choices=("initial", "never", "when_needed"),
        help="initial: on the first start (empty changelog) make the slot with an exported snapshot and "
        "write the published tables into the changelog as reads before the first streamed transaction; "
        "when_needed: the same, only when the slot does not exist yet; never (default): stream only",
    )
    g.add_argument(
        "--receive-timeout",
        type=flag_type(settings.POSITIVE),
        metavar="SECONDS",
        help="silence on a replication connection (a reply asked for half way) after which it counts as "
        "lost and is reconnected (default 60)",
    )
    g.add_argument(
        "--slot-wait-timeout",
        type=flag_type(settings.POSITIVE),
        metavar="SECONDS",
        help="give up making a slot (--create-slot, --snapshot) that has waited this long for the "
        "transactions open on its server, leaving no slot behind (default: no limit; the wait names them)",
    )

    p = sub.add_parser(
        "changelog",
        help="print or check a changelog directory without a running service",
        description="Print the docs/design.md section 7 JSON lines of the transactions of a changelog with "
        "FROM < csn <= UNTIL, or with --check read every record (CRC, framing, CSN order) and print a "
        "summary. Opening the changelog cuts a torn tail, as the service does; a changelog a running "
        "service holds is refused (use csnd subscribe).",
    )
    p.add_argument("directory", metavar="DIR")
    p.add_argument(
        "--from-csn",
        type=_csn,
        default=0,
        metavar="X",
        help="after this CSN (default 0: the oldest); an LSN like 0/16B3748 is taken too",
    )
    p.add_argument("--until-csn", type=_csn, metavar="Y", help="up to and including this CSN")
    p.add_argument("--check", action="store_true", help="verify every record; print a summary on stderr")
    p.add_argument(
        "--schemas",
        action="store_true",
        help="also print relation lines (a table's column names and types) as csnd subscribe --schemas does",
    )


def add_agent_dial_options(p: argparse.ArgumentParser) -> None:
    """How a coordinator (replay, serve) reaches node agents secured with --token-file and TLS."""
    g = p.add_argument_group("node agents (grpc:// sources)")
    g.add_argument("--agent-token-file", metavar="F", help="send the token in F (the agents' --token-file)")
    g.add_argument(
        "--agent-ca", metavar="PEM", help="dial the agents over TLS, trusting this CA for their certificates"
    )
    g.add_argument(
        "--agent-cert",
        metavar="PEM",
        help="mutual TLS: present this client certificate (for the agents' --tls-client-ca)",
    )
    g.add_argument("--agent-key", metavar="PEM", help="... and its private key")


def cmd_serve(args: argparse.Namespace) -> int:
    from csnd.service.config import serve_config
    from csnd.service.serve import run_serve

    flags = {s.key: getattr(args, s.key) for s in SETTINGS}
    config = serve_config({**flags, "config": args.config, "verbose": args.verbose}, list(args.sources))
    set_log_format(config.log_format)  # (the config file's log_format, now that it is read)
    for src in config.sources:
        if not (src.is_live or src.is_agent) and not os.path.exists(src.target):
            raise ConfigError(f"source {src.target!r}: no such file (a live node is postgresql://...)")
    from csnd.decoder.pool import start_worker_server

    if not all(s.is_agent for s in config.sources):
        start_worker_server()
    return run_serve(config)


def cmd_changelog(args: argparse.Namespace) -> int:
    from csnd.service.changelog_cmd import ChangelogQuery, run_changelog

    return run_changelog(
        ChangelogQuery(args.directory, args.from_csn, args.until_csn, args.check, args.schemas)
    )
