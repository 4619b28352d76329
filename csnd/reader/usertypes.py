"""The source's user types, which the decoders must be told of: a Type message names, never says.

pgoutput sends a Type message for a column of a user type, carrying only its
namespace and name: an enum, a composite, a range, a multirange, a domain and
an array of any of them look alike.  The decoders need to know which, in both
stream forms (binary values of each have their own send format; an array's
text must become a JSON array either way), so a live source asks its server
once, over an ordinary connection, and a recording keeps the answer in its
header (`types`, docs/design.md section 7).
"""

from __future__ import annotations

from typing import Final

import psycopg

from csnd.core.errors import SourceError
from csnd.reader.reconnect import one_line
from csnd.reader.replconn import connect_error

__all__ = ["USER_TYPES_QUERY", "UserType", "user_types"]

# (oid, typtype, array oid or 0, other oid): typtype `e` enum, `c` composite, `r` range
# and `m` multirange (other: the bounds' type), `d` domain (other: its base type).
UserType = tuple[int, str, int, int]

USER_TYPES_QUERY: Final = """\
SELECT t.oid::int8, t.typtype::text, t.typarray::int8,
       COALESCE(r.rngsubtype, m.rngsubtype, NULLIF(t.typbasetype, 0), 0)::int8
FROM pg_type AS t
LEFT JOIN pg_range AS r ON r.rngtypid = t.oid
LEFT JOIN pg_range AS m ON m.rngmultitypid = t.oid
WHERE t.typtype IN ('e', 'c', 'r', 'm', 'd') AND t.oid >= 16384
ORDER BY t.oid"""


def user_types(node: str, conninfo: str) -> list[UserType]:
    """The rows of `USER_TYPES_QUERY` in the source database; a failure is a `SourceError` naming the node."""
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            rows = conn.execute(USER_TYPES_QUERY).fetchall()
    except psycopg.OperationalError as e:  # (often the run's first connection: a typo's hint, at once)
        raise connect_error(node, e) from None
    except psycopg.Error as e:
        raise SourceError(
            f"cannot list the user types of the source database: {one_line(str(e))}", node=node
        ) from None
    return [(int(o), str(k), int(a), int(b)) for o, k, a, b in rows]
