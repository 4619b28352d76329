"""The changelog's bytes, pure: record frames, segment headers, file names, index entries, tail scans.

Nothing here opens a file or reads a clock: every function takes bytes (or a
memoryview) and an offset cursor, so the torn-tail logic is tested over
every cut of a buffer without touching a disk.  `segment.py` does the I/O.

A record (one transaction) in a segment of format version 2, which every
new segment is written in, is a fixed 32-byte head and the payload:

    offset 0   4s  MARK           b"\\xd3\\x9c\\x1e\\x7a": where a record may start
           4   u32 crc            zlib.crc32 of bytes 8 .. end of payload
           8   u32 prev_crc       the crc of the record before it (0: none before it)
          12   u32 length         payload bytes
          16   u64 csn            strictly increasing through the whole log
          24   u64 time_us        the changelog's clock at append (retention by age)
          32   payload            the docs/design.md section 7 JSON line, no newline

All integers big-endian.  Version 1 (still read, never written) is the same
without `prev_crc`: a 28-byte head, its CRC over length, csn, time and
payload.

Why chained, and why by a field.  A CRC of each record alone catches a
damaged record, but a whole record cut out of a segment leaves CSNs that
still increase and CRCs that still match: a reader would hand out the log
without that transaction, as complete.  So each record names the CRC of the
record before it, and its own CRC covers that name (as etcd's WAL chains
its CRCs, and the recorded stream files do): a record cut out, repeated or
moved breaks the link of the first record after the change.  The link is a
field rather than a CRC *started from* the previous one because a reader
seeks through the sparse index into the middle of a segment, and the scan
of a damaged tail looks for a later intact record: both must check a
record's own CRC without its predecessor.  The link continues across
segments (a segment's first record names the last record of the segment
before it), which open checks when both are there.  Only whole records lost
from the very end of the newest segment pass -- indistinguishable from a
log that stopped there.

CSNs back this up: every record carries its CSN, CSNs strictly increase,
and the segment header names the segment's first CSN and the CSN before it,
so a stale or misplaced record also shows as a CSN out of order.  The MARK
lets the scan of a damaged tail look for a later intact record with
`bytes.find` instead of trying every offset; it never appears in valid JSON
text (0x1e is a control character JSON must escape), and a false hit inside
a payload is rejected by the CRC.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from csnd.changelog.crc import crc32
from csnd.core.compiled import compiled_module

MARK: Final = b"\xd3\x9c\x1e\x7a"
_FRAME: Final = struct.Struct(">4sIIIQQ")  # version 2
_FRAME_TAIL: Final = struct.Struct(">IIQQ")  # the CRC-covered part of the head
FRAME_HEAD: Final = _FRAME.size  # 32
_FRAME_V1: Final = struct.Struct(">4sIIQQ")
_FRAME_TAIL_V1: Final = struct.Struct(">IQQ")
FRAME_HEAD_V1: Final = _FRAME_V1.size  # 28
MAX_PAYLOAD: Final = 0xFFFF_FFFF
MAX_U64: Final = 0xFFFF_FFFF_FFFF_FFFF

# Segment header: magic, format version, sequence, first CSN, the CSN of the
# record before this segment's first (0 for the first segment ever: nothing
# before), and a CRC of the 36 bytes before it (40 in all).  `prev_csn` is how a read
# after a CSN older than the oldest retained segment knows whether anything
# in between was dropped (CsnOutOfRange) or never existed.  The header is
# the same in both versions; the version says how its records are framed.
SEGMENT_MAGIC: Final = b"CSNDCLOG"
SEGMENT_VERSION: Final = 2  # what new segments are written in
SEGMENT_VERSIONS: Final = (1, 2)  # what is read
_SEG_HEAD: Final = struct.Struct(">8sIQQQI")
SEGMENT_HEAD: Final = _SEG_HEAD.size  # 40

# Index file beside each segment: a magic, then (csn, offset) pairs.
INDEX_MAGIC: Final = b"CSNDIDX1"
_INDEX_ENTRY: Final = struct.Struct(">QQ")
INDEX_ENTRY: Final = _INDEX_ENTRY.size

_NAME_RE: Final = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.log$")

# frame_at statuses
OK: Final = 0
SHORT: Final = 1  # the buffer ends inside the record: a cut, or read more
BAD: Final = 2  # not a record here: wrong mark or CRC

# The `prev` of a version-1 record, which names none: it links to anything.
NO_LINK: Final = -1


def encode(csn: int, time_us: int, payload: bytes, prev_crc: int) -> bytes:
    """One record's bytes, after the record whose crc is `prev_crc` (0: none before it)."""
    n = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(_FRAME_TAIL.pack(prev_crc, n, csn, time_us)))
    return _FRAME.pack(MARK, crc, prev_crc, n, csn, time_us) + payload


