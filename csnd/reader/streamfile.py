"""Recorded stream files (`*.pgstream`, docs/design.md section 7): the byte layout, written and read here.

A recording is the durable sink of `csnd record` and the input of replays,
tests and benchmarks.  All integers are big-endian.  Format 2, which every
new recording is written in:

    offset 0      8 bytes  b"CSNDSTR2"
           8      uint32   N, the header's length
           12     N bytes  the header: UTF-8 JSON, e.g. {"node": "dn1", "proto_version": 2,
                           "binary": true, "mode": "gtm"} (`mode` gtm or single; `enums`
                           in a binary recording of a database with enum types)
           12+N   uint32   header CRC: CRC-32C of bytes 0 .. 12+N-1 (magic, length, JSON)
           16+N   frames until the end of the file, each
                    uint32  L, the payload's length (1 .. 2^30-1)
                    uint32  the frame's CRC: CRC-32C of the L payload bytes, computed
                            with the previous frame's CRC as the starting value
                            (the first frame: the header CRC)
                    L bytes one CopyData payload exactly as the walsender sent it:
                            XLogData ('w', int64 dataStart, int64 walEnd, int64
                            sendTime, one pgoutput v2 message) or primary keepalive
                            ('k', int64 walEnd, int64 sendTime, byte replyRequested)

CRC-32C is the Castagnoli polynomial as iSCSI, ext4 and etcd use it
(`crc32c.crc32c(data, value)` continues from `value`; CRC-32C of b"123456789"
is 0xE3069283).  Format 1 (b"CSNDSTR1") is the same without the header CRC and
without the frames' CRCs (a frame is `uint32 L | payload`); it is still read,
and a recording continued with `csnd record --append` stays in the format it
was started in.  A new magic rather than a version field in the header: a
reader that knows only format 1 refuses a format-2 file at its first bytes
instead of taking CRCs for lengths.

Why chained.  A CRC of each frame alone catches a damaged frame, but a frame
written twice, two frames swapped or a frame removed are all valid frames,
and a replay would give a wrong transaction with exit 0.  Each CRC starts
from the one before (as etcd's WAL does), so every frame's CRC covers the
whole stream up to it: a repeated, reordered or missing frame fails the CRC
of the first frame after the change.  Only the loss of whole frames at the
very end -- indistinguishable from a recording that stopped there -- passes;
a replay then ends inside a transaction (an error) or after a whole one.  The
price is that a frame can only be checked after all frames before it, which
is how a recording is read anyway (from the start, once).

Reading is strict: a bad magic, an unreadable header, a CRC that does not
match, a truncated frame or a frame that is not XLogData/keepalive is an error
naming the file, the frame's number (from 1, after the header) and byte
offset, and the last LSN seen, because a silently shortened or altered stream
would drop or change transactions.
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

# CRC-32C, in hardware where the CPU has it: the package is the one PyPI
# project that does both the hardware path and a software fallback.
from crc32c import crc32c

from csnd.core.durable import sync_directory
from csnd.core.errors import ConfigError, CsndError, StreamFormatError, TruncatedFrame
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

MAGIC: Final = b"CSNDSTR2"  # what new recordings are written in (format 2)
MAGIC_V1: Final = b"CSNDSTR1"
VERSIONS: Final = {MAGIC_V1: 1, MAGIC: 2}
VERSION: Final = 2
_LEN = struct.Struct("!I")
_HEAD2 = struct.Struct("!II")  # a format-2 frame's length and CRC
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
# A header longer than this is taken as a corrupt length: a real one is a few
# hundred bytes (a few kB with a database's enum types).
MAX_HEADER_BYTES: Final = 1 << 24
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
        except RecursionError:  # (arrays nested thousands deep: the json module recurses)
            raise StreamFormatError(
                "header is JSON nested too deep to be a header", path=path, offset=len(MAGIC)
            ) from None
        if not isinstance(doc, dict):
            raise StreamFormatError("header is not a JSON object", path=path, offset=len(MAGIC))
        node, mode = doc.pop("node", None), doc.pop("mode", "single")
        proto, binary = doc.pop("proto_version", 2), doc.pop("binary", True)
        if not isinstance(node, str) or not node:
            raise StreamFormatError('header has no "node" name', path=path, offset=len(MAGIC))
        if not node.isprintable():  # (a control character, or a lone surrogate UTF-8 cannot write)
            raise StreamFormatError(
                f'header "node" {node[:40]!r} is not printable text', path=path, offset=len(MAGIC)
            )
        if mode not in MODES:
            raise StreamFormatError(f'header "mode" is {mode!r}, expected "gtm" or "single"', path=path)
        if proto != 2:
            raise StreamFormatError(
                f"pgoutput protocol version {proto!r} is not supported (only 2)", path=path
            )
        if not isinstance(binary, bool):
            raise StreamFormatError('header "binary" must be true or false', path=path)
        return cls(node=node, proto_version=proto, binary=binary, mode=mode, extra=doc)


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

    A new file is written in format `version` (2 unless a test asks for 1);
    appending continues the file's own format, so the caller passes the
    version and, for format 2, `crc`: the CRC of the file's last frame
    (`StreamFileReader.crc` after reading it), which the next frame's chains
    from.
    """

    def __init__(
        self,
        path: str,
        header: StreamHeader,
        how: str = "replace",
        append_at: int = 0,
        *,
        version: int = VERSION,
        crc: int = 0,
    ) -> None:
        if version not in (1, 2):
            raise ValueError(version)
        self.path = path
        self.header = header
        self.version = version
        self._crc = crc
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
        head = (MAGIC if version == 2 else MAGIC_V1) + _LEN.pack(len(raw))
        if version == 2:
            self._crc = crc32c(raw, crc32c(head))
            raw += _LEN.pack(self._crc)
        try:
            self._write(head, raw)
        except CsndError:
            with contextlib.suppress(OSError):  # (its buffered bytes cannot go out either)
                self._f.close()
            raise

    def write_frame(self, payload: bytes) -> None:
        if self.version == 2:
            self._crc = crc = crc32c(payload, self._crc)
            self._write(_HEAD2.pack(len(payload), crc), payload)
        else:
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


