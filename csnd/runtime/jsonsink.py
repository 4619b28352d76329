"""The first `Sink`: JSON lines to standard output or to FILE.

A regular FILE (or one that does not exist yet) is written as FILE.partial,
fsynced as it grows and renamed to FILE when complete, so FILE is only ever
a whole output.  Anything else -- /dev/null, a FIFO, a terminal, a socket --
is written where it is: no FILE.partial beside a device, no rename over it
(as root that would replace /dev/null with a regular file for the whole
machine) and no fsync of it.  A reader that goes away (a pipe or FIFO closed:
`csnd replay ... | head -3`) stops the run quietly: `OutputClosed`.

Pieces are encoded as they come and handed to the kernel about every
`OUTPUT_CHUNK_BYTES` in one `os.writev`: one system call (one GIL hand-off
to win back from the reader and pipeline threads) per chunk, and no copy of
the chunk in between -- joining the pieces into one string and encoding that
cost the merger's thread four times what the gathering write does.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Sequence
from typing import Final

from csnd.coordinator import relation_line
from csnd.core.durable import Writeback, sync_directory
from csnd.core.errors import ConfigError, CsndError
from csnd.core.ids import Csn
from csnd.runtime.sinks import GroupCommit, OutputClosed

# Output is handed to the file in chunks of this many bytes: fewer GIL
# round trips for the merger's thread, at most this much held in memory.
OUTPUT_CHUNK_BYTES: Final = 1 << 20
# Pieces per writev() call at most (the system's IOV_MAX; Linux's is 1024).
_IOV_MAX: Final = min(os.sysconf("SC_IOV_MAX"), 1024)
_NEWLINE: Final = b"\n"


def is_written_in_place(path: str) -> bool:
    """Whether `path` exists and is no regular file (a device, a FIFO...): written directly, not via FILE.partial."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


class JsonLinesSink:
    """Transaction lines (docs/design.md section 7), one a transaction, to `path`.

    A `path` of None writes to standard output, or to the descriptor `fd`.
    With `schemas`, a relation line goes before the first transaction that
    uses each version of a table.
    """

    group_commit: GroupCommit | None = None  # (durable when `make_durable` returns: fsynced there)

    def __init__(self, path: str | None, fd: int | None = None, *, schemas: bool = False) -> None:
        self.path = path
        self.schemas = schemas
        self.partial: str | None = None  # set when written as FILE.partial, renamed at the end
        self._writeback: Writeback | None = None
        self._close = False
        if path is None:
            if fd is None:
                sys.stdout.flush()  # anything printed before goes first
                fd = sys.stdout.fileno()
            self.fd = fd
            self.name = "standard output"
        elif path.endswith(os.sep) or os.path.isdir(path):
            raise ConfigError(f"--output {path} is a directory; name the file to write")
        elif is_written_in_place(path):
            try:
                self.fd = os.open(path, os.O_WRONLY)  # (a FIFO: waits for its reader)
            except OSError as e:
                raise CsndError(f"cannot open the output {path}: {e.strerror or e}") from None
            self.name = path
            self._close = True
        else:
            self.partial = f"{path}.partial"
            try:
                self.fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as e:
                raise CsndError(f"cannot create the output {self.partial}: {e.strerror or e}") from None
            self._writeback = Writeback(self.fd)
            self.name = self.partial
            self._close = True
        self.transactions = 0
        self.bytes_out = 0
        self._synced_bytes = -1  # (an empty output is synced once too: its file must exist)
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def write(self, text: str, end: bytes = b"") -> None:
        """Write `text`, then `end` as its own piece (a line's newline: no copy of `text` to add it)."""
        piece = text.encode("utf-8")
        self._pending += (piece, end) if end else (piece,)
        self._pending_bytes += len(piece) + len(end)
        if self._pending_bytes >= OUTPUT_CHUNK_BYTES:
            self._drain()

    def start_transaction(self, csn: Csn) -> None:
        pass  # (every part is written through as it comes)

    def end_transaction(self, csn: Csn, tail: str) -> None:
        self.write(tail, _NEWLINE)
        self.transactions += 1

    def append_lines(self, csns: Sequence[Csn], lines: Sequence[str]) -> None:
        """Whole lines of consecutive transactions: each written as it would be ended alone."""
        for line in lines:
            self.write(line, _NEWLINE)
            self.transactions += 1

    def relations(self, csn: Csn, entries: Sequence[tuple[str, str]]) -> None:
        """The relation versions first in force with the transaction at `csn`, before its line."""
        if self.schemas:
            for node, body in entries:
                self.write(relation_line(csn, node, body), _NEWLINE)

    def _drain(self) -> None:
        pending = self._pending
        while pending:
            batch = pending[:_IOV_MAX]
            try:
                written = os.writev(self.fd, batch)
            except BrokenPipeError:  # the reader's choice, not a failure
                self._pending.clear()
                raise OutputClosed from None
            except OSError as e:
                raise self._failed(e.strerror or str(e)) from None
            if not written and any(batch):
                raise self._failed("it takes no bytes")
            self.bytes_out += written
            if self._writeback:
                self._writeback.wrote(written)
            # A short write (a pipe, a signal): drop what went out, keep the rest of a piece.
            done = 0
            while done < len(batch) and written >= len(batch[done]):
                written -= len(batch[done])
                done += 1
            if done < len(batch) and written:
                pending[done] = pending[done][written:]
            del pending[:done]
        self._pending_bytes = 0

    def _failed(self, reason: str) -> CsndError:
        self._pending.clear()  # nothing more goes out: abandon() must not try again
        return CsndError(f"cannot write the output to {self.name}: {reason}")

    def make_durable(self) -> None:
        self._drain()
        if self.partial and self.bytes_out != self._synced_bytes:  # (nothing new: nothing to wait for)
            try:
                os.fsync(self.fd)
            except OSError as e:
                raise self._failed(f"fsync failed ({e.strerror or e})") from None
            self._synced_bytes = self.bytes_out

    def commit(self) -> None:
        self.make_durable()
        self._close_fd()
        if self.partial and self.path:
            try:
                os.replace(self.partial, self.path)
            except OSError as e:
                raise CsndError(
                    f"cannot rename the complete output {self.partial} to {self.path}: {e.strerror or e}"
                ) from None
            try:
                sync_directory(self.path)  # the rename itself, so a crash cannot leave only the .partial
            except OSError as e:
                raise CsndError(
                    f"the output {self.path} is complete, but syncing its directory failed: {e.strerror or e}"
                ) from None

    def discard(self) -> None:
        self._close_fd()
        if self.partial:
            with contextlib.suppress(OSError):
                os.unlink(self.partial)

    def abandon(self) -> str | None:
        try:
            self._drain()
        except OutputClosed:
            pass  # (nobody reads what is left)
        finally:
            self._close_fd()
        return self.partial

    def _close_fd(self) -> None:
        if self._close:  # (never standard output's)
            self._close = False
            os.close(self.fd)
