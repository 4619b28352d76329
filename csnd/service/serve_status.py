"""What `csnd serve` says of itself: its nodes over every pipeline run, its Status figures, its readiness.

    OpenedInput per run ─► NodeWatches ─► node_states() ─┐
    PipelineSupervisor.totals() ─────────────────────────┼─► ServiceStatus (a status.StatusSource) ─► Status
    InitialSnapshot.progress ────────────────────────────┘
    StartPhase, stop, PipelineSupervisor, nodes ─► Readiness ─► /readyz

Every read here is cheap and from any thread (a status request, a dashboard
refresh, a probe): statistics objects and flags, never a wait on the
pipeline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from csnd.runtime.stats import NodeStats
from csnd.service.nodes import NodeWatch, SlotMonitor
from csnd.service.status import NodeState, SnapshotFigures, Totals, unready_nodes

if TYPE_CHECKING:
    from csnd.runtime.confirm import ConfirmTracker
    from csnd.service.serve_sources import OpenedInput


class NodeWatches:
    """Each node's `NodeWatch`, kept over the pipeline runs of the service (a restart keeps the watch)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[str, NodeWatch] = {}

    def attach(
        self,
        opened: Sequence[OpenedInput],
        trackers: dict[str, ConfirmTracker],
        waiting_merge: Callable[[str], Callable[[], int]],
    ) -> None:
        """A new run's inputs: each node's watch (made on its first run) reads them from now on."""
        with self._lock:
            for o in opened:
                node = o.input.node
                watch = self._watches.get(node)
                if watch is None:
                    watch = self._watches[node] = NodeWatch(node, o.input.mode, o.shown_as)
                    if o.slot is not None:
                        watch.slot = SlotMonitor(o.slot.conninfo, o.slot.slot)
                        watch.slot.start()
                watch.attach(o.input, trackers.get(node), waiting_merge(node))

    def all(self) -> list[NodeWatch]:
        with self._lock:
            return list(self._watches.values())

    def node_states(self) -> list[NodeState]:
        return [w.snapshot() for w in self.all()]

    def stats(self) -> list[NodeStats]:
        return [w.stats() for w in self.all()]

    def mark(self, node: str | None, state: str, error: str, *, restarted: bool = False) -> None:
        """`node` (None: every node) is now `state` because of `error`."""
        for w in self.all():
            if node is None or w.name == node:
                w.state, w.error = state, error
                if restarted:
                    w.restarts += 1

    def ended(self) -> None:
        """The sources ended: every node not failed is "ended"."""
        for w in self.all():
            if w.state != "failed":
                w.state = "ended"

    def stop(self) -> None:
        """Stop reading the slots."""
        for w in self.all():
            if w.slot is not None:
                w.slot.stop()


class PipelineTotals(Protocol):
    """What the pipeline appended over its runs (serve_pipeline.PipelineSupervisor)."""

    def totals(self) -> Totals: ...


class ServiceStatus:
    """The service's part of Status (a `status.StatusSource`): its nodes, its totals, its initial snapshot."""

    def __init__(self, watches: NodeWatches, pipeline: PipelineTotals, initial: SnapshotFigures) -> None:
        self.watches = watches
        self.pipeline = pipeline
        self.initial = initial

    def node_states(self) -> list[NodeState]:
        return self.watches.node_states()

    def totals(self) -> Totals:
        return self.pipeline.totals()

    def initial_snapshot(self) -> SnapshotFigures:
        return self.initial


class StartPhase:
    """What the service is doing before it is ready (/readyz says it); "" once the ready line is out."""

    def __init__(self, doing: str) -> None:
        self.doing = doing


class PipelineState(Protocol):
    """How the pipeline stands, for /readyz (serve_pipeline.PipelineSupervisor)."""

    @property
    def failed(self) -> bool: ...

    @property
    def finished(self) -> bool: ...


class SnapshotTaking(Protocol):
    """Whether an initial snapshot is to be taken or being taken (serve_snapshot.InitialSnapshot)."""

    @property
    def taking(self) -> bool: ...


class NodeFigures(Protocol):
    def node_states(self) -> list[NodeState]: ...


class Readiness:
    """`/readyz`: (ready, one line saying so or why not); cheap, from any thread."""

    def __init__(
        self,
        phase: StartPhase,
        stopping: threading.Event,
        pipeline: PipelineState,
        initial: SnapshotTaking,
        nodes: NodeFigures,
        sources: int,
        grace_s: float,
    ) -> None:
        self.phase = phase
        self.stopping = stopping
        self.pipeline = pipeline
        self.initial = initial
        self.nodes = nodes
        self.sources = sources
        self.grace_s = grace_s

    def check(self) -> tuple[bool, str]:
        """Ready: the ready line is out (changelog open, slots prepared), the pipeline is running or
        its sources ended, no node failed, and none has been reconnecting or restarting for longer
        than `grace_s`.
        """
        if self.stopping.is_set():
            return False, "stopping"
        if self.phase.doing:
            return False, f"starting: {self.phase.doing}"
        if self.pipeline.failed:
            return False, "the pipeline failed and the service is ending (its error is on stderr)"
        if self.pipeline.finished:
            return True, "ready: every source ended; serving the changelog"
        if self.initial.taking:
            return True, "ready: taking the initial snapshot (consumers read it as it is written)"
        nodes = self.nodes.node_states()
        if len(nodes) < self.sources:
            return False, "starting: the pipeline is opening its sources"
        why = unready_nodes(nodes, self.grace_s)
        if why is not None:
            return False, why
        return True, "ready"
