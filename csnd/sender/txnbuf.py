"""One transaction's changes between its first change and its release, with a memory bound.

    append(cid, lsn, subxid, body) ─► in memory, in runs of one subxact
                                        │  more than `spill_bytes`?
                                        ▼
                                      temp file of length-prefixed records
    abort_subxact(subxid)           ─► drops that subxact's runs in memory; spilled
                                       records are skipped on read (xids are never
                                       reused, so a set of aborted subxids is exact)
    drain()                         ─► iterator of (cid, lsn, body) in append order;
                                       reads a spilled buffer back lazily

Why runs.  A change is kept as the very `(cid, lsn, body)` tuple the
coordinator receives, so releasing an in-memory transaction allocates nothing
per change.  Consecutive changes of one subtransaction share a run (a list),
so rolling back a subtransaction clears its runs without touching the others.

Why a temp file per transaction, opened unnamed (`tempfile.TemporaryFile`):
a huge transaction must not hold its changes in memory (the seed streams them
to disk like PostgreSQL's reorder buffer), and an unnamed file disappears
with its descriptor, even when the process is killed -- nothing to clean up
after a crash.  Closing the buffer, or exhausting / dropping the iterator of a
released one, frees the disk space.
"""

from __future__ import annotations

import contextlib
import errno
import struct
import tempfile
from collections.abc import Iterable
from itertools import chain, repeat
from typing import IO, Final

from csnd.core.errors import SpillError as SpillError  # (its home is the error tree; re-exported)
from csnd.core.ids import Lsn, lsn_to_str

# Bytes of change bodies (plus per-change overhead) one transaction may hold in
# memory before it spills to disk.  Higher: fewer transactions pay for disk
# I/O (a write and a read of every change); lower: less memory per concurrent
# large transaction -- a node holds up to this much per open transaction, and
# per released transaction until the coordinator has consumed it.  64 MiB
# matches PostgreSQL's default logical_decoding_work_mem (which is per
# walsender, not per transaction) in spirit; override with `spill_bytes`.
SPILL_BYTES: Final = 64 * 1024 * 1024

# Approximate memory of one buffered change besides its body's characters:
# the 3-tuple, two ints, the str header and the list slot.  Only an estimate;
# the bound is about orders of magnitude, not bytes.
CHANGE_OVERHEAD: Final = 120

# Buffer of the spill file, for writes and read-back.  Larger: fewer system
# calls; smaller: less memory per spilled transaction.
SPILL_IO_BYTES: Final = 1024 * 1024

# cid, lsn, subxid (0 when none), body length -- then the body in UTF-8.
_REC: Final = struct.Struct("=IQII")

Change = tuple[int, int, str]
"""(cid, lsn, body), as `FinishedTxn.changes` yields them."""

_NO_RUN: Final = -1  # no xid is negative: forces a new run on the first append


