"""reader: the first stage of a node pipeline.

    live PostgreSQL (psycopg, COPY_BOTH) ─┐
                                          ├─► frames ─► pgoutput messages ─► (lsn, message) events
    recorded *.pgstream file ─────────────┘

Only cheap framing work happens here (GaussDB's parallel decoding,
docs/design.md section 1): split the stream into messages and classify them.
Tuple data stays raw for the decoders.

Public API (for the decoders, the runtime, the command line and the
service): the names and modules in `__all__` -- `pgoutput` (the protocol's
messages), `live` (LiveSource, a replication connection), `streamfile` and
`recorded` (recordings), `slots`, `settle`, `reconnect`, `catalog`,
`usertypes` (the source's user-defined types), `sourcecheck` (what a
source must be before it is read), `record_cmd`.  The rest (the copy loop, feedback, the start and resume of a
stream, the scan of whole transactions, ...) is the reader's own.
"""

from csnd.reader.events import Event, iter_events
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import StreamFileReader, StreamHeader, StreamWriter

__all__ = [
    "Event",
    "RecordedSource",
    "StreamFileReader",
    "StreamHeader",
    "StreamWriter",
    "catalog",
    "events",
    "iter_events",
    "live",
    "pgoutput",
    "reconnect",
    "record_cmd",
    "recorded",
    "settle",
    "slots",
    "sourcecheck",
    "streamfile",
    "usertypes",
]
