"""Tables new to a when_needed node's publication, snapshotted by a job of their own.

A source with `snapshot = "when_needed"` streams the tables its slot already
had without a snapshot; a table added to its publication later has rows the
stream never carried.  The job thread of `csnd.snapshot.incremental` looks at
each such publication now and then and submits a job for what is new.  A
GTM-mode node's job takes its watermarks' CSNs from the GTM (`csnd serve
--gtm`); without it, its new tables are named in a warning and left for a
start that has it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Final

import psycopg

from csnd.core.errors import SnapshotError
from csnd.reader.reconnect import one_line
from csnd.snapshot.chunkreader import CONNECT_TIMEOUT_S, table_info
from csnd.snapshot.jobstore import Known, NodeAccess, table_spec

log = logging.getLogger("csnd.snapshot")

# GTM-mode nodes told that their new tables wait for --gtm (once a process).
_told_no_gtm: set[str] = set()

_PUBLISHED_SQL: Final = """
SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = %s
ORDER BY schemaname, tablename
"""


def look_for_new_tables(
    nodes: dict[str, NodeAccess],
    known_tables: Known,
    submit: Callable[[list[str], str], object],
    update: Callable[[Callable[[], None]], None],
) -> None:
    """Snapshot, by a job of their own, the tables new to a when_needed node's publication.

    A node seen the first time takes its publication as it is: its tables
    are the initial snapshot's, or were streamed from a slot that existed
    (when_needed streams those without a snapshot).  A table that cannot be
    snapshotted (no primary key) is logged once and counted as known.
    `update(change)` makes the change to `known_tables` under the jobs' lock and stores them.
    """
    for access in nodes.values():
        if not access.when_needed:
            continue
        try:
            with psycopg.connect(access.conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
                published = [[str(a), str(b)] for a, b in conn.execute(_PUBLISHED_SQL, (access.publication,))]
        except psycopg.Error as e:
            log.warning("node %s: cannot look for new tables to snapshot: %s", access.node, one_line(str(e)))
            continue
        known = known_tables.get(access.node)
        if known is None:
            update(partial(known_tables.__setitem__, access.node, published))
            continue
        new = [t for t in published if t not in known]
        if not new:
            continue
        if access.mode != "single" and not access.gtm:
            # (not counted as known: a start with --gtm takes them; said once a node, not every look)
            if access.node not in _told_no_gtm:
                _told_no_gtm.add(access.node)
                log.warning(
                    "node %s: not snapshotting %s, new in publication %s: a %s-mode node's snapshot needs "
                    "CSNs from the GTM; restart the service with --gtm URL to take them",
                    access.node,
                    ", ".join(".".join(t) for t in new),
                    access.publication,
                    access.mode,
                )
            continue
        specs = []
        try:
            for schema, table in new:
                try:
                    table_info(access, schema, table, must=True)
                    specs.append(table_spec(schema, table))
                except ValueError as e:
                    log.warning(
                        "node %s: not snapshotting %s.%s, new in its publication: %s",
                        access.node,
                        schema,
                        table,
                        e,
                    )
        except SnapshotError as e:  # (the node cannot be read now: looked at again later)
            log.warning("node %s: cannot look for new tables to snapshot: %s", access.node, e)
            continue
        if specs:
            try:
                submit(specs, access.node)
            except SnapshotError as e:  # (the node is away)
                log.warning("node %s: new tables wait for the next look: %s", access.node, e)
                return
            except ValueError as e:  # (one of them went away or changed meanwhile)
                log.warning("node %s: not snapshotting %s: %s", access.node, ", ".join(specs), e)
            else:
                log.info(
                    "node %s: new in publication %s: %s",
                    access.node,
                    access.publication,
                    ", ".join(specs),
                )
        update(partial(known.extend, new))
        if specs:
            return  # (one job a look: other nodes' new tables at the next)
