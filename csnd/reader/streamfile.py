"""Reading a recorded stream file (`*.pgstream`, docs/design.md section 7; the layout: `reader.streamformat`).

Reading is strict: a bad magic, an unreadable header, a CRC that does not
match, a truncated frame or a frame that is not XLogData/keepalive is an error
naming the file, the frame's number (from 1, after the header) and byte
offset, and the last LSN seen, because a silently shortened or altered stream
would drop or change transactions.

The header and the writer live in `reader.streamformat` and
`reader.streamwriter`; their names are importable from here too, where the
project has always imported them.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Callable, Iterator
from typing import BinaryIO, Final

from crc32c import crc32c

from csnd.core.errors import StreamFormatError, TruncatedFrame
from csnd.core.ids import Lsn, lsn_to_str
from csnd.reader.pgoutput import (
    CHANGE_FRAME_MIN,
    CHANGE_TAGS,
    CHANGE_XID_OFFSET,
    FRAMED_CHANGE_HEAD,
    XLOGDATA_HEADER_SIZE,
    ChangeFrames,
)
from csnd.reader.streamformat import (
    MAGIC,
    MAGIC_V1,
    MAX_HEADER_BYTES,
    VERSION,
    VERSIONS,
    StreamHeader,
    read_header,
    read_header_and_layout,
)
from csnd.reader.streamwriter import StreamWriter, check_new_recording, is_regular

__all__ = [
    "MAGIC",
    "MAGIC_V1",
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_RUN_FRAMES",
    "READ_CHUNK_BYTES",
    "VERSION",
    "VERSIONS",
    "StreamFileReader",
    "StreamHeader",
    "StreamWriter",
    "check_new_recording",
    "is_regular",
    "read_header",
]

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
# The smallest frame the scan takes for a row change (see `scan`), without its head.
_MIN_CHANGE: Final = CHANGE_FRAME_MIN + 1
# A format-2 change as the scan checks it: length, CRC, 'w', dataStart, tag.
_FRAMED_CHANGE_HEAD2: Final = struct.Struct("!IIBQ16xB")
assert _FRAMED_CHANGE_HEAD2.size == FRAMED_CHANGE_HEAD.size + 4


# What a tail of zero bytes is (StreamFileReader._zeroes_to_end).
_ZERO_TAIL: Final = "the file ends in zero bytes from here, a write that never reached the disk"


def _change_run(buf: bytes, pos: int, in_stream: bool) -> ChangeFrames:
    """The run of row-change frames of one (sub)transaction starting at `buf[pos]`, whole frames only.

    The frame at `pos` is known to be a whole row change; the run ends at the
    buffer's last whole frame, at a frame that is not a row change (or is
    too short to be one: the caller's checked path reports it), at another
    xid, or after `MAX_RUN_FRAMES`.  Format 1.
    """
    head = FRAMED_CHANGE_HEAD.unpack_from  # length, 'w', dataStart, tag
    xid = _LEN.unpack_from(buf, pos + 4 + CHANGE_XID_OFFSET)[0] if in_stream else None
    start, size = pos, len(buf)
    lsns: list[Lsn] = []
    while pos + 4 + _MIN_CHANGE <= size and len(lsns) < MAX_RUN_FRAMES:
        n, w, lsn, tag = head(buf, pos)
        end = pos + 4 + n
        if end > size or n < _MIN_CHANGE or w != 0x77 or tag not in CHANGE_TAGS:
            break
        if in_stream and _LEN.unpack_from(buf, pos + 4 + CHANGE_XID_OFFSET)[0] != xid:
            break
        lsns.append(lsn)
        pos = end
    return ChangeFrames(buf[start:pos], in_stream, xid, lsns)


def _checked_change_run(
    buf: bytes, view: memoryview, pos: int, in_stream: bool, crc: int
) -> tuple[ChangeFrames, int]:
    """`_change_run` for format 2, each frame's CRC checked: the run and the CRC of its last frame.

    The run also ends before a frame whose CRC does not match (the caller's
    checked path reports it); it is empty if the first one fails.
    """
    head = _FRAMED_CHANGE_HEAD2.unpack_from  # length, crc, 'w', dataStart, tag
    xid = _LEN.unpack_from(buf, pos + 8 + CHANGE_XID_OFFSET)[0] if in_stream else None
    start, size = pos, len(buf)
    lsns: list[Lsn] = []
    while pos + 8 + _MIN_CHANGE <= size and len(lsns) < MAX_RUN_FRAMES:
        n, stored, w, lsn, tag = head(buf, pos)
        end = pos + 8 + n
        if end > size or n < _MIN_CHANGE or w != 0x77 or tag not in CHANGE_TAGS:
            break
        if in_stream and _LEN.unpack_from(buf, pos + 8 + CHANGE_XID_OFFSET)[0] != xid:
            break
        if crc32c(view[pos + 8 : end], crc) != stored:
            break
        crc = stored
        lsns.append(lsn)
        pos = end
    return ChangeFrames(buf[start:pos], in_stream, xid, lsns, 8), crc


class StreamFileReader:
    """Iterates the frames of a recorded stream: `(byte_offset, payload)`.

    Tracks `last_lsn` (the largest XLogData dataStart or keepalive walEnd seen)
    so errors further down the pipeline can name a position, `frames` (how
    many have been read) and, in a format-2 file, `crc`: the last frame's
    CRC, where an appended frame's chain continues.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: BinaryIO = open(path, "rb")  # noqa: SIM115 - closed in close()
        try:
            self.header, header_bytes, self.version, self.crc = read_header_and_layout(self._f, path)
        except BaseException:
            self._f.close()
            raise
        self.frame_head = 8 if self.version == 2 else 4  # the bytes before each payload: length [and CRC]
        self.last_lsn = 0
        self.frames = 0
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
        length, [CRC,] tag, dataStart and (in a stream) xid in one unpack,
        and leaves anything else -- including a change too short to be one,
        or one whose CRC fails -- to the checked path below it.
        """
        f, path = self._f, self.path
        unpack_len = _LEN.unpack_from
        unpack_lsn = _LSN.unpack_from
        stream = in_stream() if in_stream is not None else False
        hs = self.frame_head
        checked = hs == 8
        crc = self.crc
        frames = self.frames
        offset = self.bytes_read  # the file's position: every caller scans once, from the header on
        buf = b""
        view = memoryview(buf)
        pos = 0
        while True:
            if len(buf) - pos < hs:
                more = f.read(READ_CHUNK_BYTES)
                self.bytes_read += len(more)
                buf = buf[pos:] + more
                view = memoryview(buf)
                pos = 0
                if not buf:
                    return
                if len(buf) < hs:
                    raise self._truncated(offset, frames, f"frame head cut off after {len(buf)} bytes")
            (n,) = unpack_len(buf, pos)
            if n == 0:
                if self._zeroes_to_end(offset):
                    raise self._truncated(offset, frames, _ZERO_TAIL)
                raise StreamFormatError(
                    f"frame {frames + 1}: corrupt frame length {n}",
                    path=path,
                    offset=offset,
                    lsn=self.last_lsn or None,
                )
            end = pos + hs + n
            if end > len(buf):
                # (before reading: a corrupt length must not pull the rest in)
                self._check_length(offset, frames, n, hs)
                need = end - len(buf)
                more = f.read(max(need, READ_CHUNK_BYTES))
                self.bytes_read += len(more)
                buf = buf[pos:] + more
                view = memoryview(buf)
                end -= pos
                pos = 0
                if end > len(buf):
                    raise self._truncated(offset, frames, f"frame of {n} bytes has only {len(buf) - hs}")
            if (  # an XLogData row change, long enough to be one (checked inline: this runs for every frame)
                in_stream is not None
                and n > CHANGE_FRAME_MIN
                and buf[pos + hs] == 0x77
                and buf[pos + hs + XLOGDATA_HEADER_SIZE] in CHANGE_TAGS
            ):
                run_at = pos
                if checked:
                    run, crc = _checked_change_run(buf, view, pos, stream, crc)
                else:
                    run = _change_run(buf, pos, stream)
                if run.lsns:  # (empty: the first frame's CRC fails, reported below)
                    pos = run_at + len(run.blob)
                    if run.lsns[-1] > self.last_lsn:
                        self.last_lsn = run.lsns[-1]
                    frames += len(run.lsns)
                    self.frames, self.crc = frames, crc
                    yield offset, run
                    offset += pos - run_at
                    continue
            if checked:
                stored = unpack_len(buf, pos + 4)[0]
                if crc32c(view[pos + 8 : end], crc) != stored:
                    if self._zeroes_to_end(offset + hs):
                        raise self._truncated(offset, frames, _ZERO_TAIL)
                    raise self._damaged(offset, frames, n)
                crc = stored
            kind = buf[pos + hs]
            if (kind == 0x77 or kind == 0x6B) and n >= 9:
                # 'w' dataStart (0/0 for Relation frames) or 'k' walEnd: for error messages
                lsn = unpack_lsn(buf, pos + hs + 1)[0]
                if lsn > self.last_lsn:
                    self.last_lsn = lsn
            else:
                raise StreamFormatError(
                    f"frame {frames + 1}: unknown frame type {chr(kind)!r} (0x{kind:02x})",
                    path=path,
                    offset=offset,
                    lsn=self.last_lsn or None,
                )
            frames += 1
            self.frames, self.crc = frames, crc
            yield offset, buf[pos + hs : end]
            if in_stream is not None:
                stream = in_stream()
            offset += hs + n
            pos = end

    def _damaged(self, offset: int, frames: int, n: int) -> StreamFormatError:
        where = f" after {lsn_to_str(self.last_lsn)}" if self.last_lsn else ""
        return StreamFormatError(
            f"frame {frames + 1} ({n} bytes{where}) fails its CRC: the recording is damaged here, "
            "or frames before it were removed, repeated or reordered; nothing from this frame on "
            "is read: restore the file from a copy or record the stream again",
            path=self.path,
            offset=offset,
            lsn=self.last_lsn or None,
        )

    def _check_length(self, offset: int, frames: int, n: int, hs: int) -> None:
        """Frame `frames + 1`, of `n` bytes at `offset`, must fit in what the file holds (a pipe: in `MAX_FRAME_BYTES`)."""
        if n > MAX_FRAME_BYTES:
            raise StreamFormatError(
                f"frame {frames + 1}: impossible frame length {n}: larger than any PostgreSQL "
                "message (1 GiB); the length prefix is corrupt",
                path=self.path,
                offset=offset,
                lsn=self.last_lsn or None,
            )
        if not self._regular:
            return
        left = os.fstat(self._f.fileno()).st_size - offset - hs  # (asked again: the file may be growing)
        if n > left:
            where = f" after {lsn_to_str(self.last_lsn)}" if self.last_lsn else ""
            raise TruncatedFrame(
                f"frame {frames + 1}: impossible frame length {n}: only {max(left, 0)} bytes follow "
                f"in the file{where}; the length prefix is corrupt, or this is a truncated last "
                "frame and the recording was cut short",
                path=self.path,
                offset=offset,
                lsn=self.last_lsn or None,
            )

    def _zeroes_to_end(self, offset: int) -> bool:
        """Whether the file holds only zero bytes from `offset` on: a tail whose blocks never got their data.

        A power loss after a file grew but before its new blocks were
        written (delayed allocation) leaves its unsynced tail as zeroes, as
        etcd's WAL decoder knows: a torn tail, cut by `csnd record --append`
        like one cut short, not damage that needs the file restored.
        """
        if not self._regular:
            return False
        fd, size = self._f.fileno(), os.fstat(self._f.fileno()).st_size
        while offset < size:
            chunk = os.pread(fd, min(READ_CHUNK_BYTES, size - offset), offset)
            if not chunk or chunk.count(0) != len(chunk):
                return False
            offset += len(chunk)
        return True

    def _truncated(self, offset: int, frames: int, what: str) -> StreamFormatError:
        where = f" after {lsn_to_str(self.last_lsn)}" if self.last_lsn else ""
        return TruncatedFrame(
            f"frame {frames + 1}: truncated last frame: {what}{where}; the recording was cut short",
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