def encode_v1(csn: int, time_us: int, payload: bytes) -> bytes:
    """One record's bytes in format version 1 (read, never written: for tests of old segments)."""
    n = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(_FRAME_TAIL_V1.pack(n, csn, time_us)))
    return _FRAME_V1.pack(MARK, crc, n, csn, time_us) + payload


_CRC_AT: Final = struct.Struct(">I").unpack_from  # (a record's crc, at offset 4: no slice, no call beyond it)


def frame_crc(frame: bytes) -> int:
    """The crc of an encoded record: what the record after it names."""
    crc: int = _CRC_AT(frame, 4)[0]
    return crc


def encode_frames_py(
    csns: Sequence[int],
    payloads: Sequence[bytes],
    time_us: int,
    after_csn: int,
    max_payload: int,
    prev_crc: int,
) -> list[bytes]:
    """The records of a run appended at `time_us`, stopping before the first that may not follow.

    A record may follow when its CSN is in 1..2^64-1 and above the one
    before it (`after_csn` for the first) and its payload is at most
    `max_payload` bytes (and `MAX_PAYLOAD`).  Each names the crc of the one
    before it (`prev_crc` for the first).  The caller appends the records
    it gets and names the one it stopped at.  A CSN that is no int, or a
    payload that is not bytes, is a TypeError.  `encode_frames` is this, in
    C (`_frames.c`) when it was built.
    """
    if len(csns) != len(payloads):
        raise ValueError(f"encode_frames: {len(csns)} csns for {len(payloads)} payloads")
    out: list[bytes] = []
    last, link = after_csn, prev_crc
    for csn, payload in zip(csns, payloads, strict=True):
        if not isinstance(csn, int):
            raise TypeError(f"a changelog csn must be an int, not {type(csn).__name__}")
        if not isinstance(payload, bytes):
            raise TypeError(f"a changelog payload must be bytes, not {type(payload).__name__}")
        if not 0 < csn <= MAX_U64 or csn <= last or len(payload) > min(max_payload, MAX_PAYLOAD):
            break
        frame = encode(csn, time_us, payload, link)
        out.append(frame)
        last, link = csn, frame_crc(frame)
    return out


_compiled = compiled_module("csnd.changelog._frames")
encode_frames: Callable[[Sequence[int], Sequence[bytes], int, int, int, int], list[bytes]] = (
    encode_frames_py if _compiled is None else _compiled.encode_frames
)
FRAMES_IMPLEMENTATION: Final = "python" if _compiled is None else "c"


def encode_parts_head(csn: int, time_us: int, parts: Sequence[bytes], prev_crc: int) -> tuple[bytes, int]:
    """The head of a record whose payload is `parts` joined, and the payload's length, without joining them.

    `head + b"".join(parts) == encode(csn, time_us, b"".join(parts), prev_crc)`:
    the CRC runs over the parts in turn (`Changelog.append_parts`).
    """
    n = sum(map(len, parts))
    crc = zlib.crc32(_FRAME_TAIL.pack(prev_crc, n, csn, time_us))
    for part in parts:
        crc = crc32(part, crc)  # (ISA-L's when large: a snapshot chunk is megabytes)
    return _FRAME.pack(MARK, crc, prev_crc, n, csn, time_us), n