class TxnBuffer:
    """The changes of one transaction, spilled to a temp file beyond `spill_bytes`."""

    __slots__ = (
        "node",
        "xid",
        "spill_bytes",
        "spill_dir",
        "n_changes",
        "mem_bytes",
        "spilled_bytes",
        "_runs",
        "_run",
        "_run_sub",
        "_by_sub",
        "_file",
        "_counts",
        "_aborted",
        "_done",
    )

    def __init__(
        self,
        node: str = "",
        xid: int | None = None,
        spill_bytes: int = SPILL_BYTES,
        spill_dir: str | None = None,
    ) -> None:
        self.node = node
        self.xid = xid
        self.spill_bytes = spill_bytes
        self.spill_dir = spill_dir
        self.n_changes = 0  # changes that will be released (rolled-back ones excluded)
        self.mem_bytes = 0  # estimate of what is held in memory
        self.spilled_bytes = 0  # bytes written to the spill file
        self._runs: list[tuple[int | None, list[Change]]] = []
        self._run: list[Change] = []
        self._run_sub: int | None = _NO_RUN
        self._by_sub: dict[int | None, list[list[Change]]] = {}
        self._file: IO[bytes] | None = None
        self._counts: dict[int, int] = {}  # spilled records per subxid (streamed txns only)
        self._aborted: set[int] = set()
        self._done = False

    @property
    def spilled(self) -> bool:
        return self.spilled_bytes > 0 or self._file is not None

    def append(self, cid: int, lsn: int, subxid: int | None, body: str) -> None:
        """Add one change; `subxid` is the (sub)transaction xid inside a stream, else None."""
        if self._file is None:
            if subxid != self._run_sub:
                self._new_run(subxid)
            self._run.append((cid, lsn, body))
            self.n_changes += 1
            self.mem_bytes += len(body) + CHANGE_OVERHEAD
            if self.mem_bytes > self.spill_bytes:
                self._spill(lsn)
            return
        raw = body.encode("utf-8")
        try:
            self._file.write(_REC.pack(cid, lsn, subxid or 0, len(raw)))
            self._file.write(raw)
        except OSError as e:
            raise self._io_error("write to", e, lsn) from e
        self.spilled_bytes += _REC.size + len(raw)
        self.n_changes += 1
        if subxid is not None:
            self._counts[subxid] = self._counts.get(subxid, 0) + 1

    def extend(self, cid: int, subxid: int | None, lsns: list[Lsn], bodies: list[str]) -> None:
        """Add a run of changes of one cid and (sub)transaction: `append` for each, in C-level passes.

        The spill bound is checked once per run, so memory may pass it by
        one run (a decoder batch at most) before the buffer spills.
        """
        if self._file is not None:
            for lsn, body in zip(lsns, bodies, strict=True):
                self.append(cid, lsn, subxid, body)
            return
        if subxid != self._run_sub:
            self._new_run(subxid)
        self._run.extend(zip(repeat(cid), lsns, bodies, strict=False))
        self.n_changes += len(bodies)
        self.mem_bytes += sum(map(len, bodies)) + CHANGE_OVERHEAD * len(bodies)
        if self.mem_bytes > self.spill_bytes:
            self._spill(lsns[-1] if lsns else None)

    def abort_subxact(self, subxid: int) -> None:
        """Drop the changes of a rolled-back subtransaction (Stream Abort with subxid != xid)."""
        if subxid in self._aborted:
            return
        self._aborted.add(subxid)
        for run in self._by_sub.pop(subxid, ()):
            self.n_changes -= len(run)
            self.mem_bytes -= sum(len(body) for _, _, body in run) + CHANGE_OVERHEAD * len(run)
            run.clear()
        self.n_changes -= self._counts.pop(subxid, 0)
        if self._run_sub == subxid:
            self._run_sub = _NO_RUN

    def drain(self) -> Iterable[Change]:
        """Hand the changes over, in append order; the buffer is empty afterwards.

        A buffer held in one run hands over that run's list itself (the merge
        batch cut takes it whole when it can).  For a spilled buffer the
        iterator owns the file: it reads it back lazily and closes it when
        exhausted, closed or garbage-collected.
        """
        if self._done:
            raise RuntimeError(f"transaction {self.xid}: changes were already released")
        self._done = True
        f = self._file
        if f is None:
            runs = self._runs
            self._reset_memory()
            if len(runs) == 1:
                return runs[0][1]
            return chain.from_iterable(run for _, run in runs)
        self._file = None
        try:
            f.flush()
            f.seek(0)
        except OSError as e:
            with contextlib.suppress(OSError):  # (its close flushes again, and fails the same way)
                f.close()
            raise self._io_error("read back", e) from e
        return _SpillReader(f, frozenset(self._aborted), self)

    def close(self) -> None:
        """Discard the changes (aborted transaction, or shutdown) and free the spill file."""
        self._done = True
        self._reset_memory()
        f = self._file
        self._file = None
        if f is not None:
            # The close flushes the file's buffer, which a full disk refuses; the changes are
            # discarded anyway (and the file closed all the same), so that is no failure.
            with contextlib.suppress(OSError):
                f.close()

    # --- internals ----------------------------------------------------------------

    def _new_run(self, subxid: int | None) -> None:
        run: list[Change] = []
        self._runs.append((subxid, run))
        runs = self._by_sub.get(subxid)
        if runs is None:
            self._by_sub[subxid] = [run]
        else:
            runs.append(run)
        self._run = run
        self._run_sub = subxid

    def _reset_memory(self) -> None:
        self._runs = []
        self._by_sub = {}
        self._run = []
        self._run_sub = _NO_RUN
        self.mem_bytes = 0

    def _spill(self, lsn: int | None) -> None:
        """Move everything in memory to a new temp file; later appends go straight there.

        `lsn`: the change that passed the bound (for an error's position)."""
        try:
            f = tempfile.TemporaryFile(  # noqa: SIM115 - lives until drained or closed
                mode="w+b", buffering=SPILL_IO_BYTES, dir=self.spill_dir, prefix="csnd-spill-"
            )
        except OSError as e:
            raise self._io_error("create", e, lsn) from e
        self._file = f
        counts = self._counts
        pack = _REC.pack
        write = f.write
        written = 0
        try:
            for sub, run in self._runs:
                sub_id = sub or 0
                for cid, lsn, body in run:
                    raw = body.encode("utf-8")
                    write(pack(cid, lsn, sub_id, len(raw)))
                    write(raw)
                    written += _REC.size + len(raw)
                if sub is not None and run:
                    counts[sub] = counts.get(sub, 0) + len(run)
        except OSError as e:
            raise self._io_error("write to", e, lsn) from e
        self.spilled_bytes += written
        self._reset_memory()

    def _io_error(self, what: str, e: OSError, lsn: int | None = None) -> SpillError:
        """The one line of a failed spill: node, transaction, the change's LSN, the directory, what to do.

        Nothing of the transaction was released, so nothing past it is
        confirmed: its source re-sends it once the service runs again.
        """
        where = self.spill_dir or tempfile.gettempdir()
        code = errno.errorcode.get(e.errno or 0)
        reason = f"{e.strerror or e}{f' ({code})' if code else ''}"
        at = f" at {lsn_to_str(lsn)}" if lsn else ""
        return SpillError(
            f"cannot {what} the spill file of transaction {self.xid}{at} in {where}: {reason}; "
            f"free space in {where}, or point [spill] dir elsewhere or raise [spill] bytes "
            "(docs/service.md), and restart: the transaction is re-sent, nothing after it was confirmed",
            node=self.node or None,
            xid=self.xid,
            lsn=lsn or None,
        )


