"""Recorded stream files (`*.pgstream`, DESIGN section 7).

    b"CSNDSTR1" | uint32 N | N bytes of UTF-8 JSON header | frames...
    frame = uint32 length | one CopyData payload exactly as the walsender sent it

A recording is the durable sink of `csnd record` and the input of replays,
tests and benchmarks.  Reading is strict: a bad magic, an unreadable header, a
truncated frame or a frame that is not XLogData/keepalive is an error naming
the file, the frame's byte offset and the last LSN seen, because a silently
shortened stream would drop transactions.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final

from csnd.core.durable import sync_directory
from csnd.core.errors import ConfigError, CsndError, StreamFormatError
from csnd.core.ids import Lsn, lsn_to_str
from csnd.core.modes import MODES
from csnd.reader.pgoutput import (
    CHANGE_FRAME_MIN,
    CHANGE_TAGS,
    CHANGE_XID_OFFSET,
    FRAMED_CHANGE_HEAD,
    XLOGDATA_HEADER_SIZE,
    ChangeFrames,
)

MAGIC: Final = b"CSNDSTR1"
_LEN = struct.Struct("!I")
_LSN = struct.Struct("!Q")

# Frames are read in chunks of this size: big enough that a replay is not
# dominated by read() calls, small enough to keep the reader's memory flat.
READ_CHUNK_BYTES: Final = 1 << 20
# A single CopyData payload larger than this is taken as corruption, not data:
# the walsender builds each message in one StringInfo, which PostgreSQL caps
# at MaxAllocSize (1 GiB - 1), so no real frame is larger.  It bounds what a
# pipe's reader may pull in for one frame; a regular file's frames are held
# to what the file still holds (`StreamFileReader.scan`), checked before
# anything is read, so a corrupt length never makes the reader copy the rest.
MAX_FRAME_BYTES: Final = (1 << 30) - 1
# Row-change frames per `ChangeFrames` run at most: a run is one item of a
# decoder batch, so this keeps a batch near its intended size.
MAX_RUN_FRAMES: Final = 256
# The smallest frame the scan takes for a row change (see `scan`), with its length.
_MIN_FRAMED_CHANGE: Final = 4 + CHANGE_FRAME_MIN + 1


@dataclass
class StreamHeader:
    node: str
    proto_version: int = 2
    binary: bool = True
    mode: str = "single"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        doc = {
            "node": self.node,
            "proto_version": self.proto_version,
            "binary": self.binary,
            "mode": self.mode,
            **self.extra,
        }
        return json.dumps(doc).encode("utf-8")

    @classmethod
    def from_json(cls, raw: bytes, path: str) -> StreamHeader:
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise StreamFormatError(
                f"header is not valid UTF-8 JSON: {e}", path=path, offset=len(MAGIC)
            ) from None
        if not isinstance(doc, dict):
            raise StreamFormatError("header is not a JSON object", path=path, offset=len(MAGIC))
        node, mode = doc.pop("node", None), doc.pop("mode", "single")
        proto, binary = doc.pop("proto_version", 2), doc.pop("binary", True)
        if not isinstance(node, str) or not node:
            raise StreamFormatError('header has no "node" name', path=path, offset=len(MAGIC))
        if mode not in MODES:
            raise StreamFormatError(f'header "mode" is {mode!r}, expected "gtm" or "single"', path=path)
        if proto != 2:
            raise StreamFormatError(
                f"pgoutput protocol version {proto!r} is not supported (only 2)", path=path
            )
        if not isinstance(binary, bool):
            raise StreamFormatError('header "binary" must be true or false', path=path)
        return cls(node=node, proto_version=proto, binary=binary, mode=mode, extra=doc)


class TruncatedFrame(StreamFormatError):
    """The file ends inside a frame (a torn last write), or a frame claims more than the file holds."""


def is_regular(path: str) -> bool:
    """True for a regular file or a name that does not exist yet (written as a new regular file)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return True


