"""The changelog's bytes, pure: record frames, segment headers, file names, index entries, tail scans.

Nothing here opens a file or reads a clock: every function takes bytes (or a
memoryview) and an offset cursor, so the torn-tail logic is tested over
every cut of a buffer without touching a disk.  `segment.py` does the I/O.

A record (one transaction) is a fixed 28-byte head and the payload:

    offset 0   4s  MARK           b"\\xd3\\x9c\\x1e\\x7a": where a record may start
           4   u32 crc            zlib.crc32 of bytes 8 .. end of payload
           8   u32 length         payload bytes
          12   u64 csn            strictly increasing through the whole log
          20   u64 time_us        the changelog's clock at append (retention by age)
          28   payload            the docs/design.md section 7 JSON line, no newline

All integers big-endian.  The CRC is *not* chained from the previous record
(etcd's WAL chains it): a reader seeks through the sparse index into the
middle of a segment and has no predecessor CRC to start from, so a chained
CRC would force a scan from the segment's start, or the chain values would
have to live in the index, which is only a rebuildable hint.  What chaining
buys etcd -- a record that is intact but out of place is noticed -- comes
here from the CSNs: every record carries its CSN, CSNs strictly increase,
and the segment header names the segment's first CSN and the CSN before it,
so a stale or misplaced record shows as a CSN out of order.  The MARK lets
the scan of a damaged tail look for a later intact record with `bytes.find`
instead of trying every offset; it never appears in valid JSON text
(0x1e is a control character JSON must escape), and a false hit inside a
payload is rejected by the CRC.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from csnd.core.compiled import compiled_module

MARK: Final = b"\xd3\x9c\x1e\x7a"
_FRAME: Final = struct.Struct(">4sIIQQ")
_FRAME_TAIL: Final = struct.Struct(">IQQ")  # the CRC-covered part of the head
FRAME_HEAD: Final = _FRAME.size  # 28
MAX_PAYLOAD: Final = 0xFFFF_FFFF
MAX_U64: Final = 0xFFFF_FFFF_FFFF_FFFF

# Segment header: magic, format version, sequence, first CSN, the CSN of the
# record before this segment's first (0 for the first segment ever: nothing
# before), and a CRC of the 36 bytes before it (40 in all).  `prev_csn` is how a read
# after a CSN older than the oldest retained segment knows whether anything
# in between was dropped (CsnOutOfRange) or never existed.
SEGMENT_MAGIC: Final = b"CSNDCLOG"
SEGMENT_VERSION: Final = 1
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


def encode(csn: int, time_us: int, payload: bytes) -> bytes:
    """One record's bytes."""
    n = len(payload)
    crc = zlib.crc32(payload, zlib.crc32(_FRAME_TAIL.pack(n, csn, time_us)))
    return _FRAME.pack(MARK, crc, n, csn, time_us) + payload


def encode_frames_py(
    csns: Sequence[int], payloads: Sequence[bytes], time_us: int, after_csn: int, max_payload: int
) -> list[bytes]:
    """The records of a run appended at `time_us`, stopping before the first that may not follow.

    A record may follow when its CSN is in 1..2^64-1 and above the one
    before it (`after_csn` for the first) and its payload is at most
    `max_payload` bytes (and `MAX_PAYLOAD`).  The caller appends the records
    it gets and names the one it stopped at.  A CSN that is no int, or a
    payload that is not bytes, is a TypeError.  `encode_frames` is this, in
    C (`_frames.c`) when it was built.
    """
    if len(csns) != len(payloads):
        raise ValueError(f"encode_frames: {len(csns)} csns for {len(payloads)} payloads")
    out: list[bytes] = []
    last = after_csn
    for csn, payload in zip(csns, payloads, strict=True):
        if not isinstance(csn, int):
            raise TypeError(f"a changelog csn must be an int, not {type(csn).__name__}")
        if not isinstance(payload, bytes):
            raise TypeError(f"a changelog payload must be bytes, not {type(payload).__name__}")
        if not 0 < csn <= MAX_U64 or csn <= last or len(payload) > min(max_payload, MAX_PAYLOAD):
            break
        out.append(encode(csn, time_us, payload))
        last = csn
    return out


_compiled = compiled_module("csnd.changelog._frames")
encode_frames: Callable[[Sequence[int], Sequence[bytes], int, int, int], list[bytes]] = (
    encode_frames_py if _compiled is None else _compiled.encode_frames
)
FRAMES_IMPLEMENTATION: Final = "python" if _compiled is None else "c"


