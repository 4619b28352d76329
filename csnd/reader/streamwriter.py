"""Writing a recorded stream file (`reader.streamformat` has the layout): frames chained by CRC, made durable.

A recording is the durable sink of `csnd record`: a position is confirmed
to the slot only once `StreamWriter.sync()` has covered it, so what the
writer does on a failure matters as much as what it writes -- after one,
nothing more is written or synced.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import BinaryIO

from crc32c import crc32c

from csnd.core.durable import sync_directory
from csnd.core.errors import ConfigError, CsndError
from csnd.reader.streamformat import FRAME_HEAD_V2, MAGIC, MAGIC_V1, UINT32, VERSION, StreamHeader


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
        head = (MAGIC if version == 2 else MAGIC_V1) + UINT32.pack(len(raw))
        if version == 2:
            self._crc = crc32c(raw, crc32c(head))
            raw += UINT32.pack(self._crc)
        try:
            self._write(head, raw)
        except CsndError:
            with contextlib.suppress(OSError):  # (its buffered bytes cannot go out either)
                self._f.close()
            raise

    def write_frame(self, payload: bytes) -> None:
        if self.version == 2:
            self._crc = crc = crc32c(payload, self._crc)
            self._write(FRAME_HEAD_V2.pack(len(payload), crc), payload)
        else:
            self._write(UINT32.pack(len(payload)), payload)
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
