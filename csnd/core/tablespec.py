"""The `schema.table` syntax of table filters, read one way by the service and every consumer.

A subscriber names its tables as `schema.table` or `schema.*` (every table
of a schema); a part that holds a dot, a quote or a space is written
"double-quoted", with "" for one quote, so any table can be asked for.  The
changefeed applies the filter (`csnd.service.filtering`); the Spark
source checks its `tables` option with it when the query starts, with the
message the service would give.

Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Final

# A filter part: a plain name (no dot, no quote) or a "double-quoted" one in
# which "" stands for one quote -- so a table named `a.b` can be asked for.
_PART: Final = r'(?:[^."\s]+|"(?:[^"]|"")+")'
_FILTER: Final = re.compile(rf"({_PART})\.({_PART})")


def _unquote(part: str) -> str:
    return part[1:-1].replace('""', '"') if part.startswith('"') else part


def parse_table(spec: str) -> tuple[str, str | None]:
    """`schema.table` -> (schema, table), `schema.*` -> (schema, None: every table of it).

    ValueError with a message a person understands.  `"*"` quoted is a table named *.
    """
    m = _FILTER.fullmatch(spec)
    if m is None or m.group(1) == "*":  # (no wildcard schema; a schema named * is written "*")
        raise ValueError(
            f"table filter {spec!r} is not SCHEMA.TABLE (for example public.accounts, or public.* for "
            'every table of a schema; double-quote a name that holds a dot: public."a.b")'
        )
    return _unquote(m.group(1)), None if m.group(2) == "*" else _unquote(m.group(2))
