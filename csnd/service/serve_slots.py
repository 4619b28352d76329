"""The live sources' slots before the ready line: checked, prepared, and dropped when a snapshot is taken again.

    start ─► check_kept(durable csn) ─► prepare(first start) ─► ready line ─► pipeline runs
                                           │ a slot made with an exported snapshot (snapshot=initial,
                                           ▼ when_needed): its readers import it (csnd.snapshot)
                                       SnapshotNode per node ─► serve_snapshot.InitialSnapshot

Every live source's slot exists at its consistent point before the ready
line -- created now with `create_slot`, checked otherwise
(`LiveSource.prepare`) -- so every transaction committed after the line is
delivered.  A changelog that holds transactions continues only from slots
that still exist (`check_slots_kept`).  The slots are prepared one node
after another; a slot that cannot be made or used is one error naming node
and slot.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Final

from csnd.core.errors import SourceError
from csnd.service.config import ServeConfig
from csnd.service.nodes import check_slots_kept
from csnd.service.serve_sources import live_sources

if TYPE_CHECKING:
    from csnd.reader.live import LiveSource
    from csnd.snapshot.run import SnapshotNode

# How long a slot to drop may still be in use by the connection of a killed service.
SLOT_DROP_WAIT_S: Final = 30.0


class Slots:
    """The configuration's live slots: kept, prepared (with exported snapshots on a first start), dropped."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config

    def check_kept(self, durable_csn: int) -> None:
        """A SlotLost before anything starts when a slot the changelog continues from is gone."""
        cfg = self.config
        live = [(s.name or f"dn{i + 1}", s.target, s.live.slot or "") for i, s in enumerate(cfg.sources)]
        check_slots_kept(
            [n for n, s in zip(live, cfg.sources, strict=True) if s.is_live],
            os.path.abspath(cfg.changelog),
            durable_csn,
        )

    def prepare(self, first_start: bool) -> list[SnapshotNode]:
        """Every live slot at its consistent point (created if asked), one node after another.

        On a first start (an empty changelog) a source with `snapshot`
        initial or when_needed gets its slot made with an exported snapshot,
        which its snapshot readers import before the exporting connection is
        let go; those readers are returned, one per node, for the initial
        snapshot to copy from (the copy itself runs in the pipeline thread,
        after the ready line).
        """
        from csnd.snapshot.copier import NodeSnapshot, SnapshotSettings
        from csnd.snapshot.privileges import check_snapshot_privileges
        from csnd.snapshot.run import SnapshotNode

        cfg = self.config
        defaults = SnapshotSettings()
        settings = SnapshotSettings(
            cfg.snapshot_chunk_rows or defaults.chunk_rows, cfg.snapshot_readers or defaults.readers
        )
        nodes: list[SnapshotNode] = []
        try:
            for entry in live_sources(cfg.sources):
                source = entry.source
                wanted = entry.config.live.snapshot if first_start else "never"
                enums = source.enum_types() if wanted != "never" and source.binary else []
                check_snapshot_privileges(
                    source.node,
                    source.options.conninfo,
                    source.options.publication,
                    wanted,
                    source.options.slot,
                )
                exported = source.prepare(wanted)
                if exported is None:
                    continue
                try:
                    reader = NodeSnapshot(
                        source.node,
                        source.options.conninfo,
                        source.options.publication,
                        exported.consistent_lsn,
                        binary=source.binary,
                        enums=enums,
                        settings=settings,
                    )
                    reader.open(exported.name)
                finally:
                    exported.release()  # (the readers' transactions hold the snapshot from here on)
                nodes.append(SnapshotNode(reader, source.mode, exported.made_at))
        except BaseException:
            for n in nodes:
                n.reader.close()
            raise
        return nodes

    def drop_initial_slots(self) -> None:
        """Drop the slots `snapshot=initial` made (it refuses one that exists): a cut-short snapshot is taken anew."""
        for entry in live_sources(self.config.sources):
            if entry.config.live.snapshot == "initial":
                drop_own_slot(entry.source)


def drop_own_slot(source: LiveSource) -> None:
    """Drop a slot this service made for an initial snapshot that was cut short (its reader may linger)."""
    from csnd.reader.slots import drop_slot

    slot, conninfo = source.options.slot, source.options.conninfo
    deadline = time.monotonic() + SLOT_DROP_WAIT_S
    while True:
        try:
            drop_slot(slot, conninfo)
            return
        except SourceError as e:
            if "there is no replication slot" in e.message:
                return  # (dropped already: by hand, or by an earlier try)
            if "is active" not in e.message or time.monotonic() >= deadline:
                raise SourceError(
                    f"cannot drop replication slot {slot} to take the initial snapshot again: {e.message}",
                    node=source.node,
                ) from None
            time.sleep(0.5)  # (the killed service's connection is still going away)
