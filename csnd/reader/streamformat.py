"""Recorded stream files (`*.pgstream`, docs/design.md section 7): the byte layout and the header.

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

The header is read and written here; frames are written by
`reader.streamwriter` and read by `reader.streamfile`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Final

# CRC-32C, in hardware where the CPU has it: the package is the one PyPI
# project that does both the hardware path and a software fallback.
from crc32c import crc32c

from csnd.core.errors import StreamFormatError
from csnd.core.modes import MODES

MAGIC: Final = b"CSNDSTR2"  # what new recordings are written in (format 2)
MAGIC_V1: Final = b"CSNDSTR1"
VERSIONS: Final = {MAGIC_V1: 1, MAGIC: 2}
VERSION: Final = 2
UINT32: Final = struct.Struct("!I")  # a length, or a CRC
FRAME_HEAD_V2: Final = struct.Struct("!II")  # a format-2 frame's length and CRC
# A header longer than this is taken as a corrupt length: a real one is a few
# hundred bytes (a few kB with a database's enum types).
MAX_HEADER_BYTES: Final = 1 << 24


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


def read_header(f: BinaryIO, path: str) -> StreamHeader:
    return read_header_and_layout(f, path)[0]


def read_header_and_layout(f: BinaryIO, path: str) -> tuple[StreamHeader, int, int, int]:
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
    (n,) = UINT32.unpack(raw_len)
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
        if UINT32.unpack(stored)[0] != crc:
            raise StreamFormatError(
                f"the header fails its CRC (stored 0x{UINT32.unpack(stored)[0]:08x}, computed "
                f"0x{crc:08x}): the file is damaged",
                path=path,
                offset=0,
            )
        n += 4
    return StreamHeader.from_json(raw, path), len(MAGIC) + 4 + n, version, crc
