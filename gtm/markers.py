"""The `csn` markers the gtm writer side puts in the WAL (docs/design.md section 2).

The grammar -- formatting and the strict parser alike -- lives in
`csnd.core.markers`, shared with the node sender that reads the markers, so
writer and reader cannot disagree about what a marker is.  This module keeps
the writer side's import path.
"""

from csnd.core.markers import (
    KINDS,
    PREFIX,
    TRANSACTIONAL,
    Marker,
    abort,
    cid,
    commit,
    committing,
    format_marker,
    parse_marker,
    tick,
)

__all__ = [
    "KINDS",
    "PREFIX",
    "TRANSACTIONAL",
    "Marker",
    "abort",
    "cid",
    "commit",
    "committing",
    "format_marker",
    "parse_marker",
    "tick",
]