class _SpillReader:
    """Iterator over a spill file's records, skipping rolled-back subtransactions."""

    __slots__ = ("_f", "_buf", "_pos", "_aborted", "_owner")

    def __init__(self, f: IO[bytes], aborted: frozenset[int], owner: TxnBuffer) -> None:
        self._f: IO[bytes] | None = f
        self._buf = b""
        self._pos = 0
        self._aborted = aborted or None
        self._owner = owner  # for error messages only

    def __iter__(self) -> _SpillReader:
        return self

    def __next__(self) -> Change:
        buf, pos = self._buf, self._pos
        size = _REC.size
        aborted = self._aborted
        while True:
            if len(buf) - pos < size:
                buf, pos = self._refill(buf, pos, size), 0
                if not buf:
                    self.close()
                    raise StopIteration
            cid, lsn, sub, n = _REC.unpack_from(buf, pos)
            end = pos + size + n
            if end > len(buf):
                buf, pos = self._refill(buf, pos, size + n), 0
                continue
            start = pos + size
            pos = end
            if aborted is not None and sub in aborted:
                continue
            self._buf, self._pos = buf, pos
            return cid, lsn, buf[start:end].decode("utf-8")

    def _refill(self, buf: bytes, pos: int, need: int) -> bytes:
        f = self._f
        rest = buf[pos:]
        if f is None:
            return b""
        try:
            chunk = f.read(max(SPILL_IO_BYTES, need - len(rest)))
        except OSError as e:
            self.close()
            raise self._owner._io_error("read back", e) from e
        out = rest + chunk if rest else chunk
        if len(out) < need and out:
            self.close()
            raise SpillError(
                f"spill file of transaction {self._owner.xid} is truncated ({len(out)} bytes left, "
                f"a record needs {need}); the disk or the file was tampered with",
                node=self._owner.node or None,
                xid=self._owner.xid,
            )
        return out

    def close(self) -> None:
        f = self._f
        self._f = None
        self._buf = b""
        self._pos = 0
        if f is not None:
            f.close()

    def __del__(self) -> None:
        self.close()