def encode_head(csn: int, time_us: int, length: int, payload_crc: int, prev_crc: int) -> bytes:
    """The head of a record whose payload was written first, in pieces, with `zlib.crc32` = payload_crc.

    A transaction too large to hold whole is appended as it is produced
    (`Changelog.start_record`): its length, and so the CRC of the head
    bytes the record's CRC starts with, is known only at its end.  The
    record's CRC is then combined from the head's and the payload's, as
    zlib's crc32_combine does, and the bytes are those `encode` gives.
    """
    head_crc = zlib.crc32(_FRAME_TAIL.pack(prev_crc, length, csn, time_us))
    return _FRAME.pack(MARK, crc32_combine(head_crc, payload_crc, length), prev_crc, length, csn, time_us)


# crc32_combine (zlib's, from its crc32.c since 1.2.12): the CRC of A + B from
# crc(A), crc(B) and len(B), in O(log len(B)) steps of polynomial arithmetic
# modulo the CRC-32 polynomial, in reflected bit order.  Python's zlib module
# does not export it.
_POLY: Final = 0xEDB88320


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the polynomial (reflected)."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    p = 1 << 30  # x^1
    table = [p]
    for _ in range(31):
        p = _multmodp(p, p)
        table.append(p)
    return tuple(table)


_X2N: Final = _x2n_table()  # x^(2^n) modulo the polynomial, n = 0..31


def _x2nmodp(n: int, k: int) -> int:
    """x^(n * 2^k) modulo the polynomial."""
    p = 1 << 31  # x^0
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """`zlib.crc32(a + b)` from crc1 = zlib.crc32(a), crc2 = zlib.crc32(b) and len2 = len(b)."""
    return _multmodp(_x2nmodp(len2, 3), crc1) ^ crc2


class RecordHead(NamedTuple):
    """A record's head, for a reader that reads its payload in pieces (the CRC checked afterwards)."""

    crc: int
    prev: int  # the crc it names as the record before it (NO_LINK: version 1)
    length: int
    csn: int
    time_us: int


class Frames:
    """How the records of one segment format version are laid out: their head, parse and CRC check.

    `frame_at` is the hot path of every read and scan: one unpack, one
    `zlib.crc32` over the record, no allocation beyond the result.
    """

    __slots__ = ("chained", "head", "version", "_frame", "_tail")

    def __init__(self, version: int, frame: struct.Struct, tail: struct.Struct) -> None:
        self.version = version
        self.chained = version >= 2
        self.head = frame.size
        self._frame = frame
        self._tail = tail

    def frame_at(self, buf: bytes | memoryview, off: int) -> tuple[int, int, int, int, int, int]:
        """(status, csn, time_us, end, crc, prev) of the record at `off`; its payload is buf[off + head:end].

        SHORT: the buffer ends before the record does (`end` is where it would
        end, or off + head when even the head is cut).  BAD: no valid record
        here.  `prev` is the crc the record names as the one before it
        (NO_LINK in version 1, whose records name none).
        """
        size, head = len(buf), self.head
        if off + head > size:
            return SHORT, 0, 0, off + head, 0, NO_LINK
        if self.chained:
            mark, crc, prev, length, csn, time_us = self._frame.unpack_from(buf, off)
        else:
            mark, crc, length, csn, time_us = self._frame.unpack_from(buf, off)
            prev = NO_LINK
        if mark != MARK:
            return BAD, 0, 0, off, 0, NO_LINK
        end = off + head + length
        if end > size:
            return SHORT, csn, time_us, end, crc, prev
        if zlib.crc32(buf[off + 8 : end]) != crc:
            return BAD, csn, time_us, end, crc, prev
        return OK, csn, time_us, end, crc, prev

    def head_at(self, buf: bytes | memoryview, off: int) -> RecordHead | None:
        """The record head at `off`, or None if no head starts there."""
        if off + self.head > len(buf):
            return None
        if self.chained:
            mark, crc, prev, length, csn, time_us = self._frame.unpack_from(buf, off)
        else:
            mark, crc, length, csn, time_us = self._frame.unpack_from(buf, off)
            prev = NO_LINK
        return None if mark != MARK else RecordHead(crc, prev, length, csn, time_us)

    def crc_matches(self, h: RecordHead, payload_crc: int) -> bool:
        """Whether a record head's crc covers its own fields and a payload of `zlib.crc32` payload_crc."""
        fields = (h.prev, h.length, h.csn, h.time_us) if self.chained else (h.length, h.csn, h.time_us)
        return crc32_combine(zlib.crc32(self._tail.pack(*fields)), payload_crc, h.length) == h.crc