def encode_head(csn: int, time_us: int, length: int, payload_crc: int) -> bytes:
    """The head of a record whose payload was written first, in pieces, with `zlib.crc32` = payload_crc.

    A transaction too large to hold whole is appended as it is produced
    (`Changelog.start_record`): its length, and so the CRC of the head
    bytes the record's CRC starts with, is known only at its end.  The
    record's CRC is then combined from the head's and the payload's, as
    zlib's crc32_combine does, and the bytes are those `encode` gives.
    """
    head_crc = zlib.crc32(_FRAME_TAIL.pack(length, csn, time_us))
    return _FRAME.pack(MARK, crc32_combine(head_crc, payload_crc, length), length, csn, time_us)


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


def head_at(buf: bytes | memoryview, off: int) -> tuple[int, int, int, int] | None:
    """(crc, length, csn, time_us) of the record head at `off`, or None if no head starts there.

    For a reader that reads a large record's payload in pieces: the CRC is
    checked afterwards with `crc_matches`.
    """
    if off + FRAME_HEAD > len(buf):
        return None
    mark, crc, length, csn, time_us = _FRAME.unpack_from(buf, off)
    return None if mark != MARK else (crc, length, csn, time_us)


def crc_matches(crc: int, length: int, csn: int, time_us: int, payload_crc: int) -> bool:
    """Whether a record head's `crc` covers its own fields and a payload of `zlib.crc32` payload_crc."""
    head_crc = zlib.crc32(_FRAME_TAIL.pack(length, csn, time_us))
    return crc32_combine(head_crc, payload_crc, length) == crc


def frame_at(buf: bytes | memoryview, off: int) -> tuple[int, int, int, int]:
    """(status, csn, time_us, end) of the record at `off`; its payload is buf[off + FRAME_HEAD:end].

    SHORT: the buffer ends before the record does (`end` is where it would end,
    or off + FRAME_HEAD when even the head is cut).  BAD: no valid record here.
    """
    size = len(buf)
    if off + FRAME_HEAD > size:
        return SHORT, 0, 0, off + FRAME_HEAD
    mark, crc, length, csn, time_us = _FRAME.unpack_from(buf, off)
    if mark != MARK:
        return BAD, 0, 0, off
    end = off + FRAME_HEAD + length
    if end > size:
        return SHORT, csn, time_us, end
    if zlib.crc32(buf[off + 8 : end]) != crc:
        return BAD, csn, time_us, end
    return OK, csn, time_us, end


class Scan(NamedTuple):
    """What a scan of a segment's records found."""

    end: int  # offset after the last whole, in-order record
    csns: list[int]  # every whole record, in order
    offsets: list[int]
    times: list[int]
    damage: str | None  # why the bytes at `end` are not a record (None: they end the buffer)
    later: int | None  # offset of an intact, in-order record after the damage, if any
    misplaced: bool = False  # the damage is an intact record out of CSN order (never a torn write)


def scan(buf: bytes | memoryview, start: int, prev_csn: int) -> Scan:
    """Walk the records from `start`: every whole one in CSN order, then what stopped the walk.

    The caller decides what the damage means: at the end of the last segment
    with nothing intact after it, a torn write to cut off; anywhere else,
    corruption to report.
    """
    csns: list[int] = []
    offsets: list[int] = []
    times: list[int] = []
    off, size, last = start, len(buf), prev_csn
    damage: str | None = None
    while off < size:
        status, csn, t, end = frame_at(buf, off)
        if status == OK and csn > last:
            csns.append(csn)
            offsets.append(off)
            times.append(t)
            last, off = csn, end
            continue
        if status == SHORT:
            damage = f"record cut short ({size - off} of {end - off} bytes)"
        elif status == BAD:
            damage = "bad record mark" if end == off else "bad record crc"
        else:
            damage = f"record csn {csn} not after csn {last}"
        break
    later = find_record(buf, off + 1, last) if damage is not None else None
    return Scan(off, csns, offsets, times, damage, later, damage is not None and status == OK)


def find_record(buf: bytes | memoryview, start: int, after_csn: int) -> int | None:
    """The offset of the first intact record at or after `start` with csn > after_csn, or None."""
    data = bytes(buf) if isinstance(buf, memoryview) else buf
    pos = data.find(MARK, start)
    while pos >= 0:
        status, csn, _, _ = frame_at(data, pos)
        if status == OK and csn > after_csn:
            return pos
        pos = data.find(MARK, pos + 1)
    return None


class SegmentHeader(NamedTuple):
    seq: int
    first_csn: int
    prev_csn: int


def encode_header(h: SegmentHeader) -> bytes:
    body = _SEG_HEAD.pack(SEGMENT_MAGIC, SEGMENT_VERSION, h.seq, h.first_csn, h.prev_csn, 0)
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
    if version != SEGMENT_VERSION:
        return f"segment format version {version}, this csnd reads version {SEGMENT_VERSION}"
    return SegmentHeader(seq, first, prev)


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
