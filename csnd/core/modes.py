"""The two CSN modes of a node (docs/design.md section 2), defined once.

    gtm     a GaussDB-style cluster: commit CSNs come from a global sequencer,
            written into each node's WAL as `csn` markers (`csnd.core.markers`)
    single  a plain PostgreSQL node: its commit LSN is its CSN

The recorded stream header, the node sender and the coordinator's check of
which nodes can be merged all take a mode; they share this one type.
"""

from __future__ import annotations

from typing import Final, Literal, TypeGuard

Mode = Literal["gtm", "single"]
MODES: Final[tuple[Mode, ...]] = ("gtm", "single")


def is_mode(text: object) -> TypeGuard[Mode]:
    return text in MODES
