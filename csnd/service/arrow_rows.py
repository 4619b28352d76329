"""`Fetch` in Arrow: the changelog's rows built once by the service, kept in blocks of CSN ranges.

    Fetch(after, until, format="arrow")
      └─ RowBlocks.messages ── a kept block covers it? ── its IPC messages (cut ones written anew)
                            └─ a gap ── Changelog.read_pieced ─► RowBuilder ─► IPC messages ─► new block (kept, LRU)
      └─ with tables: keep_tables (pyarrow compute; seq renumbered) on each message's rows
      └─ a reader on this host: a kept block's whole messages as FileSpans of its file (written once)

The Spark source's executors used to turn every JSON line into rows
themselves, in Python, several microseconds a row -- on every read of the
range, by every query.  Here the rows of a CSN range are built once, in the source's
documented schema (docs/design.md section 8), and every later read of that
range is a slice of columns already built: the executors open the IPC
bytes and hand the record batches to Spark untouched.

A block holds the rows of the transactions with after < csn <= last, every
transaction of that range (one without changes has no row but is inside
it).  Blocks never overlap; a read walks the blocks that cover its range and
builds the gaps, cut every BLOCK_ROWS rows between transactions.  Only what
readers may see is built (`Changelog.visible_csn`: durable, and not held
back by an initial snapshot), so a block is never missing a transaction that
becomes durable later.  The blocks are kept in memory up to a byte budget,
the least recently read dropped first (they are rebuilt if read again), and
dropped as soon as retention drops their transactions.  Two reads of one gap
at the same moment may both build it: the first to finish keeps its block.

A reader on the service's host (the Spark source's executors in local mode,
or beside the service) can do better than receive the bytes: receiving 25
bytes a row through gRPC and undoing the compression cost an executor about
0.3 CPU s a million rows, a tenth of what Spark spends on them.  For it a
kept block is also written once, uncompressed, to a file of the files
directory, and its whole messages are sent as where they lie in it
(FileSpan); the reader maps the file and hands Spark the batches in place,
as HDFS's short-circuit reads do.  The files are bounded by their own
budget (the least recently read dropped first) and go with their block.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import threading
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Final, NamedTuple, Self

import numpy as np
import pyarrow as pa
from sortedcontainers import SortedDict

from csnd.changelog import Changelog, RecordPieces
from csnd.consumers.spark import columns
from csnd.consumers.spark.columns import RowBuilder, wire_rows
from csnd.service.filtering import TableFilter

# Rows per block (cut between transactions, so a block may be larger by one
# transaction).  Larger: fewer slices per read; smaller: a read of a short
# range builds less that it does not need.
BLOCK_ROWS: Final = 50_000
# Memory the kept blocks may take.  A block larger than this alone is built,
# read and not kept.
BUDGET_BYTES: Final = 256 << 20
# The largest transaction (its line's bytes) sent as Arrow rows: its rows are
# built and held whole, in the service and in the executor that reads them.
RECORD_LIMIT: Final = 64 << 20
# Disk the blocks' files may take (uncompressed: about seven times their
# messages).  A block whose file alone is larger has none.
FILES_BUDGET_BYTES: Final = 1 << 30
# A disk that refuses the files is said once in this many seconds.
WRITE_FAILED_LOG_S: Final = 60
# The files' name: <after>-<last>-<random>.arrows (the random part: a block
# built again gets a new file, so a reader never maps a file being replaced).
FILE_SUFFIX: Final = ".arrows"
# What a kept block costs beyond its messages (so blocks of ranges without
# changes, which hold no rows, still count against the budget).
BLOCK_OVERHEAD: Final = 512

# Messages are compressed with ZSTD (Arrow IPC's own body compression): the
# rows of the bench's transactions take 25 bytes a row instead of 179, and
# bytes through gRPC cost both ends far more CPU than the compression, done
# once when a block is built, and the executor's decompression (0.12 us a row).
_COMPRESSED: Final = pa.ipc.IpcWriteOptions(compression="zstd")

log = logging.getLogger("csnd.changefeed")

Read = Callable[[int, int], Iterator[tuple[int, "bytes | RecordPieces"]]]


class Block(NamedTuple):
    """The rows of the transactions with after < csn <= last, as the IPC messages Fetch sends.

    Kept as the bytes that go on the wire, so an unfiltered read of rows
    already built costs the service no more than sending them; a filtered or
    partial read opens a message without copying (`open_message`).
    """

    after: int
    last: int
    messages: list[bytes]  # IPC streams of consecutive rows, in order
    starts: np.ndarray  # messages[i] holds rows starts[i] .. starts[i + 1] - 1
    csns: np.ndarray  # the csn column, for finding rows by binary search
    nbytes: int

    def row_span(self, after: int, until: int) -> tuple[int, int]:
        """The rows with after < csn <= until: [lo, hi)."""
        lo = int(np.searchsorted(self.csns, after, side="right"))
        hi = int(np.searchsorted(self.csns, until, side="right"))
        return lo, hi


def open_message(message: bytes) -> pa.RecordBatch:
    """The record batch of one IPC message, its buffers in `message` (no copy)."""
    return pa.ipc.open_stream(pa.py_buffer(message)).read_next_batch()


def to_message(batch: pa.RecordBatch) -> bytes:
    rows = wire_rows(batch)  # (without the snapshot column when no row has a marker: see wire_rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema, options=_COMPRESSED) as writer:
        writer.write_batch(rows)
    data: bytes = sink.getvalue().to_pybytes()
    return data


class RecordTooLarge(Exception):
    """A transaction too large for the Arrow path: its line alone passes RECORD_LIMIT bytes."""

    def __init__(self, csn: int, size: int) -> None:
        super().__init__(
            f"transaction csn {csn} is {size:,} bytes, more than the {RECORD_LIMIT:,} bytes a transaction "
            "may have to be sent as Arrow rows (its rows would be held whole); fetch it as lines "
            "(the Spark source's option rowsBuiltBy=executor)"
        )
        self.csn = csn


def build_blocks(
    read: Read, after: int, until: int, message_bytes: int, block_rows: int = BLOCK_ROWS
) -> Iterator[Block]:
    """Blocks covering (after, until] exactly, from the transactions `read` returns for it.

    `read` is `Changelog.read_pieced`'s shape: a record longer than
    RECORD_LIMIT comes unread, and is RecordTooLarge.  A line that is not a
    transaction is a ValueError naming its csn.
    """
    builder = RowBuilder()
    start = after
    last = after
    for csn, line in read(after, until):
        if not isinstance(line, bytes):
            raise RecordTooLarge(csn, line.length)
        builder.add(csn, line)
        last = csn
        if builder.rows >= block_rows:
            yield make_block(start, last, builder.take(), message_bytes)
            start = last
    if start < until or builder.rows:
        yield make_block(start, until, builder.take(), message_bytes)


def make_block(after: int, last: int, batch: pa.RecordBatch, message_bytes: int) -> Block:
    """`batch` cut into IPC messages of about `message_bytes` (at its mean row size), between transactions.

    A message holds whole transactions (one at least), so a reader that
    cannot take a message (an ArrowFile it cannot open) can fetch again from
    the csn before it without having a transaction in part.
    """
    n = batch.num_rows
    csns = batch.column(0).to_numpy(zero_copy_only=False)
    starts = np.zeros(1, dtype=np.int64)
    if n:
        per_message = max(1, int(message_bytes * n / max(1, batch.nbytes)))
        targets = np.arange(per_message, n, per_message, dtype=np.int64)
        # (a cut moves on to the end of the transaction its row before is in)
        cuts = np.unique(np.searchsorted(csns, csns[targets - 1], side="right"))
        starts = np.concatenate(([0], cuts[cuts < n], [n])).astype(np.int64)
    messages = [to_message(batch.slice(lo, hi - lo)) for lo, hi in itertools.pairwise(starts.tolist())]
    return Block(after, last, messages, starts, csns, sum(map(len, messages)) + csns.nbytes + BLOCK_OVERHEAD)


def keep_tables(batch: pa.RecordBatch, filt: TableFilter, carry: tuple[int, int] = (0, -1)) -> pa.RecordBatch:
    """The rows of `filt`'s tables; `seq` renumbered (`columns.keep_tables`, which executors use too)."""
    return columns.keep_tables(batch, filt.schemas, filt.tables, carry) if filt else batch


