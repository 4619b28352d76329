"""A recorded stream file as a source (DESIGN section 2, source 2)."""

from __future__ import annotations

from collections.abc import Iterator

from csnd.core.errors import StreamFormatError
from csnd.reader.events import Event, iter_events
from csnd.reader.pgoutput import PgOutputParser
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

    def events(self, raw_changes: bool = False) -> Iterator[Event]:
        """The stream's events; with `raw_changes`, row changes come in `ChangeFrames` runs, unparsed."""
        parser = PgOutputParser()
        frames = self._file.scan(lambda: parser.in_stream) if raw_changes else self._file
        try:
            yield from iter_events(frames, self.node, self.path, parser)
        finally:
            self._file.close()

    def read_fraction(self) -> float | None:
        """How much of the file has been read so far, 0.0-1.0 (for progress lines); None for a pipe."""
        size = self._file.size
        return min(1.0, self._file.bytes_read / size) if size else None

    def confirm(self, lsn: int) -> None:
        """A file has no slot: confirming is a no-op."""

    def close(self) -> None:
        self._file.close()
