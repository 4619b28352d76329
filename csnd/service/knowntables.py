"""Which tables a subscriber's `--table` may name: a name the service knows of no table is refused.

A filter with a typo (`public.acount`) would otherwise read nothing, for
ever, and look like a quiet table.  The service knows two sets of tables:

    the changelog's relations (every table a change was ever written for,
    csnd.changelog.RelationStore), and
    the live sources' publications (pg_publication_tables, asked again when
    a name is missing -- a table just added to one -- at most every
    REFRESH_S)

A name in neither is refused; `SCHEMA.*` is refused when no known table is
in SCHEMA.  When the service knows no table at all (an empty changelog fed
by files, or publications it cannot reach just now) it refuses nothing:
it cannot tell a typo from a table still to come.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final

from csnd.core.tablespec import parse_table

if TYPE_CHECKING:
    from csnd.changelog import RelationStore

log = logging.getLogger("csnd.changefeed")

# A missing name asks the publications again at most this often: a table
# just added to a publication is known within this, and a client repeating
# a typo costs the nodes a query at most this often.
REFRESH_S: Final = 5.0
CONNECT_TIMEOUT_S: Final = 5
_PUBLISHED_SQL: Final = (
    "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = %s"
)

Table = tuple[str, str]


class KnownTables:
    """The tables of the changelog's relations and (once `published` is set) of the sources' publications."""

    def __init__(self, relations: RelationStore | None) -> None:
        self.relations = relations
        # The live sources' published tables now; None: cannot tell (serve sets it)
        self.published: Callable[[], frozenset[Table] | None] | None = None
        self._seen = -1
        self._from_relations: frozenset[Table] = frozenset()

    def _relation_tables(self) -> frozenset[Table]:
        store = self.relations
        if store is None:
            return frozenset()
        count = len(store)  # (relation versions are only added: a new count, a new look)
        if count != self._seen:
            self._from_relations = frozenset((e.schema, e.table) for e in store.between(0, 2**64))
            self._seen = count
        return self._from_relations

    def unknown(self, specs: Iterable[str]) -> list[str]:
        """The specs of `specs` that name no known table (as given); [] when none, or when nothing is known."""
        wanted = [(spec, *parse_table(spec)) for spec in specs]
        if not wanted:
            return []
        known = self._relation_tables()
        published = self.published() if self.published is not None else None
        if published is not None:
            known = known | published
        if not known:
            return []
        schemas = {s for s, _ in known}
        return [spec for spec, s, t in wanted if (s not in schemas if t is None else (s, t) not in known)]


class PublishedTables:
    """The tables the live sources' publications hold, asked of the nodes when a name is missing.

    `nodes`: (node name, conninfo, publication) of each live source.
    """

    def __init__(
        self, nodes: Sequence[tuple[str, str, str]], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.nodes = tuple(nodes)
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: frozenset[Table] | None = None
        self._asked = -REFRESH_S

    def __call__(self) -> frozenset[Table] | None:
        with self._lock:
            if self._tables is None or self._clock() - self._asked >= REFRESH_S:
                self._asked = self._clock()
                got = self._ask()
                if got is not None:
                    self._tables = got
            return self._tables

    def _ask(self) -> frozenset[Table] | None:
        import psycopg

        tables: set[Table] = set()
        for node, conninfo, publication in self.nodes:
            try:
                with psycopg.connect(conninfo, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
                    tables.update((str(s), str(t)) for s, t in conn.execute(_PUBLISHED_SQL, (publication,)))
            except psycopg.Error as e:
                log.warning(
                    "node %s: cannot read publication %s to check a table filter (%s); filters are taken "
                    "as given until it answers",
                    node,
                    publication,
                    " ".join(str(e).split()),
                )
                return None
        return frozenset(tables)
