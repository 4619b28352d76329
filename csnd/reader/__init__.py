"""reader: the first stage of a node pipeline.

    live PostgreSQL (psycopg, COPY_BOTH) ─┐
                                          ├─► frames ─► pgoutput messages ─► (lsn, message) events
    recorded *.pgstream file ─────────────┘

Only cheap framing work happens here (GaussDB's parallel decoding,
docs/design.md section 1): split the stream into messages and classify them.
Tuple data stays raw for the decoders.
"""

from csnd.reader.events import Event, iter_events
from csnd.reader.recorded import RecordedSource
from csnd.reader.streamfile import StreamFileReader, StreamHeader, StreamWriter

__all__ = ["Event", "RecordedSource", "StreamFileReader", "StreamHeader", "StreamWriter", "iter_events"]