def check_new_recording(path: str, how: str) -> None:
    """Refuse to overwrite an existing recording unless `how` says to (`append` or `replace`).

    An existing recording's transactions are already confirmed to its slot:
    the server will not send them again, so truncating it would lose them.
    A device or FIFO is written as it is (`how` does not apply to it).
    """
    if how not in ("create", "append", "replace"):
        raise ValueError(how)
    if not os.path.lexists(path):
        return
    if not is_regular(path):
        if how == "append":
            raise ConfigError(f"--append: {path} is not a regular file; a device or FIFO is written as it is")
        return
    if how == "create":
        raise ConfigError(
            f"{path} exists: pass --append to continue that recording or --replace to overwrite it "
            "(its transactions are already confirmed to the slot: they will not be sent again)"
        )


class StreamWriter:
    """Writes frames to a recorded stream file.

    `sync()` flushes and fsyncs; callers confirm a position to the source only
    after `sync()` has covered it.  A file that cannot be written (no such
    directory, disk full, an I/O error) is a `CsndError` naming the node and
    the file; after one, nothing more is written or synced, so a caller that
    confirms after `sync()` never confirms past what the file holds.

    `how`: `create` a new file (an existing one is refused), `replace` one,
    or `append` to an existing recording from byte `append_at` (its last
    complete frame's end; anything after it is cut, and no header is
    written).  A device or FIFO (`/dev/null`, a pipe to a compressor) is
    written directly: no fsync (a device has nothing to make durable), no
    truncation, no directory sync.
    """

    def __init__(self, path: str, header: StreamHeader, how: str = "replace", append_at: int = 0) -> None:
        self.path = path
        self.header = header
        self._failed = False
        check_new_recording(path, how)
        self.regular = is_regular(path)
        self._base = 0  # where this writer's first byte goes
        try:
            if not self.regular:
                self._f: BinaryIO = open(path, "ab")  # noqa: SIM115 - closed in close()
            elif how == "append" and os.path.exists(path):
                self._f = open(path, "r+b")  # noqa: SIM115
                self._f.truncate(append_at)
                self._f.seek(append_at)
                self._base = append_at
            else:
                self._f = open(path, "xb" if how == "create" else "wb")  # noqa: SIM115
        except OSError as e:
            raise self._error("create", e) from None
        raw = header.to_json()
        self.frames = 0
        self.bytes_written = 0
        self._named_durably = False
        if self._base:
            return
        try:
            self._write(MAGIC + _LEN.pack(len(raw)), raw)
        except CsndError:
            with contextlib.suppress(OSError):  # (its buffered bytes cannot go out either)
                self._f.close()
            raise

    def write_frame(self, payload: bytes) -> None:
        self._write(_LEN.pack(len(payload)), payload)
        self.frames += 1

    def _write(self, head: bytes, body: bytes) -> None:
        if self._failed:
            raise CsndError(
                f"recording {self.path} failed before; nothing more is written", node=self.header.node
            )
        try:
            self._f.write(head)
            self._f.write(body)
        except OSError as e:
            raise self._error("write to", e) from None
        self.bytes_written += len(head) + len(body)

    def sync(self) -> None:
        if self._failed:
            raise CsndError(f"recording {self.path} failed before; it is not synced", node=self.header.node)
        try:
            self._f.flush()
            if not self.regular:
                return  # (a device or FIFO: nothing to cut, nothing to make durable)
            end = self._base + self.bytes_written
            if self._f.tell() != end:
                # A frame cut between its two writes (Ctrl-C, SIGTERM): it
                # must not reach the disk as a torn last frame.
                self._f.truncate(end)
                self._f.seek(end)
            os.fsync(self._f.fileno())
            if not self._named_durably:  # the file's name too, once: a confirmed slot must not outlive it
                sync_directory(self.path)
                self._named_durably = True
        except OSError as e:
            raise self._error("sync", e) from None

    @property
    def failed(self) -> bool:
        return self._failed

    def _error(self, what: str, e: OSError) -> CsndError:
        self._failed = True
        return CsndError(
            f"cannot {what} the recording {self.path}: {e.strerror or e}; "
            "the slot is confirmed only up to what was synced before",
            node=self.header.node,
        )

    def close(self) -> None:
        """Sync and close; after a failure only close (the failure was already raised)."""
        if self._f.closed:
            return
        try:
            if not self._failed:
                self.sync()
        finally:
            with contextlib.suppress(OSError):  # a failed file's buffered bytes cannot go out either
                self._f.close()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_header(f: BinaryIO, path: str) -> StreamHeader:
    return _read_header(f, path)[0]


