"""`csnd slot list URL` and `csnd slot drop NAME URL`: the replication slots of a live node.

The work is `csnd.reader.slots`; this is the command line around it.  Each
action is a subcommand with its own usage line, and what it is given is
checked before anything connects: URL is a `postgresql://` or `postgres://`
URL or a libpq `key=value` conninfo (parsed by libpq itself, so whatever
libpq would refuse is a usage error, exit 2), NAME a slot name the server
can hold.  What the server then says is one line naming the node's URL --
its password replaced by `***`, whichever form it came in -- and the slot,
exit 1; never a psycopg traceback or an "internal error".
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Final

from csnd.core.errors import SourceError

# A replication slot's name: what PostgreSQL accepts (ReplicationSlotValidateName), NAMEDATALEN - 1 long.
_SLOT_NAME: Final = re.compile(r"[a-z0-9_]{1,63}")
# `password=...` in a key=value conninfo or a URL's query, its value quoted or not.
_PASSWORD: Final = re.compile(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]*)")
URL_EXPECTED: Final = "a postgresql:// or postgres:// URL or a key=value conninfo"


def shown_conninfo(conninfo: str) -> str:
    """`conninfo` to print: its password, in the URL's user part or as `password=`, replaced by `***`."""
    from csnd.reader.slots import shown_url

    return _PASSWORD.sub(r"\1***", shown_url(conninfo))


def _conninfo(text: str) -> str:
    """An argparse type: a conninfo libpq can parse (the text unchanged)."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    from csnd.reader.reconnect import one_line

    if not text.startswith(("postgresql://", "postgres://")) and "=" not in text:
        raise argparse.ArgumentTypeError(f"expected {URL_EXPECTED}, got {shown_conninfo(text)!r}")
    try:
        conninfo_to_dict(text)
    except ProgrammingError as e:
        raise argparse.ArgumentTypeError(
            f"{shown_conninfo(text)!r} is not a valid conninfo: {one_line(str(e))}"
        ) from None
    return text


def _slot_name(text: str) -> str:
    if not _SLOT_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"expected a slot name (lower-case letters, digits and _, at most 63), got {text!r}"
        )
    return text


def add_slot_parser(sub: Any, verbose: argparse.ArgumentParser) -> None:
    """`csnd slot` with a subcommand per action (`verbose`: the parent parser giving -v)."""
    p = sub.add_parser(
        "slot",
        parents=[verbose],
        help="list or drop replication slots on a live node",
        description="A slot keeps WAL until it is confirmed or dropped: drop the ones a trial run "
        "left behind. URL is a postgresql:// or postgres:// URL or a key=value conninfo.",
    )
    actions = p.add_subparsers(dest="action", metavar="{list,drop}", required=True)
    ls = actions.add_parser(
        "list",
        parents=[verbose],
        help="the server's replication slots and the WAL each holds",
        description="One tab-separated line per replication slot of the server: name, type and "
        "plugin, database, state, restart LSN, confirmed LSN and the WAL it holds.",
    )
    ls.add_argument("url", metavar="URL", type=_conninfo, help="the node (" + URL_EXPECTED + ")")
    drop = actions.add_parser(
        "drop",
        parents=[verbose],
        help="drop an inactive slot",
        description="Drop an inactive replication slot (an active one is refused: stop its reader first).",
    )
    drop.add_argument("name", metavar="NAME", type=_slot_name, help="the slot")
    drop.add_argument("url", metavar="URL", type=_conninfo, help="the node (" + URL_EXPECTED + ")")


def cmd_slot(args: argparse.Namespace) -> int:
    import psycopg

    from csnd.reader.reconnect import one_line
    from csnd.reader.slots import drop_slot, list_slots, shown_url

    url: str = args.url
    shown = shown_conninfo(url)
    name: str | None = vars(args).get("name")  # (only `slot drop` has one)
    what = f"cannot drop replication slot {name}" if name else "cannot list the replication slots"
    try:
        if name is None:
            list_slots(url, sys.stdout)
        else:
            drop_slot(name, url)
    except SourceError as e:
        # (reader.slots hides a URL's user password only; a key=value conninfo it prints as given)
        text = e.message
        for raw in (url, shown_url(url)):
            text = text.replace(raw, shown)
        raise SourceError(text if name is None or name in text else f"{what}: {text}") from None
    except psycopg.Error as e:
        raise SourceError(f"{what} on {shown}: {one_line(str(e))}") from None
    if name is not None:
        print(f"dropped slot {name}", file=sys.stderr)
    return 0