FRAMES: Final = {1: Frames(1, _FRAME_V1, _FRAME_TAIL_V1), 2: Frames(2, _FRAME, _FRAME_TAIL)}
CURRENT: Final = FRAMES[SEGMENT_VERSION]
frame_at: Final = CURRENT.frame_at  # (the records new segments hold)


class Scan(NamedTuple):
    """What a scan of a segment's records found."""

    end: int  # offset after the last whole, in-order record
    csns: list[int]  # every whole record, in order
    offsets: list[int]
    times: list[int]
    damage: str | None  # why the bytes at `end` are not a record (None: they end the buffer)
    later: int | None  # offset of an intact, in-order record after the damage, if any
    misplaced: bool = False  # the damage is an intact record out of place (never a torn write)
    crc: int = 0  # of the last whole record (the `prev_crc` given when there is none)


def walk_py(
    buf: bytes | memoryview, start: int, last_csn: int, link: int, version: int
) -> tuple[int, list[int], list[int], list[int], int]:
    """(end, csns, offsets, times, last_crc) of the whole records from `start`, up to the first that is not.

    A record is taken when it is whole, its CRC is right, its csn is above
    the one before it (`last_csn` for the first) and, in version 2, it
    names the crc of the one before it (`link` for the first; NO_LINK: the
    first is not checked).  `last_crc` is the crc of the last one taken,
    -1 when none was.  `walk` is this, in C (`_frames.c`) when it was built:
    the loop opening the changelog spends its time in.
    """
    frame_at = FRAMES[version].frame_at
    chained = version >= 2
    if not chained:
        link = NO_LINK  # (version 1 names no record before it)
    csns: list[int] = []
    offsets: list[int] = []
    times: list[int] = []
    off, size, last, last_crc = start, len(buf), last_csn, -1
    while off < size:
        status, csn, t, end, crc, prev = frame_at(buf, off)
        if status != OK or csn <= last or (link != NO_LINK and prev != link):
            break
        csns.append(csn)
        offsets.append(off)
        times.append(t)
        last, off, last_crc = csn, end, crc
        if chained:
            link = crc
    return off, csns, offsets, times, last_crc


walk: Callable[[bytes | memoryview, int, int, int, int], tuple[int, list[int], list[int], list[int], int]] = (
    walk_py if _compiled is None else _compiled.walk
)


def scan(
    buf: bytes | memoryview,
    start: int,
    prev_csn: int,
    frames: Frames = CURRENT,
    prev_crc: int | None = None,
) -> Scan:
    """Walk the records from `start`: every whole one in CSN order and chain, then what stopped the walk.

    `prev_crc`: the crc of the record before the first, when it is known
    (the last of the segment before); None checks the chain from the second
    record on.  The caller decides what the damage means: at the end of the
    last segment with nothing intact after it, a torn write to cut off;
    anywhere else, corruption to report.
    """
    link = NO_LINK if prev_crc is None or not frames.chained else prev_crc
    off, csns, offsets, times, crc = walk(buf, start, prev_csn, link, frames.version)
    last = csns[-1] if csns else prev_csn
    last_crc = crc if crc >= 0 else (prev_crc or 0)
    if off >= len(buf):
        return Scan(off, csns, offsets, times, None, None, False, last_crc)
    status, csn, _, end, _, _ = frames.frame_at(buf, off)
    if status == SHORT:
        damage = f"record cut short ({len(buf) - off} of {end - off} bytes)"
    elif status == BAD:
        damage = "bad record mark" if end == off else "bad record crc"
    elif csn <= last:
        damage = f"record csn {csn} not after csn {last}"
    else:
        damage = (
            f"record of csn {csn} does not follow the record before it (its chained crc names "
            "another): a record before it is missing, repeated or moved"
        )
    later = find_record(buf, off + 1, last, frames)
    return Scan(off, csns, offsets, times, damage, later, status == OK, last_crc)


