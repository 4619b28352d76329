"""The two CSN modes of a node (docs/design.md section 2), defined once.

    gtm     a GaussDB-style cluster: commit CSNs come from a global sequencer,
            written into each node's WAL as `csn` markers (`csnd.core.markers`)
    single  a plain PostgreSQL node: its commit LSN is its CSN

The recorded stream header, the node sender and the coordinator take a
mode; they share this one type.

Which sets of nodes have a common commit order at all (`check_modes`).  In
GTM mode every node's commit CSN comes from one global sequencer, so CSNs of
different nodes compare.  In single-node mode the "CSN" is the node's own
commit LSN: it orders that node's transactions and nothing else.  Two plain
PostgreSQL nodes, or a plain node next to a GTM cluster, would be merged in
an order that means nothing -- so such a configuration is refused before
anything starts, instead of producing a plausible-looking but wrong stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal, TypeGuard

from csnd.core.errors import ConfigError

Mode = Literal["gtm", "single"]
MODES: Final[tuple[Mode, ...]] = ("gtm", "single")


def is_mode(text: object) -> TypeGuard[Mode]:
    return text in MODES


def check_modes(modes: Mapping[str, str]) -> Mode:
    """Return the common CSN mode of the nodes; ConfigError if they cannot be merged."""
    if not modes:
        raise ConfigError("no nodes to merge: give at least one source")
    bad = sorted(name for name, mode in modes.items() if mode not in MODES)
    if bad:
        name = bad[0]
        raise ConfigError(
            f"unknown csn mode {modes[name]!r}; use 'gtm' (csn markers from a gtm) or 'single' "
            "(one plain postgresql node)",
            node=name,
        )
    single = [name for name, mode in modes.items() if mode == "single"]
    gtm = [name for name, mode in modes.items() if mode == "gtm"]
    if single and gtm:
        raise ConfigError(
            f"nodes {', '.join(single)} are in single-node mode but nodes {', '.join(gtm)} in gtm mode: "
            "a plain postgresql node's commit lsns share no order with gtm csns; "
            "merge only gtm-mode nodes, or replay the plain node on its own"
        )
    if len(single) > 1:
        raise ConfigError(
            f"nodes {', '.join(single)} are all in single-node mode: several plain postgresql nodes "
            "have no common order; replay each on its own, or give them csn markers from a gtm (gtm mode)"
        )
    return "single" if single else "gtm"
