"""Whether the role may read every table an initial snapshot copies, asked before its slot is made.

A role that may replicate need not read the tables: the stream comes through
the slot, but the snapshot copies each published table with SELECT.  Found
in the copy, the lack cost a slot made for nothing (left behind, holding
WAL) and an error about one table.  So `check_snapshot_privileges` runs
first, one query over the publication's tables, and names them all with
the GRANT to run.

A connection that fails here raises nothing: the slot's own connection
fails the same way a moment later and says why with its hints.
"""

from __future__ import annotations

from typing import Final

import psycopg

from csnd.core.errors import SnapshotError

# Every table of the publication the role cannot read (SELECT on it, USAGE on its
# schema), as SQL names it; the role's name too.  One row, whatever the count.
_QUERY: Final = """
SELECT quote_ident(current_user),
       coalesce(array_agg(quote_ident(schemaname) || '.' || quote_ident(tablename)
                          ORDER BY schemaname, tablename)
                FILTER (WHERE NOT has_table_privilege(
                                  current_user, quote_ident(schemaname) || '.' || quote_ident(tablename), 'SELECT')),
                '{}'),
       coalesce(array_agg(DISTINCT quote_ident(schemaname))
                FILTER (WHERE NOT has_schema_privilege(current_user, schemaname, 'USAGE')),
                '{}'),
       EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = %s)
FROM pg_publication_tables
WHERE pubname = %s
"""


def check_snapshot_privileges(
    node: str, conninfo: str, publication: str, snapshot: str = "initial", slot: str = ""
) -> None:
    """SnapshotError naming the tables of `publication` the role of `conninfo` may not read, and the GRANT.

    `snapshot` as the source's setting: never checks nothing; when_needed
    checks only while `slot` does not exist (an existing one takes no snapshot).
    """
    if snapshot == "never":
        return
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            row = conn.execute(_QUERY, (slot, publication)).fetchone()
    except psycopg.OperationalError:
        return
    assert row is not None
    role, tables, schemas, slot_exists = str(row[0]), list(row[1]), list(row[2]), bool(row[3])
    if (not tables and not schemas) or (snapshot == "when_needed" and slot_exists):
        return
    grants = []
    if schemas:
        grants.append(f"GRANT USAGE ON SCHEMA {', '.join(schemas)} TO {role}")
    if tables:
        grants.append(f"GRANT SELECT ON {', '.join(tables)} TO {role}")
    what = f"{len(tables)} table{'' if len(tables) == 1 else 's'}" if tables else "the tables"
    listed = f": {', '.join(tables)}" if tables else f" of schema {', '.join(schemas)}"
    raise SnapshotError(
        f"role {role} may not read {what} of publication {publication}, which an initial snapshot "
        f"copies{listed}; grant it: {'; '.join(grants)}",
        node=node,
    )
