"""The pipeline thread of `csnd serve`: the initial snapshot first, then runs of the pipeline, restarted.

    InitialSnapshot.take() ─► run: open_inputs ─► Merger ─► ChangelogSink ─► Changelog
                               ▲  (resume after what is durable)                 │
                               └── transient failure: backoff, then a new run ◄──┘

A pipeline that fails with a transient cause (a dead decoder process, a lost
node agent, a source's connection that gave up) is torn down and started
again from the changelog's position after a backoff: each source resumes
from its slot's confirmed LSN (or a recorded file from its start), and the
senders drop what the changelog already holds (`resume_csn`), so nothing is
lost and nothing is appended twice.  Consumers keep their streams
meanwhile.  The waits come from `csnd.core.backoff` (jittered, the ceiling
doubling and never reset: a pipeline that keeps failing waits longer and
longer); `RESTART_LIMIT` failures within `RESTART_WINDOW_S` end the service.
Any other failure is not transient: it ends the service, the changelog
intact so that a fixed configuration resumes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, Protocol

from csnd.core.backoff import Backoff
from csnd.core.errors import ConnectionLost, CsndError, WorkerError
from csnd.runtime.merger import Merger
from csnd.service.config import ServeConfig
from csnd.service.serve_sources import open_inputs
from csnd.service.serve_status import NodeWatches
from csnd.service.sink import ChangelogSink
from csnd.service.status import Totals
from csnd.snapshot import snapshot_state
from csnd.snapshot.watermark import Windows

if TYPE_CHECKING:
    from csnd.changelog import Changelog

log = logging.getLogger("csnd.serve")

# Restarts of a failed pipeline: the first within RESTART_FIRST_S, the ceiling doubling
# up to RESTART_MAX_S (csnd.core.backoff); this many failures inside the window end
# the service instead.
RESTART_FIRST_S: Final = 0.5
RESTART_MAX_S: Final = 30.0
RESTART_LIMIT: Final = 5
RESTART_WINDOW_S: Final = 300.0
# How often the slots are confirmed (as far as finished syncs cover).  The
# changelog's group commit does not wait for it: the merger asks for a sync as
# soon as a round appended something and none is under way.
DURABLE_INTERVAL_S: Final = 0.005

# Errors a fresh pipeline may well not meet again.
_TRANSIENT: Final = (WorkerError, ConnectionLost)


def restart_backoff() -> Backoff:
    """The waits before restarting a failed pipeline (no give-up by time: RESTART_LIMIT in the window is)."""
    return Backoff(time.monotonic, first=RESTART_FIRST_S, cap=RESTART_MAX_S, give_up=None)


class FirstStep(Protocol):
    """What the pipeline thread does before the first run (serve_snapshot.InitialSnapshot)."""

    def take(self) -> bool:
        """True to go on with the pipeline; False when a stop came first."""


class PipelineSupervisor:
    """Runs the pipeline in a thread of its own until its sources end, a stop, or a failure restarts cannot mend."""

    def __init__(
        self,
        config: ServeConfig,
        changelog: Changelog,
        windows: Windows,
        watches: NodeWatches,
        first: FirstStep,
        backoff: Backoff,
        stopping: threading.Event,
    ) -> None:
        self.config = config
        self.log = changelog
        self.windows = windows  # incremental snapshots' open windows, shown every appended transaction
        self.watches = watches
        self.first = first
        self.backoff = backoff
        self.stopping = stopping
        self.restarts = 0
        self.failure: BaseException | None = None
        self._done = threading.Event()  # the thread has finished (ended, failed or stopped)
        self._lock = threading.Lock()  # (the current run's sink and runtime, swapped at each run)
        self.sink: ChangelogSink | None = None
        self.runtime: Merger | None = None
        self._appended = (0, 0)  # (transactions, changes) of runs before the current one
        self._skipped = 0  # of runs before the current one
        self._thread = threading.Thread(target=self._pipeline, name="csnd-pipeline", daemon=True)

    # --- state, from any thread -----------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def finished(self) -> bool:
        """The thread has finished: the sources ended, a stop, or a failure (`failure`)."""
        return self._done.is_set()

    def fail(self, e: BaseException) -> None:
        """Something beside the pipeline failed (the Parquet export): the service ends with `e`."""
        if self.failure is None:
            self.failure = e

    def totals(self) -> Totals:
        runtime, sink = self.runtime, self.sink
        tx, ch = self._appended
        if sink is not None:
            tx += sink.transactions
        if runtime is not None:
            ch += runtime.changes_out
        # re-sent and already held: dropped by the senders (resume_csn), or by the sink
        resumed = sum(s.dropped_resumed for s in self.watches.stats())
        return Totals(
            transactions=tx,
            changes=ch,
            skipped=self._skipped + resumed + (sink.skipped if sink is not None else 0),
            restarts=self.restarts,
        )

    # --- control ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait(self) -> None:
        """Until a stop request or a failure (the sources ending leaves the service serving)."""
        while not self.stopping.is_set():
            if not self._done.is_set():
                self._done.wait(0.5)
            elif self.failure is not None:
                return
            else:  # the sources ended: serve what the changelog holds until told to stop
                self.stopping.wait(0.5)

    def request_stop(self) -> None:
        """Stop taking input (any thread; `stopping` is set by the caller)."""
        runtime = self.runtime
        if runtime is not None:
            runtime.request_stop()

    def join(self, timeout: float) -> None:
        if self._thread.ident is not None:  # (a stop at the ready line may come before it began)
            self._thread.join(timeout=timeout)

    def close(self) -> None:
        """Stop the current run's sink (its sync thread: one sync at a time with the changelog's close)."""
        if self.sink is not None:
            self.sink.stop()

    # --- the thread ---------------------------------------------------------------------

    def _pipeline(self) -> None:
        failures: deque[float] = deque()
        try:
            if not self.first.take():
                return
            while not self.stopping.is_set():
                try:
                    self._run_once()
                    return  # every source ended: keep serving what the changelog holds
                except _TRANSIENT as e:
                    if self.stopping.is_set():
                        return
                    now = time.monotonic()
                    failures.append(now)
                    while failures and now - failures[0] > RESTART_WINDOW_S:
                        failures.popleft()
                    if len(failures) >= RESTART_LIMIT:
                        raise CsndError(
                            f"{e}; the pipeline failed {len(failures)} times in {RESTART_WINDOW_S:.0f}s, giving up"
                        ) from e
                    self.restarts += 1
                    self.watches.mark(e.node, "restarting", str(e), restarted=True)
                    wait = self.backoff.failed()
                    assert wait is not None  # (no give-up by time: the window above decides)
                    log.warning(
                        "pipeline failed: %s; restarting from CSN %d in %.1fs",
                        e,
                        self.log.durable_csn,
                        wait,
                    )
                    if self.stopping.wait(wait):
                        return
        except BaseException as e:  # (reported by the main thread)
            self.failure = e
            self.watches.mark(e.node if isinstance(e, CsndError) else None, "failed", str(e))
        finally:
            self._done.set()

    def _run_once(self) -> None:
        log_ = self.log
        log_.sync()  # (what an earlier run appended is durable before anyone resumes after it)
        resume = log_.durable_csn
        snapshot_csn = 0
        state = snapshot_state(newest_record(log_))
        if state.state == "complete":
            # Nothing streamed is held yet: the senders drop nothing, and the sink
            # fails on a CSN the snapshot's records took (csnd.service.sink).  Taken
            # under a GTM commit barrier, the snapshot holds every CSN up to the
            # barrier's: the senders drop those, and only the CSNs above it that the
            # snapshot's records took, if any, collide (csnd.snapshot.run.GtmCut).
            cut = int((state.marker or {}).get("gtm_csn", 0))
            resume, snapshot_csn = cut, (log_.durable_csn if cut < log_.durable_csn else 0)
        opened = open_inputs(self.config, resume)
        inputs = [o.input for o in opened]
        sink = ChangelogSink(log_, snapshot_csn=snapshot_csn, windows=self.windows)
        runtime = Merger(inputs, sink, confirm_interval_s=DURABLE_INTERVAL_S, durable_always=True)
        with self._lock:
            if self.sink is not None and self.runtime is not None:
                tx, ch = self._appended
                self._appended = (tx + self.sink.transactions, ch + self.runtime.changes_out)
                self._skipped += self.sink.skipped
            self.sink, self.runtime = sink, runtime
            self.watches.attach(opened, runtime.trackers, _waiting_merge(runtime))
        if self.stopping.is_set():
            runtime.request_stop()
        sink.start()
        try:
            runtime.run()
        except BaseException:
            for p in inputs:
                p.stop()
            sink.stop()
            with contextlib.suppress(CsndError, OSError):
                log_.sync()
            raise
        finally:
            sink.stop()
        self.watches.ended()
        for p in inputs:
            p.stop()


def newest_record(changelog: Changelog) -> tuple[int, bytes] | None:
    """The changelog's newest durable record (csn, line), or None when it is empty."""
    newest = changelog.durable_csn
    if newest == 0:
        return None
    return next(iter(changelog.read(newest - 1)), None)


def _waiting_merge(runtime: Merger) -> Callable[[str], Callable[[], int]]:
    """Per node, how many of its batches the merge holds (read by the node's watch)."""
    merge = runtime.merge

    def of(node: str) -> Callable[[], int]:
        return lambda: merge.pending_batches(node)

    return of