class FileSpan(NamedTuple):
    """A kept message, uncompressed, at [offset, offset + length) of a file (pb.ArrowFile)."""

    path: str
    offset: int
    length: int
    after_csn: int  # its rows are of transactions after this csn
    rows: int


# What a read yields for a message: its bytes, or where it lies in a file.
Message = bytes | FileSpan
# How a read of files takes a block's whole message i: a FileSpan, or its bytes if it has no file.
WholeMessage = Callable[[Block, int], Message]


def block_messages(
    block: Block,
    after: int,
    until: int,
    filt: TableFilter,
    carry: tuple[int, int],
    whole: WholeMessage | None = None,
) -> Generator[Message, None, tuple[int, int]]:
    """The IPC messages of `block`'s rows with after < csn <= until, of `filt`'s tables.

    A message wholly inside the range goes as it was built, or as `whole`
    gives it (a FileSpan of every table's rows: a reader on this host keeps
    its own); one the range or the filter cuts is opened, cut and written
    anew.  `carry` is (csn, seq) of the last row sent before (see
    keep_tables); returns the new one.
    """
    lo, hi = block.row_span(after, until)
    if lo >= hi:
        return carry
    starts = block.starts.tolist()
    for i in range(bisect_right(starts, lo) - 1, len(block.messages)):
        first, end = starts[i], starts[i + 1]
        if first >= hi:
            break
        if lo <= first and end <= hi:
            message = block.messages[i] if whole is None else whole(block, i)
            if not filt or isinstance(message, FileSpan):
                yield message
                continue
        cut_lo, cut_hi = max(lo, first), min(hi, end)
        batch = open_message(block.messages[i]).slice(cut_lo - first, cut_hi - cut_lo)
        if filt:
            batch = keep_tables(batch, filt, carry)
            if batch.num_rows:
                carry = (batch.column(0)[-1].as_py(), batch.column(3)[-1].as_py())
        if batch.num_rows:
            yield to_message(batch)
    return carry


