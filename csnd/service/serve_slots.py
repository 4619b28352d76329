"""The live sources' slots before the ready line: checked, prepared, and dropped when a snapshot is taken again.

    start ─► check_kept(durable csn) ─► prepare(first start) ─► ready line ─► pipeline runs
                                           │ a slot made with an exported snapshot (snapshot=initial,
                                           ▼ when_needed): its readers import it (csnd.snapshot)
                                       SnapshotNode per node ─► serve_snapshot.InitialSnapshot

In GTM mode with `--gtm`, the snapshots of a first start are exported
under one commit barrier of the shared GTM instead (`snapshot_at_one_csn`):
one CSN on every node.  Every live source's slot exists at its consistent point before the ready
line -- created now with `create_slot`, checked otherwise
(`LiveSource.prepare`) -- so every transaction committed after the line is
delivered.  A changelog that holds transactions continues only from slots
that still exist (`check_slots_kept`).  The slots are prepared one node
after another; a slot that cannot be made or used is one error naming node
and slot.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Final

from csnd.core.errors import SnapshotError, SourceError
from csnd.service.config import ServeConfig
from csnd.service.nodes import check_slots_kept
from csnd.service.serve_sources import live_sources

if TYPE_CHECKING:
    from csnd.reader.live import LiveSource
    from csnd.reader.sourcecheck import ExportedSnapshot
    from csnd.snapshot.copier import NodeSnapshot, SnapshotSettings
    from csnd.snapshot.run import SnapshotNode

log = logging.getLogger("csnd.serve")

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
        from csnd.snapshot.copier import SnapshotSettings
        from csnd.snapshot.privileges import check_snapshot_privileges
        from csnd.snapshot.run import SnapshotNode

        cfg = self.config
        defaults = SnapshotSettings()
        settings = SnapshotSettings(
            cfg.snapshot_chunk_rows or defaults.chunk_rows,
            cfg.snapshot_readers or defaults.readers,
            split=cfg.snapshot_split or defaults.split,
        )
        nodes: list[SnapshotNode] = []
        at_barrier: list[tuple[LiveSource, ExportedSnapshot, list[tuple[int, int]]]] = []
        gtm_nodes: list[str] = []
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
                if source.mode == "gtm":
                    gtm_nodes.append(source.node)
                exported = source.prepare(wanted)
                if exported is None:
                    continue
                if cfg.gtm and source.mode == "gtm":
                    # (the slot is made; the snapshot that counts is exported under the barrier)
                    exported.release()
                    at_barrier.append((source, exported, enums))
                    continue
                try:
                    reader = node_snapshot(source, exported, enums, settings)
                    reader.open(exported.name)
                finally:
                    exported.release()  # (the readers' transactions hold the snapshot from here on)
                nodes.append(SnapshotNode(reader, source.mode, exported.made_at))
            if at_barrier:
                made = [source.node for source, _, _ in at_barrier]
                if sorted(made) != sorted(gtm_nodes):
                    raise SnapshotError(
                        f"GTM-mode nodes {', '.join(sorted(set(gtm_nodes) - set(made)))} take no initial "
                        f"snapshot while {', '.join(made)} do: a snapshot at one CSN covers every GTM-mode node "
                        "(their streams resume after its CSN); give every GTM-mode source the same snapshot "
                        "setting, with new slots"
                    )
                nodes += snapshot_at_one_csn(cfg.gtm or "", at_barrier, settings, cfg.gtm_barrier_timeout_s)
            elif any(n.mode == "gtm" for n in nodes) and len(gtm_nodes) > 1:
                log.warning(
                    "initial snapshot of GTM-mode nodes without --gtm: each node is copied at its own slot's "
                    "point, so a distributed transaction committed meanwhile may be in one node's snapshot "
                    "and another's stream (docs/design.md section 5); name the GTM to take it at one CSN"
                )
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


def node_snapshot(
    source: LiveSource,
    exported: ExportedSnapshot,
    enums: list[tuple[int, int]],
    settings: SnapshotSettings,
) -> NodeSnapshot:
    """The reader of one node's initial snapshot, at its slot's consistent point (not yet opened)."""
    from csnd.snapshot.copier import NodeSnapshot

    return NodeSnapshot(
        source.node,
        source.options.conninfo,
        source.options.publication,
        exported.consistent_lsn,
        binary=source.binary,
        enums=enums,
        settings=settings,
    )


def snapshot_at_one_csn(
    gtm: str,
    made: list[tuple[LiveSource, ExportedSnapshot, list[tuple[int, int]]]],
    settings: SnapshotSettings,
    timeout_s: float | None = None,
) -> list[SnapshotNode]:
    """The nodes' snapshots exported under one GTM commit barrier (`csnd.gtm.barrier`): at one CSN.

    The slots are made first, outside the barrier: a slot's consistent point
    waits for the transactions then open, which may be writers waiting on the
    barrier.  Under it, each node only exports a snapshot (one round trip a
    node, all at once), and the readers import them once the GTM is released,
    so writers wait for little.  What the slots stream from before the
    barrier is at or below its CSN, in the snapshot, and dropped as the
    stream resumes after it.
    """
    from csnd.gtm.barrier import BARRIER_TIMEOUT_S, CommitBarrier
    from csnd.snapshot.run import GtmCut, SnapshotNode

    readers: list[SnapshotNode] = []
    barrier = CommitBarrier(
        gtm,
        {source.node: source.options.conninfo for source, _, _ in made},
        timeout_s=timeout_s or BARRIER_TIMEOUT_S,
    )
    try:
        with barrier.export() as held:  # (the exported snapshots stay importable in this block)
            cut = GtmCut(held.csn, held.held_s * 1000)
            log.info(
                "initial snapshot: every GTM-mode node at csn %d; the GTM held %.1f ms "
                "(%d nodes, %d commits drained)",
                held.csn,
                cut.held_ms,
                len(made),
                len(held.drained),
                extra={"csn": held.csn},
            )
            for source, exported, enums in made:
                reader = node_snapshot(source, exported, enums, settings)
                readers.append(SnapshotNode(reader, source.mode, exported.made_at, cut))
                reader.open(held.snapshots[source.node])
        return readers
    except BaseException:
        for n in readers:
            n.reader.close()
        raise


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