def _read_header(f: BinaryIO, path: str) -> tuple[StreamHeader, int, int, int]:
    """The header, how many bytes it took (a pipe cannot be asked where it is), the format and its CRC."""
    magic = f.read(len(MAGIC))
    version = VERSIONS.get(magic)
    if version is None:
        raise StreamFormatError(
            f"not a csnd stream file: magic is {magic!r}, expected {MAGIC!r} (or {MAGIC_V1!r})",
            path=path,
            offset=0,
        )
    raw_len = f.read(4)
    if len(raw_len) != 4:
        raise StreamFormatError("file ends inside the header length", path=path, offset=len(MAGIC))
    (n,) = _LEN.unpack(raw_len)
    if n > MAX_HEADER_BYTES:
        raise StreamFormatError(
            f"impossible header length {n} (at most {MAX_HEADER_BYTES}): the file is damaged",
            path=path,
            offset=len(MAGIC),
        )
    raw = f.read(n)
    if len(raw) != n:
        raise StreamFormatError(
            f"file ends inside the header ({len(raw)} of {n} bytes)", path=path, offset=len(MAGIC) + 4
        )
    crc = 0
    if version == 2:
        stored = f.read(4)
        if len(stored) != 4:
            raise StreamFormatError("file ends inside the header's CRC", path=path, offset=len(MAGIC) + 4 + n)
        crc = crc32c(raw, crc32c(magic + raw_len))
        if _LEN.unpack(stored)[0] != crc:
            raise StreamFormatError(
                f"the header fails its CRC (stored 0x{_LEN.unpack(stored)[0]:08x}, computed "
                f"0x{crc:08x}): the file is damaged",
                path=path,
                offset=0,
            )
        n += 4
    return StreamHeader.from_json(raw, path), len(MAGIC) + 4 + n, version, crc


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
            self.header, header_bytes, self.version, self.crc = _read_header(self._f, path)
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