def find_record(buf: bytes | memoryview, start: int, after_csn: int, frames: Frames = CURRENT) -> int | None:
    """The offset of the first intact record at or after `start` with csn > after_csn, or None."""
    data = bytes(buf) if isinstance(buf, memoryview) else buf
    frame_at = frames.frame_at
    pos = data.find(MARK, start)
    while pos >= 0:
        status, csn, *_ = frame_at(data, pos)
        if status == OK and csn > after_csn:
            return pos
        pos = data.find(MARK, pos + 1)
    return None


class SegmentHeader(NamedTuple):
    seq: int
    first_csn: int
    prev_csn: int
    version: int = SEGMENT_VERSION


def encode_header(h: SegmentHeader) -> bytes:
    body = _SEG_HEAD.pack(SEGMENT_MAGIC, h.version, h.seq, h.first_csn, h.prev_csn, 0)
    return body[:-4] + struct.pack(">I", zlib.crc32(body[:-4]))


def decode_header(buf: bytes | memoryview) -> SegmentHeader | str:
    """The header at the start of `buf`, or why it is not one."""
    if len(buf) < SEGMENT_HEAD:
        return f"segment header cut short ({len(buf)} of {SEGMENT_HEAD} bytes)"
    magic, version, seq, first, prev, crc = _SEG_HEAD.unpack_from(buf, 0)
    if magic != SEGMENT_MAGIC:
        return "not a changelog segment (bad magic)"
    if zlib.crc32(buf[: SEGMENT_HEAD - 4]) != crc:
        return "bad segment header crc"
    if version not in SEGMENT_VERSIONS:
        return f"segment format version {version}, this csnd reads versions 1 and {SEGMENT_VERSION}"
    return SegmentHeader(seq, first, prev, version)


def segment_name(seq: int, first_csn: int) -> str:
    """`0000000000000001-00000000000003e8.log`: sequence, then first CSN, in hex; sorts by both."""
    return f"{seq:016x}-{first_csn:016x}.log"


def parse_segment_name(name: str) -> tuple[int, int] | None:
    m = _NAME_RE.match(name)
    return None if m is None else (int(m.group(1), 16), int(m.group(2), 16))


def index_name(segment: str) -> str:
    return segment[: -len(".log")] + ".idx"


def encode_index(csns: list[int], offsets: list[int]) -> bytes:
    return INDEX_MAGIC + encode_index_entries(csns, offsets)


def encode_index_entries(csns: list[int], offsets: list[int]) -> bytes:
    return b"".join(_INDEX_ENTRY.pack(c, o) for c, o in zip(csns, offsets, strict=True))


def decode_index(buf: bytes, first_csn: int, size: int) -> tuple[list[int], list[int]] | None:
    """The (csns, offsets) of an index file, or None when it cannot be right for its segment.

    Right means: magic, whole entries, the first entry is the segment's first
    record, CSNs and offsets strictly increase, every offset inside the
    segment's `size` bytes.  An entry that passes and still points at the
    wrong bytes is caught when a reader lands there (the record's CSN must
    be the entry's), and the index is rebuilt then.
    """
    if not buf.startswith(INDEX_MAGIC) or (len(buf) - len(INDEX_MAGIC)) % INDEX_ENTRY:
        return None
    csns: list[int] = []
    offsets: list[int] = []
    for csn, off in _INDEX_ENTRY.iter_unpack(memoryview(buf)[len(INDEX_MAGIC) :]):
        if csns and (csn <= csns[-1] or off <= offsets[-1]):
            return None
        csns.append(csn)
        offsets.append(off)
    if not csns or csns[0] != first_csn or offsets[0] != SEGMENT_HEAD or offsets[-1] >= size:
        return None
    return csns, offsets


def sparse(csns: list[int], offsets: list[int], interval: int) -> tuple[list[int], list[int]]:
    """Every record `interval` bytes or more after the last indexed one, starting with the first."""
    out_c: list[int] = []
    out_o: list[int] = []
    last = -interval
    for c, o in zip(csns, offsets, strict=True):
        if o - last >= interval:
            out_c.append(c)
            out_o.append(o)
            last = o
    return out_c, out_o