class BlockFile(NamedTuple):
    """A kept block's messages, uncompressed, one after another in a file."""

    block: Block
    path: str | None  # None: no file (larger than the files' budget, or the disk refused it)
    offsets: list[int]  # message i is at offsets[i] .. offsets[i + 1]

    @property
    def size(self) -> int:
        return self.offsets[-1] if self.path else 0

    @classmethod
    def write(cls, directory: str, block: Block, budget_bytes: int) -> Self:
        """Writes `block`'s file (whole, then renamed into place), or returns one without a path if too large."""
        name = f"{block.after}-{block.last}-{secrets.token_hex(4)}{FILE_SUFFIX}"
        path = os.path.join(directory, name)
        tmp = os.path.join(directory, "." + name + ".tmp")
        offsets = [0]
        # (0600: the rows are the changelog's; a reader that is not this user gets bytes)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with open(fd, "wb") as f:
                for message in block.messages:
                    sink = pa.BufferOutputStream()
                    rows = open_message(message)  # (as wire_rows sent it)
                    with pa.ipc.new_stream(sink, rows.schema) as writer:
                        writer.write_batch(rows)
                    offsets.append(offsets[-1] + f.write(sink.getvalue()))
                    if offsets[-1] > budget_bytes:
                        break
            # (closing flushes: a full disk may show only there)
            if offsets[-1] > budget_bytes:
                os.unlink(tmp)
                return cls(block, None, offsets)
            os.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return cls(block, path, offsets)

    def message(self, i: int) -> Message:
        """Message i as where it lies in the file; its bytes if there is no file."""
        block = self.block
        if self.path is None:
            return block.messages[i]
        first, end = int(block.starts[i]), int(block.starts[i + 1])
        after = int(block.csns[first - 1]) if first else block.after
        return FileSpan(self.path, self.offsets[i], self.offsets[i + 1] - self.offsets[i], after, end - first)


