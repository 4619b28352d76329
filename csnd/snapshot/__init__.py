"""The initial snapshot of `csnd serve`: the published tables as of a new slot's consistent point.

    LiveSource.prepare(snapshot="initial") ─► ExportedSnapshot (slot made, snapshot exported)
        └► NodeSnapshot (copier): connections import it ─► plan: tables ─► page- or key-range chunks
              └► COPY each chunk ─► copyrows ─► the decoder's rendering ─► "op": "read" changes
    SnapshotRun: each chunk one changelog record (csn 1, 2, ...), then a completion record,
                 all below the first streamed transaction's CSN; then the stream (docs/design.md section 5)

A consumer reading the changelog from 0 sees every published table as of the
consistent point, then every transaction committed after it: nothing missing,
nothing twice at the boundary.  `lines.snapshot_state` tells, from a
changelog's newest record, whether a snapshot was cut short (the service then
refuses to start: an exported snapshot cannot be imported again).

Public API (for the service): the names in `__all__`, and the modules
`copier` (NodeSnapshot), `run` (SnapshotRun), `incremental` (the incremental
snapshots), `plan`, `privileges` and `watermark`.  The rest (chunk reading,
row rendering, the job store) is the snapshot's own.
"""

from csnd.snapshot.lines import SnapshotState, snapshot_state
from csnd.snapshot.progress import SnapshotProgress, TableProgress

__all__ = [
    "SnapshotProgress",
    "SnapshotState",
    "TableProgress",
    "copier",
    "incremental",
    "plan",
    "privileges",
    "run",
    "snapshot_state",
    "watermark",
]
