"""The service's snapshots: whether an initial one is taken (again), taking it, and the incremental ones.

    changelog opened ─► InitialSnapshot.check(state) ─► prepare() ─► ready line ─► take() ─► pipeline
                          cut short: take again / refuse   slots with        (pipeline thread:
                                                           exported snapshots  first thing)
    open_incremental() ─► IncrementalSnapshots (csnd snapshot, over gRPC StartSnapshot)

An initial snapshot is taken on a first start (an empty changelog) from the
snapshots its slots exported (`serve_slots.Slots.prepare`).  Readers see
none of it until it is complete (`Changelog.hold_readers`), so one cut
short can be taken again from the start: the only way on, since the
exported snapshot died with the connection that made the slot (docs/
design.md section 5).
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
from typing import TYPE_CHECKING, Protocol

from csnd.core.errors import SnapshotError
from csnd.service.config import ServeConfig
from csnd.service.serve_sources import live_sources, safe_target
from csnd.snapshot import SnapshotProgress, SnapshotState
from csnd.snapshot.plan import CHUNK_ROWS
from csnd.snapshot.watermark import Windows

if TYPE_CHECKING:
    from csnd.changelog import Changelog
    from csnd.snapshot.incremental import IncrementalSnapshots
    from csnd.snapshot.run import SnapshotNode, SnapshotRun

log = logging.getLogger("csnd.serve")


class SlotPreparation(Protocol):
    """What the initial snapshot needs of the slots (serve_slots.Slots)."""

    def prepare(self, first_start: bool) -> list[SnapshotNode]:
        """Every live slot ready; on a first start, the readers of the snapshots the new slots exported."""

    def drop_initial_slots(self) -> None:
        """Drop the slots `snapshot=initial` made, to take the snapshot anew."""


class InitialSnapshot:
    """The initial snapshot of this run: decided before the ready line, taken first in the pipeline thread."""

    def __init__(
        self,
        config: ServeConfig,
        changelog: Changelog,
        slots: SlotPreparation,
        progress: SnapshotProgress,
        stopping: threading.Event,
    ) -> None:
        self.config = config
        self.log = changelog
        self.slots = slots
        self.progress = progress
        self.stopping = stopping
        self._run: SnapshotRun | None = None  # the snapshot to take, until it is complete

    @property
    def taking(self) -> bool:
        """A snapshot is to be taken or being taken (consumers read it as it is written)."""
        return self._run is not None

    def check(self, state: SnapshotState) -> None:
        """A changelog whose newest record is a chunk of an initial snapshot was cut short: take it again.

        The exported snapshot died with the connection that made the slot, so
        the rest of it cannot be read, and the slot's stream starts after it:
        the only way on is a new slot and an empty changelog (docs/design.md
        section 5).  No reader was shown any of it (`hold_readers`), so when
        every slot it may have made is one `snapshot=initial` made (it refuses
        a slot that exists), those slots are dropped, the changelog emptied
        and the snapshot taken anew.  A `when_needed` source may have used a
        slot that was there before, which must not be dropped: refused, with
        the way to start over.
        """
        if state.state != "incomplete":
            return
        m = state.marker or {}
        live = [s for s in self.config.sources if s.is_live]
        if live and all(s.live.snapshot in ("initial", "never") for s in live):
            log.warning(
                "changelog %s holds an initial snapshot cut short (csn %d, chunk %s of %s), never shown to a "
                "reader: taking it again from the start with new slots",
                os.path.abspath(self.config.changelog),
                state.csn,
                m.get("chunk"),
                m.get("chunks"),
            )
            self.slots.drop_initial_slots()
            self.log.clear()
            return
        directory = os.path.abspath(self.config.changelog)
        slots = ", ".join(
            f"{s.live.slot} (csnd slot drop {s.live.slot} {shlex.quote(safe_target(s))})"
            for s in self.config.sources
            if s.is_live and s.live.slot
        )
        raise SnapshotError(
            f"changelog {directory} holds an initial snapshot cut short (its newest record, csn {state.csn}, "
            f"is chunk {m.get('chunk')} of {m.get('chunks')}, and no completion record follows): a snapshot "
            "cannot be resumed, since it was exported by the connection that made the slot; start over: "
            f"stop the consumers, empty {directory}, drop the slot{'s' if ',' in slots else ''} "
            f"{slots or 'of the source'} and start the service again",
            node=m.get("node") if isinstance(m.get("node"), str) else None,
            table=f"{m.get('schema')}.{m.get('table')}" if m.get("table") else None,
        )

    def prepare(self) -> None:
        """The slots ready; on a first start with exported snapshots, the snapshot to take first."""
        from csnd.snapshot.run import SnapshotRun

        nodes = self.slots.prepare(first_start=self.log.newest_csn == 0)
        if nodes:
            self._run = SnapshotRun(nodes, self.progress)
            self.log.hold_readers()  # (shown once complete: one cut short can be taken again)

    def take(self) -> bool:
        """Copies the snapshot, if there is one (the pipeline thread, first); False when a stop cut it short."""
        run = self._run
        if run is None:
            return True
        try:
            end = run.run(self.log)
        except SnapshotError:
            if not self.stopping.is_set():
                raise
            log.warning(
                "stopped in the middle of the initial snapshot: the changelog holds part of it, "
                "shown to no reader; the next start takes it again"
            )
            return False
        self.log.release_readers()
        self._run = None
        log.info("initial snapshot complete: csn %d to %d", self.progress.first_csn, end)
        return True

    def stop(self) -> None:
        """Stop the copy (any thread): `take()` then returns False."""
        run = self._run
        if run is not None:
            run.stop()


def open_incremental(
    config: ServeConfig, changelog: Changelog, windows: Windows
) -> IncrementalSnapshots | None:
    """The incremental snapshots over the live sources, with the jobs an earlier run left unfinished (None: no live source)."""
    from csnd.snapshot.incremental import IncrementalSnapshots, NodeAccess

    nodes = {}
    for entry in live_sources(config.sources):
        source, o = entry.source, entry.source.options
        nodes[source.node] = NodeAccess(
            source.node,
            o.conninfo,
            o.publication,
            source.binary,
            source.mode,
            source.enum_types,
            when_needed=entry.config.live.snapshot == "when_needed",
            gtm=config.gtm if source.mode == "gtm" else None,
        )
    if not nodes:
        return None
    jobs = IncrementalSnapshots(
        config.changelog,
        changelog,
        windows,
        nodes,
        chunk_rows=config.snapshot_chunk_rows or CHUNK_ROWS,
    )
    jobs.load()
    return jobs