def clear_files(directory: str) -> None:
    """Makes `directory` (the files of a previous run are removed: only ours, by their names)."""
    os.makedirs(directory, exist_ok=True)
    for name in os.listdir(directory):
        if name.endswith(FILE_SUFFIX) or (name.startswith(".") and name.endswith(FILE_SUFFIX + ".tmp")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))


class RowBlocks:
    """The changelog's rows for `Fetch(format="arrow")`, built once per CSN range and kept."""

    def __init__(
        self,
        log: Changelog,
        message_bytes: int,
        *,
        block_rows: int | None = None,
        budget_bytes: int = BUDGET_BYTES,
        files_dir: str | None = None,
        files_budget_bytes: int = FILES_BUDGET_BYTES,
    ) -> None:
        self.log = log
        self.message_bytes = message_bytes
        self.block_rows = block_rows or BLOCK_ROWS
        self.budget_bytes = budget_bytes
        self.files_dir = files_dir
        self.files_budget_bytes = files_budget_bytes
        if files_dir is not None:
            clear_files(files_dir)
        self._lock = threading.Lock()
        self._blocks: SortedDict[int, Block] = SortedDict()  # by `after`
        self._recent: OrderedDict[int, None] = OrderedDict()  # `after`s, least recently read first
        self._files: OrderedDict[int, BlockFile] = OrderedDict()  # by `after`, least recently read first
        self.kept_bytes = 0
        self.files_bytes = 0
        self._write_failed_logged = -float(WRITE_FAILED_LOG_S)  # (monotonic time of the last warning)
        self.built_rows = 0  # rows built since start (a re-read kept block adds none)

    def messages(
        self, after: int, until: int, filt: TableFilter, *, files: bool = False
    ) -> Iterator[Message]:
        """The rows with after < csn <= until of `filt`'s tables, as IPC messages in order.

        `until` is capped at the visible csn.  CsnOutOfRange when retention
        dropped transactions after `after`, as `Changelog.read` says; 0 means
        from the oldest retained.  With `files` (and a files directory), a
        kept block's whole messages come as FileSpans.
        """
        whole = self._from_file if files and self.files_dir is not None else None
        log = self.log
        log.check_retained(after)
        until = min(until, log.visible_csn)
        oldest = log.oldest_csn
        self._drop_before(oldest)
        from_oldest = after == 0
        if from_oldest and oldest:
            after = oldest - 1
        carry = (0, -1)
        pos = after
        while pos < until:
            kept = self._covering(pos)
            blocks: Iterable[Block]
            if kept is not None:
                blocks = (kept,)
            else:
                gap_end = min(until, self._next_after(pos))
                # (from 0 the first gap is read from 0 as well: retention that runs
                # meanwhile moves the start on, it does not make the read out of range)
                start = 0 if from_oldest and pos == after else pos
                blocks = build_blocks(self._read, start, gap_end, self.message_bytes, self.block_rows)
            for block in blocks:
                if block is not kept:
                    self._keep(block)
                carry = yield from block_messages(block, pos, until, filt, carry, whole)
                pos = block.last

    def _from_file(self, block: Block, i: int) -> Message:
        """Message i of `block` as a FileSpan of the block's file (written on first use); its bytes if none."""
        assert self.files_dir is not None
        with self._lock:
            kept = self._files.get(block.after)
            if kept is not None and kept.block is block:
                self._files.move_to_end(block.after)
                return kept.message(i)
            if self._blocks.get(block.after) is not block:  # (not kept: read once, no file)
                return block.messages[i]
        try:
            written = BlockFile.write(self.files_dir, block, self.files_budget_bytes)  # (no lock held)
        except OSError as e:  # (a full or read-only disk: the block's rows go as bytes)
            now = time.monotonic()
            if now - self._write_failed_logged >= WRITE_FAILED_LOG_S:  # (not once a block)
                self._write_failed_logged = now
                log.warning(
                    "changefeed: Arrow rows go as bytes: cannot write their file in %s (csn range (%d, %d]): "
                    "%s; said again at most every %d s",
                    self.files_dir,
                    block.after,
                    block.last,
                    e,
                    WRITE_FAILED_LOG_S,
                )
            written = BlockFile(block, None, [0])
        with self._lock:
            kept = self._files.get(block.after)
            if self._blocks.get(block.after) is not block or (kept is not None and kept.block is block):
                # (forgotten meanwhile, or another read wrote it first: ours goes)
                _unlink(written.path)
                return kept.message(i) if kept is not None and kept.block is block else block.messages[i]
            self._files[block.after] = written
            self.files_bytes += written.size
            if self.files_bytes > self.files_budget_bytes:
                # (the least recently read files go; blocks marked as having none keep
                # their mark, which costs no disk, so their file is not tried again)
                for after in [a for a, f in self._files.items() if f.path is not None]:
                    if self.files_bytes <= self.files_budget_bytes:
                        break
                    self._drop_file(after)
        return written.message(i)

    def _drop_file(self, after: int) -> None:
        dropped = self._files.pop(after, None)
        if dropped is not None:
            self.files_bytes -= dropped.size
            _unlink(dropped.path)

    def _read(self, after: int, until: int) -> Iterator[tuple[int, bytes | RecordPieces]]:
        return self.log.read_pieced(after, until, whole_up_to=RECORD_LIMIT)

    def _covering(self, csn: int) -> Block | None:
        """The block with after <= csn < last (marked as just read), or None."""
        with self._lock:
            i = self._blocks.bisect_right(csn) - 1
            if i < 0:
                return None
            block: Block = self._blocks.peekitem(i)[1]
            if block.last <= csn:
                return None
            self._recent.move_to_end(block.after)
            return block

    def _next_after(self, csn: int) -> int:
        """Where the next kept block after `csn` starts (a gap ends there); a large number if none."""
        with self._lock:
            i = self._blocks.bisect_right(csn)
            return self._blocks.peekitem(i)[0] if i < len(self._blocks) else 1 << 64

    def _keep(self, block: Block) -> None:
        size = block.nbytes
        with self._lock:
            self.built_rows += int(block.starts[-1])
            if size > self.budget_bytes or block.last == block.after:
                return
            blocks = self._blocks
            i = blocks.bisect_right(block.after)
            overlaps = (i > 0 and blocks.peekitem(i - 1)[1].last > block.after) or (
                i < len(blocks) and blocks.peekitem(i)[0] < block.last
            )
            if overlaps:  # (another read built this range meanwhile: its block stays)
                return
            self._blocks[block.after] = block
            self._recent[block.after] = None
            self.kept_bytes += size
            while self.kept_bytes > self.budget_bytes:
                self._forget(next(iter(self._recent)))

    def _drop_before(self, oldest: int) -> None:
        """Forgets the blocks whose transactions retention dropped (all csns < oldest)."""
        with self._lock:
            while self._blocks and self._blocks.peekitem(0)[1].last < oldest:
                self._forget(self._blocks.peekitem(0)[0])

    def _forget(self, after: int) -> None:
        block = self._blocks.pop(after)
        del self._recent[after]
        self.kept_bytes -= block.nbytes
        self._drop_file(after)


def _unlink(path: str | None) -> None:
    """Removes a block's file; a reader that mapped it keeps its pages, one that had not fetches bytes."""
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:  # (someone else's doing; the rows are still served, as bytes or anew)
            log.warning("changefeed: cannot remove the Arrow rows file %s: %s", path, e)
