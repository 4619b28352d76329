"""A recorded stream file as a source (docs/design.md section 2.2)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from csnd.core.errors import StreamFormatError, TimestampError
from csnd.core.ids import PG_TIME_MAX_US, PG_TIME_MIN_US, Lsn
from csnd.reader.events import Event, EventStream, iter_events
from csnd.reader.pgoutput import (
    Begin,
    Commit,
    PgOutputParser,
    StreamCommit,
    TxnRun,
)
from csnd.reader.streamfile import StreamFileReader, StreamHeader


class RecordedSource:
    """Replays a `*.pgstream` file; `name` overrides the header's node name."""

    def __init__(self, path: str, name: str | None = None) -> None:
        self.path = path
        self._file = StreamFileReader(path)
        self.header: StreamHeader = self._file.header
        self.node = name or self.header.node
        self.mode = self.header.mode
        self.binary = self.header.binary

    def enum_types(self) -> list[tuple[int, int]]:
        """The enums `csnd record` found in the source database (binary recordings)."""
        raw = self.header.extra.get("enums", [])
        try:
            return [(int(a), int(b)) for a, b in raw]
        except (TypeError, ValueError):
            raise StreamFormatError(
                'header "enums" must be a list of [type oid, array oid] pairs', path=self.path
            ) from None

    def user_types(self) -> list[tuple[int, str, int, int]]:
        """The user types `csnd record` found in the source database (header `types`; else its `enums`)."""
        raw = self.header.extra.get("types")
        if raw is None:
            return [(oid, "e", array_oid, 0) for oid, array_oid in self.enum_types()]
        try:
            return [(int(o), str(k), int(a), int(b)) for o, k, a, b in raw]
        except (TypeError, ValueError):
            raise StreamFormatError(
                'header "types" must be a list of [type oid, typtype, array oid, other oid] rows',
                path=self.path,
            ) from None

    def events(self, raw_changes: bool = False) -> EventStream:
        """The stream's events; with `raw_changes`, row changes come in `ChangeFrames` runs, unparsed."""
        parser = PgOutputParser()
        frames = self._file.scan(lambda: parser.in_stream) if raw_changes else self._file
        try:
            yield from checked_commit_times(
                iter_events(frames, self.node, self.path, parser), self.node, self.path
            )
        finally:
            self._file.close()

    def read_fraction(self) -> float | None:
        """How much of the file has been read so far, 0.0-1.0 (for progress lines); None for a pipe."""
        size = self._file.size
        return min(1.0, self._file.bytes_read / size) if size else None

    def confirm(self, lsn: Lsn) -> None:
        """A file has no slot: confirming is a no-op."""

    def close(self) -> None:
        self._file.close()


def checked_commit_times(events: Iterable[Event], node: str, path: str | None = None) -> Iterator[Event]:
    """`events`, with every commit timestamp checked to be one the output can write.

    A timestamp past year 9999 (a corrupt or fuzzed stream) would otherwise
    fail only when its line is written, far from where it came in and without
    a name; here the error names the node, file, LSN and xid.  (Once per
    event: three type tests.)
    """
    lo, hi = PG_TIME_MIN_US, PG_TIME_MAX_US
    xid = None
    for ev in events:
        msg = ev[1]
        kind = type(msg)
        if kind is Begin:
            xid = msg.xid  # type: ignore[union-attr]
        elif kind is Commit or kind is StreamCommit:
            t = msg.commit_time  # type: ignore[union-attr]
            if not lo <= t <= hi:
                if kind is StreamCommit:
                    xid = msg.xid  # type: ignore[union-attr]
                raise TimestampError(t, node=node, lsn=msg.commit_lsn, xid=xid, path=path)  # type: ignore[union-attr]
        elif kind is TxnRun:
            for t in msg.txns:  # type: ignore[union-attr]
                if not lo <= t.commit_time <= hi:
                    raise TimestampError(t.commit_time, node=node, lsn=t.commit_lsn, xid=t.xid, path=path)
        yield ev