def _read_header(f: BinaryIO, path: str) -> tuple[StreamHeader, int]:
    """The header and how many bytes it took (a pipe cannot be asked where it is)."""
    magic = f.read(len(MAGIC))
    if magic != MAGIC:
        raise StreamFormatError(
            f"not a csnd stream file: magic is {magic!r}, expected {MAGIC!r}", path=path, offset=0
        )
    raw_len = f.read(4)
    if len(raw_len) != 4:
        raise StreamFormatError("file ends inside the header length", path=path, offset=len(MAGIC))
    (n,) = _LEN.unpack(raw_len)
    raw = f.read(n)
    if len(raw) != n:
        raise StreamFormatError(
            f"file ends inside the header ({len(raw)} of {n} bytes)", path=path, offset=len(MAGIC) + 4
        )
    return StreamHeader.from_json(raw, path), len(MAGIC) + 4 + n


def _change_run(buf: bytes, pos: int, in_stream: bool) -> ChangeFrames:
    """The run of row-change frames of one (sub)transaction starting at `buf[pos]`, whole frames only.

    The frame at `pos` is known to be a whole row change; the run ends at the
    buffer's last whole frame, at a frame that is not a row change (or is
    too short to be one: the caller's checked path reports it), at another
    xid, or after `MAX_RUN_FRAMES`.
    """
    head = FRAMED_CHANGE_HEAD.unpack_from  # length, 'w', dataStart, tag
    xid = _LEN.unpack_from(buf, pos + 4 + CHANGE_XID_OFFSET)[0] if in_stream else None
    start, size = pos, len(buf)
    lsns: list[Lsn] = []
    while pos + _MIN_FRAMED_CHANGE <= size and len(lsns) < MAX_RUN_FRAMES:
        n, w, lsn, tag = head(buf, pos)
        end = pos + 4 + n
        if end > size or n < _MIN_FRAMED_CHANGE - 4 or w != 0x77 or tag not in CHANGE_TAGS:
            break
        if in_stream and _LEN.unpack_from(buf, pos + 4 + CHANGE_XID_OFFSET)[0] != xid:
            break
        lsns.append(lsn)
        pos = end
    return ChangeFrames(buf[start:pos], in_stream, xid, lsns)


