"""`csnd serve --parquet-dir DIR`: the durable changelog as Parquet files of CSN ranges, for Spark's own reader.

    Changelog.read(after) ─► RowBuilder (the Spark source's rows) ─► DIR/.NAME.tmp ─ fsync, rename ─► DIR/NAME
                                                                                      └─► DIR/_csnd_ranges.json

Spark reads Parquet with its own (JVM, columnar) reader far faster than any
Python source can hand it rows, so where the consumers share a filesystem
with the service, the changelog is also written out as Parquet: one file per
run of transactions, named by the CSN range it covers,
`csn-<after>-<last>.parquet` (zero-padded: names sort by CSN) holding every
change of the transactions with after < csn <= last, as rows of the `csnd`
Spark source's schema (docs/design.md section 8).  The ranges are
contiguous from the first file on; a transaction without changes has no row
but is inside a range.  `spark.read.parquet(DIR).where(...)` reads them, and
Spark's file-stream source streams them exactly once: a file appears whole,
by rename, and is never changed (its checkpoint remembers the files it
took).  Names starting with `_` or `.` are hidden from Spark: the ranges
file and the files being written.  The files' modification times increase
with their CSNs, by a millisecond at least: that source takes new files
oldest first, so even a stream that takes a few at a time
(maxFilesPerTrigger) takes them in CSN order.

A file is cut once it holds FILE_ROWS rows, or when transactions have waited
FILE_WAIT_S for more; stopping writes what is pending.  A restart resumes
after the newest file's range (a file half-written by a crash is removed).
Retention follows the changelog's: a file all of whose transactions the
changelog's retention has dropped is removed with them.  What is not
exported yet holds the changelog's retention (up to its hold limits,
`retention_hold_bytes`/`retention_hold_hours`); an export that fell behind
even those logs an error naming where it was and the oldest retained csn,
and the gap shows in the file names.  Only durable
records are written, and none of an initial snapshot before it is complete
(the changelog holds its readers back).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from csnd.core.durable import replace_file, sync_directory
from csnd.core.errors import CsnOutOfRange, OutputError
from csnd.core.exportnames import ParquetFile, file_name, parse_name

if TYPE_CHECKING:
    from csnd.changelog import Changelog
    from csnd.consumers.spark.columns import RowBuilder

log = logging.getLogger("csnd.parquet")

# Rows a file holds at most (Spark's reader likes files of tens of MB).
FILE_ROWS: Final = 200_000
# A file is written once its first transaction has waited this long: how late
# the Parquet copy may run behind the changelog when the load is light.
FILE_WAIT_S: Final = 10.0
RANGES: Final = "_csnd_ranges.json"
_NS_PER_MS: Final = 1_000_000


class ParquetExport:
    """Follows a changelog on a thread of its own and writes it to `directory` as Parquet files."""

    def __init__(
        self,
        changelog: Changelog,
        directory: str,
        *,
        file_rows: int = FILE_ROWS,
        file_wait_s: float = FILE_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        """`on_failure`: called from the export's thread with the error that stopped it."""
        self.log = changelog
        self.on_failure = on_failure
        self.directory = os.path.abspath(directory)
        self.file_rows = file_rows
        self.file_wait_s = file_wait_s
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: OutputError | None = None
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if name.startswith(".") and name.endswith(".tmp"):  # (cut short by a crash: never shown)
                os.unlink(os.path.join(self.directory, name))
        self.files = sorted(f for n in os.listdir(self.directory) if (f := parse_name(n)) is not None)
        self.exported_csn = self.files[-1].last_csn if self.files else 0
        self.rows = 0  # written by this run
        self.holder = f"the parquet export to {self.directory}"
        changelog.add_retention_holder(self._retention_holds)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="csnd-parquet", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Writes what is pending and ends the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.log.remove_retention_holder(self._retention_holds)

    def _retention_holds(self) -> dict[str, int]:
        """What is not exported yet: retention keeps it (Changelog.apply_retention), up to its hold limits."""
        return {self.holder: self.exported_csn}

    def _run(self) -> None:
        try:
            self._follow()
        except Exception as e:
            what = f"{e.strerror or e} ({e.filename})" if isinstance(e, OSError) else str(e)
            self.error = OutputError(
                f"parquet export to {self.directory} failed after csn {self.exported_csn}: {what}; the "
                "changelog is intact, and a restart exports on from the newest whole file"
            )
            if self.on_failure is not None:
                self.on_failure(self.error)

    def _follow(self) -> None:
        from csnd.consumers.spark.columns import RowBuilder

        builder = RowBuilder()
        last = self.exported_csn  # the newest transaction taken (written, or pending in `builder`)
        since: float | None = None  # when the oldest pending transaction was taken
        while True:
            stopping = self._stop.is_set()  # (before the read: a stop writes all that was durable then)
            try:
                for csn, line in self.log.read(last):
                    builder.add(csn, line)
                    last = csn
                    since = self._clock() if since is None else since
                    if builder.rows >= self.file_rows:
                        self._write(builder, last)
                        since = None
            except CsnOutOfRange as e:  # (behind the changelog's retention: a gap, in the names too)
                log.error(
                    "%s fell behind the changelog's retention past its hold limits: it was at csn %d, the "
                    "oldest retained csn is %s; the files skip the transactions in between (%s)",
                    self.holder,
                    last,
                    e.oldest_csn,
                    e,
                )
                self._write(builder, last)
                since = None
                last = self.exported_csn = max(last, self.log.oldest_csn - 1)
                continue
            if stopping:
                self._write(builder, last)
                return
            if since is not None and self._clock() - since >= self.file_wait_s:
                self._write(builder, last)
                since = None
            self.log.wait_durable(last, 0.5)

    def _write(self, builder: RowBuilder, last: int) -> None:
        """The rows taken so far as the file of (exported_csn, last]."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = builder.rows
        if not rows:  # (transactions without changes get no file: the next one's range covers them)
            return
        batch = builder.take()
        name = file_name(self.exported_csn, last)
        path = os.path.join(self.directory, name)
        tmp = os.path.join(self.directory, f".{name}.tmp")
        pq.write_table(pa.Table.from_batches([batch]), tmp)
        self._stamp(tmp)
        _fsync(tmp)
        os.replace(tmp, path)
        sync_directory(path)
        self.files.append(ParquetFile(name, self.exported_csn, last))
        self.exported_csn = last
        self.rows += rows
        self._retain()
        self._write_ranges()

    def _stamp(self, tmp: str) -> None:
        """Gives the new file a modification time a millisecond or more after the newest file's.

        Spark's file-stream source takes new files oldest first, by their
        times in milliseconds; with maxFilesPerTrigger it takes them in CSN
        order only if those increase.  The kernel stamps files from a coarse
        clock (a few milliseconds), which two files cut in quick succession
        can share, and a clock stepped back would order them the wrong way.
        """
        newest = 0
        if self.files:
            with contextlib.suppress(FileNotFoundError):  # (removed by hand: no time to follow)
                newest = os.stat(os.path.join(self.directory, self.files[-1].name)).st_mtime_ns // _NS_PER_MS
        ms = max(time.time_ns() // _NS_PER_MS, newest + 1)
        os.utime(tmp, ns=(ms * _NS_PER_MS, ms * _NS_PER_MS))

    def _retain(self) -> None:
        """Remove the files whose every transaction the changelog's retention has dropped."""
        oldest = self.log.oldest_csn
        while len(self.files) > 1 and oldest and self.files[0].last_csn < oldest:
            gone = self.files.pop(0)
            os.unlink(os.path.join(self.directory, gone.name))

    def _write_ranges(self) -> None:
        doc = {
            "last_csn": self.exported_csn,
            "files": [{"file": f.name, "after_csn": f.after_csn, "last_csn": f.last_csn} for f in self.files],
        }
        path = os.path.join(self.directory, RANGES)
        replace_file(path, json.dumps(doc, indent=1).encode(), os.path.join(self.directory, f".{RANGES}.tmp"))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
