"""The `application_name` csnd's PostgreSQL connections give, so `pg_stat_activity` says who they are.

pg_recvlogical and Debezium name their connections; a blank name in
`pg_stat_replication` leaves an operator guessing which process holds a slot.
Every connection of a csnd process is named `csnd COMMAND` (`csnd serve`,
`csnd record`, ...) through libpq's PGAPPNAME, so no connect call can miss it;
the connections that belong to one node add the node's name
(`csnd serve dn1`) with `for_node`.

The operator's choice wins: a URL that sets `application_name`, or a
PGAPPNAME of the operator's own, is left as it is.
"""

from __future__ import annotations

import os
from typing import Final

# psycopg is imported where a URL is read, not here: every `csnd` command
# names its process first, and a command without a PostgreSQL connection
# (`csnd subscribe`, `csnd --help`) should not pay psycopg's ~0.1 s import.

ENV: Final = "PGAPPNAME"

_process_name: str | None = None  # set by `default_application_name`; None: the operator named it


def default_application_name(command: str) -> None:
    """Name every libpq connection of this process (and its children) `csnd COMMAND`, unless PGAPPNAME is set."""
    global _process_name
    given = os.environ.get(ENV)
    # A name that is csnd's own came from csnd: a parent csnd process, or an earlier
    # command run in this process (the tests run several); it is not the operator's.
    if given and not given.startswith("csnd "):
        _process_name = None
        return
    _process_name = f"csnd {command}"
    os.environ[ENV] = _process_name


def for_node(conninfo: str, node: str) -> dict[str, str]:
    """`{"application_name": "csnd COMMAND NODE"}` to connect with, or {} when the URL or the operator names it."""
    if _process_name is None:
        return {}
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        if conninfo_to_dict(conninfo).get("application_name"):
            return {}
    except psycopg.ProgrammingError:
        return {}  # (a malformed URL: the connection attempt says what is wrong with it)
    return {"application_name": f"{_process_name} {node}"[:63]}  # (NAMEDATALEN - 1: the server cuts it)


def named_conninfo(conninfo: str, node: str) -> str:
    """`conninfo` with the node's `application_name` added (as it was when the URL or the operator names it)."""
    from psycopg.conninfo import make_conninfo

    extra = for_node(conninfo, node)
    return make_conninfo(conninfo, **extra) if extra else conninfo
