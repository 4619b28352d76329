"""Snapshot copiers, in processes or in this one: each imports the exported snapshot itself, COPYs chunks and renders them.

    parent (NodeSnapshot)                              copier process (forked from the decoder's fork server)
    open(): CopierProcess.start() x READERS ─ conninfo, snapshot name ─► connect; BEGIN REPEATABLE READ READ ONLY;
                                                                          SET TRANSACTION SNAPSHOT
            ready() ◄─────────────────────────────────── "ready", or the SnapshotError
    copier thread: copy(chunk) ─ Chunk ──────────────────────────────► COPY (binary, read whole: copyread) ─► render
                               ◄─ (change objects' text, rows), or the SnapshotError
    close(): None, then the pipe closed ──────────────────────────────► ends (also on EOF: the parent is gone)

Why processes: where the copy of a chunk holds the GIL (a table whose
values go through Python builders), the service's copier threads and its
changelog writer take turns on one core (docs/performance.md, "The initial
snapshot").  A process per copier reads and renders on any core; the parent
only appends the text it gets.  Since the COPY's read and the rendering
release the GIL, `LocalCopier` (the same copy in the copier thread itself)
is the default: it saves the pipe, the start-up and the receive.

A chunk crosses the pipe as its plan (a few hundred bytes) and comes back as
one string (its rows' change objects: about 150 bytes a narrow row), never
row by row.  A process that dies (killed, out of memory) is an EOF on its
pipe: the snapshot ends with a SnapshotError naming the process's exit code,
never a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import os
import threading
import traceback
from typing import TYPE_CHECKING, Any, Final

from csnd.core.errors import CsndError, SnapshotError

if TYPE_CHECKING:
    import psycopg

    from csnd.decoder.rows import RelationCache
    from csnd.snapshot.plan import Chunk

# How long a copier process may take to start and import the snapshot: a fork and one connection;
# longer means the server does not answer, and the export must not be held open for ever.
READY_TIMEOUT_S: Final = 60.0
# How long closing a copier in this process waits for its cancelled COPY to end.
CLOSE_WAIT_S: Final = 5.0


class CopierProcess:
    """The parent's handle on one copier process (used by one copier thread at a time)."""

    def __init__(self, process: Any, pipe: mpc.Connection, node: str, lsn: int) -> None:
        self._process = process
        self._pipe = pipe
        self.node = node
        self.lsn = lsn

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    @classmethod
    def start(
        cls,
        ctx: Any,
        conninfo: str,
        node: str,
        snapshot_name: str,
        lsn: int,
        binary: bool,
        enums: list[tuple[int, int]],
    ) -> CopierProcess:
        from csnd.core.appname import named_conninfo

        parent, child = ctx.Pipe()
        # (named here: the fork server the copier comes from does not know this process's
        # `csnd COMMAND` name, so the copier would connect as whatever PGAPPNAME it started with)
        named = named_conninfo(conninfo, node)
        p = ctx.Process(
            target=_copier_entry,
            args=(child, named, node, snapshot_name, lsn, binary, enums),
            name=f"csnd-snapshot-copier-{node}",
            daemon=True,
        )
        p.start()
        child.close()
        return cls(p, parent, node, lsn)

    def ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until the process has imported the snapshot; its error, or a timeout, raised here."""
        if not self._pipe.poll(timeout):
            raise SnapshotError(
                f"a snapshot copier process did not import the snapshot within {timeout:.0f} s; "
                "check that the server accepts connections",
                node=self.node,
                lsn=self.lsn,
            )
        self._result()

    def copy(self, chunk: Chunk) -> tuple[bytes, int]:
        """The chunk's change objects' text (UTF-8) and row count, from the process."""
        try:
            self._pipe.send(chunk)
        except (BrokenPipeError, OSError):
            raise self._died() from None
        rows = int(self._result())
        try:
            return self._pipe.recv_bytes(), rows  # (the text unpickled: one copy less of megabytes)
        except (EOFError, OSError):
            raise self._died() from None

    def _result(self) -> Any:
        try:
            reply = self._pipe.recv()
        except (EOFError, OSError):
            raise self._died() from None
        if isinstance(reply, BaseException):
            raise reply
        return reply

    def _died(self) -> SnapshotError:
        self._process.join(timeout=2.0)
        code = self._process.exitcode
        how = "is still running" if code is None else f"exited with code {code}"
        return SnapshotError(
            f"a snapshot copier process (pid {self._process.pid}) {how} before it sent its chunk; "
            "its own log line, if any, says why (a signal or memory); take the snapshot again",
            node=self.node,
            lsn=self.lsn,
        )

    def close(self) -> None:
        """Ask the process to end (it ends at its chunk's end, or at once when idle) and let it go."""
        with contextlib.suppress(Exception):
            self._pipe.send(None)
        with contextlib.suppress(Exception):
            self._pipe.close()
        self._process.join(timeout=2.0)
        if self._process.exitcode is None:
            self._process.kill()  # (blocked in a long COPY: the snapshot is over anyway)
            self._process.join(timeout=2.0)


class LocalCopier:
    """A copier in this process: the copier thread itself imports the snapshot, COPYs and renders.

    The COPY is read (`copyread`) and rendered (`_copysplit.render_rows`) with
    the GIL released, so the threads of one process run in parallel as the
    processes do, with no pipe (the chunk's text is not copied out and back
    in), no process to start and nothing to receive.  The same `copy()` as
    CopierProcess, from the same `_ChunkCopier`.
    """

    def __init__(self, copier: _ChunkCopier) -> None:
        self._copier = copier
        # held while a chunk is copied: the connection is closed only between chunks, never under a
        # COPY that libpq is reading in the copier thread without the GIL
        self._busy = threading.Lock()
        self._closing = False

    @property
    def pid(self) -> int:
        return os.getpid()

    @classmethod
    def start(
        cls,
        conninfo: str,
        node: str,
        snapshot_name: str,
        lsn: int,
        binary: bool,
        enums: list[tuple[int, int]],
    ) -> LocalCopier:
        """Connect and import the snapshot now (its SnapshotError raised here)."""
        return cls(_ChunkCopier(conninfo, node, snapshot_name, lsn, binary, enums))

    def ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Nothing to wait for: `start` imported the snapshot."""

    def copy(self, chunk: Chunk) -> tuple[bytes, int]:
        """The chunk's change objects' text (UTF-8) and row count."""
        with self._busy:
            if self._closing:
                raise SnapshotError(
                    f"the snapshot was stopped before chunk {chunk.index} of {chunk.count}",
                    node=self._copier.node,
                    lsn=self._copier.lsn,
                    table=chunk.table.label,
                )
            try:
                return self._copier.copy(chunk)
            finally:
                if self._closing:  # (closed while it copied: the close left the connection to it)
                    self._copier.close()

    def close(self) -> None:
        """Cancel a COPY under way; the connection is closed here, or by the copy once it has ended."""
        self._closing = True
        if not self._busy.acquire(blocking=False):
            with contextlib.suppress(Exception):
                self._copier.conn.cancel_safe(timeout=2.0)
            if not self._busy.acquire(timeout=CLOSE_WAIT_S):
                return  # (still reading: the cancelled COPY ends it, and the copy closes the connection)
        try:
            self._copier.close()
        finally:
            self._busy.release()


def _copier_entry(
    pipe: mpc.Connection,
    conninfo: str,
    node: str,
    snapshot_name: str,
    lsn: int,
    binary: bool,
    enums: list[tuple[int, int]],
) -> None:
    """The process's target: import the snapshot, then copy the chunks sent until None or EOF."""
    try:
        copier = _ChunkCopier(conninfo, node, snapshot_name, lsn, binary, enums)
    except SnapshotError as e:
        _send(pipe, e)
        return
    _send(pipe, "ready")
    with contextlib.closing(copier):
        while True:
            try:
                chunk = pipe.recv()
            except (EOFError, OSError):
                return
            if chunk is None:
                return
            text = b""
            reply: int | SnapshotError
            try:
                text, reply = copier.copy(chunk)
            except CsndError as e:
                reply = e if isinstance(e, SnapshotError) else SnapshotError(e.message, node=node, lsn=lsn)
            except Exception as e:  # (a defect: its traceback travels with it)
                reply = SnapshotError(
                    f"snapshot copier failed on chunk {chunk.index} of {chunk.count}: {e!r}\n"
                    + "".join(traceback.format_exc()),
                    node=node,
                    lsn=lsn,
                    table=chunk.table.label,
                )
            if not _send(pipe, reply) or (
                not isinstance(reply, BaseException) and not _send(pipe, text, raw=True)
            ):
                return


def _send(pipe: mpc.Connection, obj: Any, *, raw: bool = False) -> bool:
    try:
        if raw:
            pipe.send_bytes(obj)
        else:
            pipe.send(obj)
        return True
    except (BrokenPipeError, OSError):
        return False  # (the parent is gone: nothing to tell)


class _ChunkCopier:
    """In the copier process: one connection inside the exported snapshot, and the tables' renderers."""

    def __init__(
        self,
        conninfo: str,
        node: str,
        snapshot_name: str,
        lsn: int,
        binary: bool,
        enums: list[tuple[int, int]],
    ) -> None:
        import psycopg
        from psycopg import sql

        from csnd.core.appname import named_conninfo
        from csnd.decoder.rows import RelationCache
        from csnd.reader.reconnect import one_line

        self.node, self.lsn, self.binary = node, lsn, binary
        try:
            self.conn: psycopg.Connection[tuple[Any, ...]] = psycopg.connect(
                named_conninfo(conninfo, node), autocommit=False
            )
            self.conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            self.conn.read_only = True
            self.conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        except psycopg.Error as e:
            raise SnapshotError(
                f"cannot import the slot's exported snapshot {snapshot_name} (copier process {os.getpid()}): "
                f"{one_line(str(e))}",
                node=node,
                lsn=lsn,
            ) from None
        self.cache: RelationCache = RelationCache(binary=binary)
        for oid, array in enums:
            self.cache.declare_enum(oid, array)
        self.known: set[int] = set()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()

    def copy(self, chunk: Chunk) -> tuple[bytes, int]:
        import psycopg

        from csnd.reader.reconnect import one_line
        from csnd.snapshot.copyread import read_copy
        from csnd.snapshot.copyrows import CopyFormatError, TextCopyRows
        from csnd.snapshot.plan import chunk_copy_sql
        from csnd.snapshot.render import binary_chunk_text, chunk_changes

        t = chunk.table
        if t.relid not in self.known:
            for msg in t.relation_messages():
                self.cache.apply(msg, self.lsn)
            self.known.add(t.relid)
        try:
            data = read_copy(self.conn, chunk_copy_sql(chunk, self.binary))
        except psycopg.Error as e:
            raise SnapshotError(
                f"cannot read chunk {chunk.index} of {chunk.count}: {one_line(str(e))}",
                node=self.node,
                lsn=self.lsn,
                table=t.label,
            ) from None
        try:
            if self.binary:
                return binary_chunk_text(self.node, self.lsn, t.relid, data, self.cache)
            parser = TextCopyRows()
            tuples = parser.feed(data)
            parser.finish()
            changes = chunk_changes(self.node, self.lsn, t.relid, tuples, self.cache, False)
            return changes.encode("utf-8"), len(tuples)
        except CopyFormatError as e:
            raise SnapshotError(
                f"chunk {chunk.index} of {chunk.count}: {e}", node=self.node, lsn=self.lsn, table=t.label
            ) from None
        except CsndError as e:
            raise SnapshotError(e.message, node=self.node, lsn=self.lsn, table=t.label) from None
