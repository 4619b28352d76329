"""Fetch: a bounded csn range of the changelog, as transaction lines or as Arrow rows.

    FetchRequest(after, until, tables, format) ─► lines: log.read_pieced ─► TableFilter ─► BatchBuilder ─► batches
                                               └► arrow: RowBlocks ─► Arrow IPC messages, or files on this host

A Fetch reads what is there and ends: no wait, no consumer, no mark (the
Spark source plans its ranges by Status and fetches each).  Arrow rows need
pyarrow (the `spark` extra); without it an arrow Fetch is answered with
lines, which the client turns into rows itself.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, NoReturn

import grpc

from csnd.core.errors import ChangelogCorrupt, CsnOutOfRange
from csnd.core.hostid import host_id
from csnd.proto.changefeed.v1 import changefeed_pb2 as pb
from csnd.service.batching import BatchBuilder
from csnd.service.feed_aborts import abort, bad_line, damaged, out_of_range, refuse_unknown, table_filter
from csnd.service.feed_ending import Ending
from csnd.service.feed_messages import fetch_response, piece_responses, pieces_kept
from csnd.service.filtering import TableFilter
from csnd.service.knowntables import KnownTables

if TYPE_CHECKING:
    from csnd.changelog import Changelog
    from csnd.service.arrow_rows import RowBlocks
    from csnd.service.changefeed import FeedSettings

log = logging.getLogger("csnd.changefeed")


class Fetches:
    """The Fetch RPC over `changelog` (the whole Changelog: Arrow rows read its records and relations)."""

    def __init__(
        self,
        changelog: Changelog,
        settings: FeedSettings,
        known_tables: KnownTables,
        stopping: threading.Event,
        directory: str,
        ending: Ending | None = None,
    ) -> None:
        self.log = changelog
        self.settings = settings
        self.known_tables = known_tables
        self.stopping = stopping
        # The failure the service ends on, told to a fetch cut short by it (csnd.service.feed_ending)
        self.ending = ending or Ending()
        self.directory = directory  # (<directory>/arrow-files holds the Arrow files by default)
        self._lock = threading.Lock()
        self._row_blocks: RowBlocks | None = None  # Fetch(format="arrow")'s rows, made on first use
        self._arrow_missing_logged = False

    def _stopped(self, context: grpc.ServicerContext) -> NoReturn:
        """A fetch cut short by the stop: the failure the service ends on, or UNAVAILABLE (fetch again)."""
        failure = self.ending.failure
        if failure is not None:
            abort(context, failure.code, failure.details)
        abort(context, grpc.StatusCode.UNAVAILABLE, "the service is stopping; fetch again")

    def fetch(
        self, request: pb.FetchRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchResponse | bytes]:
        filt = table_filter(request.tables, context)
        refuse_unknown(self.known_tables, request.tables, context)
        after, until = request.after_csn, request.until_csn
        if until and until < after:
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"until_csn {until} is before after_csn {after}: the range is empty",
            )
        if request.format not in ("", "lines", "arrow"):
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown fetch format {request.format!r}: csnd sends lines or arrow",
            )
        until = until or self.log.visible_csn
        if until == 0:
            return
        if request.format == "arrow" and (blocks := self._arrow_rows()) is not None:
            files = bool(request.client_host) and request.client_host == host_id()
            yield from self._fetch_arrow(blocks, after, until, filt, files, context)
            return
        yield from self._fetch_lines(after, until, filt, context)

    def _fetch_lines(
        self, after: int, until: int, filt: TableFilter, context: grpc.ServicerContext
    ) -> Iterator[pb.FetchResponse | bytes]:
        builder = BatchBuilder(self.settings.max_batch_bytes)
        try:
            max_bytes = self.settings.max_batch_bytes
            for csn, line in self.log.read_pieced(after, until, whole_up_to=max_bytes):
                if not isinstance(line, bytes):
                    pieces = pieces_kept(csn, line, filt, max_bytes, context)
                    if pieces is not None:
                        batch = builder.flush()
                        if batch:
                            yield fetch_response(batch)
                        yield from piece_responses(csn, pieces, pb.FetchResponse)
                    continue
                try:
                    kept = filt.keep(line)
                except ValueError as e:
                    bad_line(context, csn, e)
                if kept is not None and (batch := builder.add(csn, kept)) is not None:
                    yield fetch_response(batch)
                    if self.stopping.is_set():
                        self._stopped(context)
        except CsnOutOfRange as e:
            out_of_range(context, after, e)
        except ChangelogCorrupt as e:
            damaged(context, e)
        batch = builder.flush()
        if batch:
            yield fetch_response(batch)

    def _arrow_rows(self) -> RowBlocks | None:
        """The rows Fetch(format="arrow") sends, made on first use; None without pyarrow (lines instead)."""
        with self._lock:
            if self._row_blocks is None:
                try:
                    from csnd.service import arrow_rows
                except ImportError as e:  # (the `spark` extra is not installed here)
                    if not self._arrow_missing_logged:
                        log.warning("changefeed: Arrow fetches are answered with lines: %s", e)
                        self._arrow_missing_logged = True
                    return None
                s = self.settings
                files_dir = s.arrow_files_dir if s.arrow_files_bytes > 0 else None
                if files_dir == "":
                    files_dir = os.path.join(self.directory, "arrow-files") if self.directory else None
                try:
                    self._row_blocks = arrow_rows.RowBlocks(
                        self.log,
                        s.arrow_message_bytes,
                        files_dir=files_dir,
                        files_budget_bytes=s.arrow_files_bytes,
                    )
                except OSError as e:  # (the directory cannot be made: every reader gets bytes)
                    log.warning("changefeed: Arrow rows are sent as bytes only: %s: %s", files_dir, e)
                    self._row_blocks = arrow_rows.RowBlocks(self.log, s.arrow_message_bytes)
            return self._row_blocks

    def _fetch_arrow(
        self,
        blocks: RowBlocks,
        after: int,
        until: int,
        filt: TableFilter,
        files: bool,
        context: grpc.ServicerContext,
    ) -> Iterator[pb.FetchResponse | bytes]:
        from csnd.service.arrow_rows import RecordTooLarge

        try:
            for i, message in enumerate(blocks.messages(after, until, filt, files=files)):
                if isinstance(message, bytes):
                    yield pb.FetchResponse(arrow=message)
                else:
                    yield pb.FetchResponse(arrow_file=pb.ArrowFile(**message._asdict()))
                if i % 16 == 15 and self.stopping.is_set():
                    self._stopped(context)
        except CsnOutOfRange as e:
            out_of_range(context, after, e)
        except ChangelogCorrupt as e:
            damaged(context, e)
        except RecordTooLarge as e:
            abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except (ValueError, TypeError) as e:
            abort(
                context,
                grpc.StatusCode.DATA_LOSS,
                f"the changelog's transactions in csn range ({after}, {until}] cannot be made rows ({e}): "
                "check the changelog (csnd changelog DIR) and report this",
            )