class StreamFileReader:
    """Iterates the frames of a recorded stream: `(byte_offset, payload)`.

    Tracks `last_lsn` (the largest XLogData dataStart or keepalive walEnd seen)
    so errors further down the pipeline can name a position.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in close()
        try:
            self.header, header_bytes = _read_header(self._f, path)
        except BaseException:
            self._f.close()
            raise
        self.last_lsn = 0
        # How far the file has been read, for progress (another thread may
        # look: a plain int, updated once per read of up to 1 MiB).
        st = os.fstat(self._f.fileno())
        self._regular = stat.S_ISREG(st.st_mode)
        self.size = st.st_size if self._regular else 0  # (0: unknown, a pipe)
        self.bytes_read = header_bytes  # what this reader has consumed: where the file is, pipes too

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return self.scan()  # type: ignore[return-value]  # no runs without `in_stream`

    def scan(self, in_stream: Callable[[], bool] | None = None) -> Iterator[tuple[int, bytes | ChangeFrames]]:
        """The frames: `(byte_offset, payload)`, or with `in_stream`, row changes in runs.

        With `in_stream` (asked after each frame that is not a row change:
        whether the stream is inside a Stream Start/Stop block, which decides
        the change layout), consecutive row changes of one (sub)transaction
        come as one `(offset of the first, ChangeFrames)`: a slice of the read
        buffer, not a payload object per frame.  Their loop is the one serial
        step of a replay that looks at every frame, so it reads a change's
        length, tag, dataStart and (in a stream) xid in one unpack, and
        leaves anything else -- including a change too short to be one -- to
        the checked path below it.
        """
        f, path = self._f, self.path
        unpack_len = _LEN.unpack_from
        unpack_lsn = _LSN.unpack_from
        stream = in_stream() if in_stream is not None else False
        offset = self.bytes_read  # the file's position: every caller scans once, from the header on
        buf = b""
        pos = 0
        while True:
            if len(buf) - pos < 4:
                more = f.read(READ_CHUNK_BYTES)
                self.bytes_read += len(more)
                buf = buf[pos:] + more
                pos = 0
                if not buf:
                    return
                if len(buf) < 4:
                    raise self._truncated(offset, f"frame length cut off after {len(buf)} bytes")
            (n,) = unpack_len(buf, pos)
            if n == 0:
                raise StreamFormatError(
                    f"corrupt frame length {n}", path=path, offset=offset, lsn=self.last_lsn or None
                )
            end = pos + 4 + n
            if end > len(buf):
                self._check_length(offset, n)  # before reading: a corrupt length must not pull the rest in
                need = end - len(buf)
                more = f.read(max(need, READ_CHUNK_BYTES))
                self.bytes_read += len(more)
                buf = buf[pos:] + more
                end -= pos
                pos = 0
                if end > len(buf):
                    raise self._truncated(offset, f"frame of {n} bytes has only {len(buf) - 4}")
            if (  # an XLogData row change, long enough to be one (checked inline: this runs for every frame)
                in_stream is not None
                and n > CHANGE_FRAME_MIN
                and buf[pos + 4] == 0x77
                and buf[pos + 4 + XLOGDATA_HEADER_SIZE] in CHANGE_TAGS
            ):
                run_at = pos
                run = _change_run(buf, pos, stream)
                pos = run_at + len(run.blob)
                if run.lsns[-1] > self.last_lsn:
                    self.last_lsn = run.lsns[-1]
                yield offset, run
                offset += pos - run_at
                continue
            kind = buf[pos + 4]
            if (kind == 0x77 or kind == 0x6B) and n >= 9:
                # 'w' dataStart (0/0 for Relation frames) or 'k' walEnd: for error messages
                lsn = unpack_lsn(buf, pos + 5)[0]
                if lsn > self.last_lsn:
                    self.last_lsn = lsn
            else:
                raise StreamFormatError(
                    f"unknown frame type {chr(kind)!r} (0x{kind:02x})",
                    path=path,
                    offset=offset,
                    lsn=self.last_lsn or None,
                )
            yield offset, buf[pos + 4 : end]
            if in_stream is not None:
                stream = in_stream()
            offset += 4 + n
            pos = end

    def _check_length(self, offset: int, n: int) -> None:
        """A frame of `n` bytes at `offset` must fit in what the file holds (a pipe: in `MAX_FRAME_BYTES`)."""
        if n > MAX_FRAME_BYTES:
            raise StreamFormatError(
                f"impossible frame length {n}: larger than any PostgreSQL message (1 GiB); "
                "the length prefix is corrupt",
                path=self.path,
                offset=offset,
                lsn=self.last_lsn or None,
            )
        if not self._regular:
            return
        left = os.fstat(self._f.fileno()).st_size - offset - 4  # (asked again: the file may be growing)
        if n > left:
            where = f" after {lsn_to_str(self.last_lsn)}" if self.last_lsn else ""
            raise TruncatedFrame(
                f"impossible frame length {n}: only {max(left, 0)} bytes follow in the file{where}; "
                "the length prefix is corrupt, or this is a truncated last frame and the recording "
                "was cut short",
                path=self.path,
                offset=offset,
                lsn=self.last_lsn or None,
            )

    def _truncated(self, offset: int, what: str) -> StreamFormatError:
        where = f" after {lsn_to_str(self.last_lsn)}" if self.last_lsn else ""
        return TruncatedFrame(
            f"truncated last frame: {what}{where}; the recording was cut short",
            path=self.path,
            offset=offset,
            lsn=self.last_lsn or None,
        )

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> StreamFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
