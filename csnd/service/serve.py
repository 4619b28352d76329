"""`csnd serve`: the pipeline over the sources, the durable changelog, the changefeed, the dashboard.

    sources ─► NodeInputs ─► CoordinatorRuntime ─► ChangelogSink ─► Changelog ─► Changefeed (gRPC)
                    ▲            (pipeline thread)      group commit   │            Subscribe / Fetch / Status
                    │                                                   │
                    └──── confirm each slot to what is durable ◄────────┘     DashboardServer (HTTP)
                                                                               /, /metrics, /api/status

The main thread starts the changelog, the gRPC server and the dashboard,
then runs the pipeline in a thread of its own and waits for it or for a stop
request.

Ready.  Before the ready line (and before gRPC health says SERVING) every
live source's slot exists at its consistent point -- created now with
`create_slot`, checked otherwise (`LiveSource.prepare`) -- so every
transaction committed after the line is delivered; a new slot would miss
what commits before that point.  A slot that cannot be made or used is one
line naming node and slot, exit 1.  Restarts of the pipeline find the slots
there.  Consumers only ever read what the changelog has made durable, so
nothing they see can be lost by a crash, and the slots are confirmed only as
far as that (invariant 7).

Restarts.  A pipeline that fails with a transient cause (a dead decoder
process, a lost node agent, a source's connection that gave up) is torn down
and started again from the changelog's position after a backoff: each source
resumes from its slot's confirmed LSN (or a recorded file from its start),
and the senders drop what the changelog already holds (`resume_csn`), so
nothing is lost and nothing is appended twice.  Consumers keep their streams
meanwhile.  The waits come from `csnd.core.backoff` (jittered, the ceiling
doubling and never reset: a pipeline that keeps failing waits longer and
longer); `RESTART_LIMIT` failures within `RESTART_WINDOW_S` end the service
with exit 1.  A protocol error is not transient: one line naming node, LSN
and xid, exit 1, the changelog intact so that a fixed configuration resumes.

Stopping (SIGTERM, Ctrl-C): the pipeline stops taking input, what it wrote is
made durable and confirmed, the streams end cleanly, exit 0.  Sources that
end (files, `until_lsn`) leave the service serving what it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TextIO

from google.protobuf import json_format

from csnd.changelog import Changelog, SubscriptionStore
from csnd.core.auth import Credentials, read_credentials_file
from csnd.core.backoff import Backoff
from csnd.core.errors import ConnectionLost, CsndError, SnapshotError, SourceError, WorkerError
from csnd.core.ids import Csn
from csnd.core.tokens import read_token_file
from csnd.proto import csnd_pb2 as pb
from csnd.runtime.coordinator import CoordinatorRuntime
from csnd.runtime.inputs import NodeInput, NodePipeline
from csnd.runtime.sources import SourceSpec, check_nodes, open_live, open_source
from csnd.runtime.stopping import ignore_stop_signals
from csnd.service.changefeed import FeedSettings
from csnd.service.config import ServeConfig, ServedSource
from csnd.service.limits import StreamLimits
from csnd.service.nodes import NodeWatch, SlotMonitor, check_slots_kept
from csnd.service.server import RunningServer, TlsFiles, start_changefeed
from csnd.service.sink import ChangelogSink
from csnd.service.status import NodeState, unready_nodes
from csnd.snapshot import SnapshotProgress, SnapshotState, snapshot_state
from csnd.snapshot.plan import CHUNK_ROWS
from csnd.snapshot.watermark import Windows

if TYPE_CHECKING:
    from csnd.reader.live import LiveSource
    from csnd.service.parquet import ParquetExport
    from csnd.snapshot.incremental import IncrementalSnapshots

log = logging.getLogger("csnd.serve")

# Restarts of a failed pipeline: the first within RESTART_FIRST_S, the ceiling doubling
# up to RESTART_MAX_S (csnd.core.backoff); this many failures inside the window end
# the service instead.
RESTART_FIRST_S: Final = 0.5
RESTART_MAX_S: Final = 30.0
RESTART_LIMIT: Final = 5
RESTART_WINDOW_S: Final = 300.0
# How often the changelog is synced and the slots confirmed.  Every round of the
# merge with something new is one group commit; this bounds how long a round's
# transactions wait for it (the commit-to-consumer latency).
DURABLE_INTERVAL_S: Final = 0.005

# Errors a fresh pipeline may well not meet again.
_TRANSIENT: Final = (WorkerError, ConnectionLost)
# How long a slot to drop may still be in use by the connection of a killed service.
SLOT_DROP_WAIT_S: Final = 30.0


def _safe_target(src: ServedSource) -> str:
    """The source as Status shows it: never a password."""
    if src.is_live and "://" not in src.target:  # (a key=value conninfo)
        from csnd.runtime.slot_cmd import shown_conninfo

        return shown_conninfo(src.target)
    if src.is_live:
        from urllib.parse import urlsplit, urlunsplit

        url = urlsplit(src.target)
        host = url.hostname or ""
        netloc = (
            f"{url.username + '@' if url.username else ''}{host}{':' + str(url.port) if url.port else ''}"
        )
        return urlunsplit(url._replace(netloc=netloc, query=""))
    return src.target


def node_databases(sources: Sequence[ServedSource], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each live node's database name, as libpq resolves it: the conninfo's, else PGDATABASE, else the user's.

    (For the Debezium formats' `source.db`; a file or agent source names none.)
    """
    import getpass

    from psycopg.conninfo import conninfo_to_dict

    env = os.environ if env is None else env
    out = {}
    for i, src in enumerate(sources):
        if not src.is_live:
            continue
        try:
            params = conninfo_to_dict(src.target)
        except Exception:  # (a bad conninfo is the reader's error to report, with its cause)
            continue
        user = params.get("user") or env.get("PGUSER") or getpass.getuser()
        out[src.name or f"dn{i + 1}"] = str(params.get("dbname") or env.get("PGDATABASE") or user)
    return out


class Service:
    """One `csnd serve` run; `run()` returns the exit status."""

    def __init__(self, config: ServeConfig, *, stdout: TextIO | None = None) -> None:
        self.config = config
        self.stdout = stdout or sys.stdout
        self.log: Changelog | None = None
        self.feed: RunningServer | None = None
        self.http: Any = None
        self.watches: dict[str, NodeWatch] = {}
        self.runtime: CoordinatorRuntime | None = None
        self.sink: ChangelogSink | None = None
        self.parquet: ParquetExport | None = None  # --parquet-dir
        self.restarts = 0
        self.skipped = 0
        self._appended = (0, 0)  # (transactions, changes) of runs before the current one
        self._stop = threading.Event()
        self._done = threading.Event()  # the pipeline thread has finished (ended, failed or stopped)
        self._failure: BaseException | None = None
        self._lock = threading.Lock()
        self.snapshot_progress = SnapshotProgress()
        self._snapshot: Any = None  # the initial snapshot to take first (csnd.snapshot.run.SnapshotRun)
        # Incremental snapshots (csnd snapshot): their open windows, shown every appended transaction
        self.windows = Windows()
        self.incremental: IncrementalSnapshots | None = None
        # The waits before restarting a failed pipeline (give-up: RESTART_LIMIT in the window).
        self.restart_backoff = Backoff(time.monotonic, first=RESTART_FIRST_S, cap=RESTART_MAX_S, give_up=None)
        # What the service is doing before it is ready (/readyz says it); "" once ready.
        self._starting = "opening the changelog"

    # --- setup --------------------------------------------------------------------------

    def _open_sources(self, resume_csn: int) -> list[NodeInput]:
        """Fresh node inputs over every source, resuming after `resume_csn`."""
        from csnd.runtime.remote import RemoteNode

        opened: list[Any] = []  # a source, or a node agent's client (a node input already)
        for i, src in enumerate(self.config.sources):
            if src.is_agent:
                address = src.target.removeprefix("grpc://").rstrip("/")
                remote = RemoteNode(
                    address, name=src.name, give_up_s=self.config.give_up_s, dial=self.config.agent_dial
                )
                if resume_csn:
                    remote.resume_after(resume_csn)
                opened.append(remote)
            else:
                # (slots are made before the ready line; a pipeline restart never makes one
                # anew, which would skip silently what a dropped one held)
                live = dataclasses.replace(src.live, give_up_s=self.config.give_up_s, create_slot=False)
                opened.append(open_source(SourceSpec(src.name, src.target), live, i))
        check_nodes(opened)  # before any decoder starts
        resume = Csn(resume_csn) if resume_csn else None
        inputs: list[NodeInput] = [
            s
            if src.is_agent
            else NodePipeline(
                s,
                self.config.decoders,
                resume_csn=resume,
                spill_dir=self.config.spill_dir,
                spill_bytes=self.config.spill_bytes,
            )
            for src, s in zip(self.config.sources, opened, strict=True)
        ]
        inputs.sort(key=lambda p: p.node)
        return inputs

    def _prepare_slots(self) -> None:
        """Every live source's slot at its consistent point (created if asked), one node after another.

        On a first start (an empty changelog) a source with `snapshot`
        initial or when_needed gets its slot made with an exported snapshot,
        which its snapshot readers import before the exporting connection is
        let go (`csnd.snapshot`); the copy itself runs first thing in the
        pipeline thread, after the ready line.
        """
        from csnd.snapshot.copier import NodeSnapshot, SnapshotSettings
        from csnd.snapshot.privileges import check_snapshot_privileges
        from csnd.snapshot.run import SnapshotNode, SnapshotRun

        assert self.log is not None
        cfg = self.config
        defaults = SnapshotSettings()
        settings = SnapshotSettings(
            cfg.snapshot_chunk_rows or defaults.chunk_rows, cfg.snapshot_readers or defaults.readers
        )
        first_start = self.log.newest_csn == 0
        nodes: list[SnapshotNode] = []
        try:
            for i, src in enumerate(cfg.sources):
                if not src.is_live:
                    continue
                source = open_live(SourceSpec(src.name, src.target), src.live, f"dn{i + 1}")
                wanted = src.live.snapshot if first_start else "never"
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
        if nodes:
            self._snapshot = SnapshotRun(nodes, self.snapshot_progress)
            self.log.hold_readers()  # (shown once complete: one cut short can be taken again)

    def _open_incremental(self) -> None:
        """The incremental snapshots over the live sources, with the jobs an earlier run left unfinished."""
        from csnd.snapshot.incremental import IncrementalSnapshots, NodeAccess

        assert self.log is not None and self.feed is not None
        nodes = {}
        for i, src in enumerate(self.config.sources):
            if src.is_live:
                source = open_live(SourceSpec(src.name, src.target), src.live, f"dn{i + 1}")
                o = source.options
                nodes[source.node] = NodeAccess(
                    source.node,
                    o.conninfo,
                    o.publication,
                    source.binary,
                    source.mode,
                    source.enum_types,
                    when_needed=src.live.snapshot == "when_needed",
                )
        if not nodes:
            return
        from csnd.service.knowntables import PublishedTables

        self.feed.servicer.known_tables.published = PublishedTables(
            [(a.node, a.conninfo, a.publication) for a in nodes.values()]
        )
        jobs = IncrementalSnapshots(
            self.config.changelog,
            self.log,
            self.windows,
            nodes,
            chunk_rows=self.config.snapshot_chunk_rows or CHUNK_ROWS,
        )
        jobs.load()
        self.incremental = jobs
        self.feed.servicer.snapshots = jobs

    def _check_snapshot(self, state: SnapshotState) -> None:
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
        assert self.log is not None
        if state.state != "incomplete":
            return
        m = state.marker or {}
        live = [(i, s) for i, s in enumerate(self.config.sources) if s.is_live]
        if live and all(s.live.snapshot in ("initial", "never") for _, s in live):
            log.warning(
                "changelog %s holds an initial snapshot cut short (csn %d, chunk %s of %s), never shown to a "
                "reader: taking it again from the start with new slots",
                os.path.abspath(self.config.changelog),
                state.csn,
                m.get("chunk"),
                m.get("chunks"),
            )
            for i, src in live:
                if src.live.snapshot == "initial":
                    _drop_own_slot(open_live(SourceSpec(src.name, src.target), src.live, f"dn{i + 1}"))
            self.log.clear()
            return
        directory = os.path.abspath(self.config.changelog)
        slots = ", ".join(
            f"{s.live.slot} (csnd slot drop {s.live.slot} {_safe_target(s)})"
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

    def _watch(self, inputs: list[NodeInput], runtime: CoordinatorRuntime) -> None:
        for p in inputs:
            watch = self.watches.get(p.node)
            if watch is None:
                src = next((s for s in self.config.sources if s.name == p.node), None)
                where = (
                    _safe_target(src) if src is not None else getattr(getattr(p, "source", None), "path", "")
                )
                watch = self.watches[p.node] = NodeWatch(p.node, p.mode, str(where or ""))
                live = getattr(getattr(p, "source", None), "options", None)
                if live is not None and getattr(live, "slot", None):
                    watch.slot = SlotMonitor(live.conninfo, live.slot)
                    watch.slot.start()
            watch.attach(p, runtime.trackers.get(p.node), _pending_of(runtime, p.node))

    # --- status -------------------------------------------------------------------------

    def node_states(self) -> list[NodeState]:
        with self._lock:
            watches = list(self.watches.values())
        return [w.snapshot() for w in watches]

    def totals(self) -> dict[str, int]:
        runtime, sink = self.runtime, self.sink
        tx, ch = self._appended
        if sink is not None:
            tx += sink.transactions
        if runtime is not None:
            ch += runtime.changes_out
        # re-sent and already held: dropped by the senders (resume_csn), or by the sink
        resumed = sum(w.stats().dropped_resumed for w in self.watches.values())
        return {
            "transactions": tx,
            "changes": ch,
            "skipped": self.skipped + resumed + (sink.skipped if sink is not None else 0),
            "restarts": self.restarts,
        }

    def status_document(self) -> dict[str, Any]:
        """The gRPC Status answer as JSON (proto3 field names): /api/status and /metrics read this."""
        assert self.feed is not None
        response = self.feed.servicer.snapshot()
        totals = self.totals()
        response.totals.transactions = totals["transactions"]
        response.totals.changes = totals["changes"]
        response.totals.skipped = totals["skipped"]
        response.totals.restarts = totals["restarts"]
        progress = self.snapshot_progress
        if progress.state:
            response.snapshot.state = progress.state
            response.snapshot.first_csn = progress.first_csn
            response.snapshot.last_csn = progress.last_csn
            response.snapshot.tables.extend(
                pb.SnapshotTableStatus(**dataclasses.asdict(t)) for t in progress.tables()
            )
        document: dict[str, Any] = json_format.MessageToDict(
            response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        return document

    def readiness(self) -> tuple[bool, str]:
        """`/readyz`: (ready, one line saying so or why not); cheap, from any thread.

        Ready: the ready line is out (changelog open, slots prepared), the
        pipeline is running or its sources ended, no node failed, and none
        has been reconnecting or restarting for longer than
        `readiness_grace_s`.
        """
        if self._stop.is_set():
            return False, "stopping"
        if self._starting:
            return False, f"starting: {self._starting}"
        if self._failure is not None:
            return False, "the pipeline failed and the service is ending (its error is on stderr)"
        if self._done.is_set():
            return True, "ready: every source ended; serving the changelog"
        if self._snapshot is not None:
            return True, "ready: taking the initial snapshot (consumers read it as it is written)"
        nodes = self.node_states()
        if len(nodes) < len(self.config.sources):
            return False, "starting: the pipeline is opening its sources"
        why = unready_nodes(nodes, self.config.readiness_grace_s)
        if why is not None:
            return False, why
        return True, "ready"

    # --- the pipeline -------------------------------------------------------------------

    def _pipeline(self) -> None:
        """Runs the pipeline until the sources end, a stop, or a failure restarts cannot mend."""
        assert self.log is not None
        failures: deque[float] = deque()
        try:
            snapshot = self._snapshot
            if snapshot is not None:
                try:
                    end = snapshot.run(self.log)
                except SnapshotError:
                    if not self._stop.is_set():
                        raise
                    log.warning(
                        "stopped in the middle of the initial snapshot: the changelog holds part of it, "
                        "shown to no reader; the next start takes it again"
                    )
                    return
                self.log.release_readers()
                self._snapshot = None
                log.info("initial snapshot complete: csn %d to %d", self.snapshot_progress.first_csn, end)
            while not self._stop.is_set():
                try:
                    self._run_once()
                    return  # every source ended: keep serving what the changelog holds
                except _TRANSIENT as e:
                    if self._stop.is_set():
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
                    node = getattr(e, "node", None)
                    for w in self.watches.values():
                        if node is None or w.name == node:
                            w.state, w.error = "restarting", str(e)
                            w.restarts += 1
                    wait = self.restart_backoff.failed()
                    assert wait is not None  # (no give-up by time: the window above decides)
                    log.warning(
                        "pipeline failed: %s; restarting from CSN %d in %.1fs",
                        e,
                        self.log.durable_csn,
                        wait,
                    )
                    if self._stop.wait(wait):
                        return
        except BaseException as e:  # (reported by the main thread)
            self._failure = e
            for w in self.watches.values():
                if getattr(e, "node", None) in (None, w.name):
                    w.state, w.error = "failed", str(e)
        finally:
            self._done.set()

    def _run_once(self) -> None:
        assert self.log is not None
        log_ = self.log
        log_.sync()  # (what an earlier run appended is durable before anyone resumes after it)
        resume = log_.durable_csn
        snapshot_csn = 0
        if snapshot_state(_newest_record(log_)).state == "complete":
            # Nothing streamed is held yet: the senders drop nothing, and the sink
            # fails on a CSN the snapshot's records took (csnd.service.sink).
            resume, snapshot_csn = 0, log_.durable_csn
        inputs = self._open_sources(resume)
        sink = ChangelogSink(log_, snapshot_csn=snapshot_csn, windows=self.windows)
        runtime = CoordinatorRuntime(inputs, sink, confirm_interval_s=DURABLE_INTERVAL_S, durable_always=True)
        with self._lock:
            if self.sink is not None and self.runtime is not None:
                tx, ch = self._appended
                self._appended = (tx + self.sink.transactions, ch + self.runtime.changes_out)
                self.skipped += self.sink.skipped
            self.sink, self.runtime = sink, runtime
            self._watch(inputs, runtime)
        if self._stop.is_set():
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
        for w in self.watches.values():
            if w.state != "failed":
                w.state = "ended"
        for p in inputs:
            p.stop()

    # --- the whole run ------------------------------------------------------------------

    def run(self) -> int:
        cfg = self.config
        token = read_token_file(cfg.token_file) if cfg.token_file else None
        credentials = read_credentials_file(cfg.credentials_file) if cfg.credentials_file else None
        tls = TlsFiles(cfg.tls_cert, cfg.tls_key) if cfg.tls_cert and cfg.tls_key else None
        thresholds = None
        if cfg.http:
            from csnd.service.http import Thresholds

            thresholds = Thresholds.from_mapping(cfg.thresholds)
        os.makedirs(cfg.changelog, exist_ok=True)
        self.log = Changelog(
            cfg.changelog,
            retention_bytes=cfg.retention_bytes,
            retention_hours=cfg.retention_hours,
            retention_hold_bytes=cfg.retention_hold_bytes,
            retention_hold_hours=cfg.retention_hold_hours,
        )
        snapshot = snapshot_state(_newest_record(self.log))
        if snapshot.state == "incomplete":
            self.log.hold_readers(0)  # (an initial snapshot cut short: shown to no one; see _check_snapshot)
        try:
            self._starting = "starting the changefeed"
            subscriptions = SubscriptionStore(cfg.changelog)
            self.feed = start_changefeed(
                self.log,
                listen=cfg.listen,
                token=token,
                tls=tls,
                status=self.node_states,
                subscriptions=subscriptions,
                directory=os.path.abspath(cfg.changelog),
                serving=False,
                health_needs_token=cfg.health_needs_token,
                settings=_feed_settings(cfg),
                credentials=Credentials(credentials) if credentials else None,
                limits=StreamLimits(cfg.max_streams, cfg.max_streams_per_peer),
                databases=node_databases(cfg.sources),
            )
            if cfg.http:
                # Up before the slots are prepared (which may wait long for a new slot's
                # consistent point): /healthz answers, /readyz says what it waits for.
                from csnd.service.http import DashboardServer

                self.http = DashboardServer(
                    cfg.http,
                    self.status_document,
                    token=token,
                    credentials=Credentials(credentials) if credentials else None,
                    thresholds=thresholds,
                    ready=self.readiness,
                    tls=tls,
                    allowed_hosts=cfg.http_allowed_hosts,
                )
                self.http.start()
            self._starting = "checking the slots and the changelog"
            # (first: a snapshot taken again drops its slots and empties the changelog)
            self._check_snapshot(snapshot)
            live = [(s.name or f"dn{i + 1}", s.target, s.live.slot or "") for i, s in enumerate(cfg.sources)]
            check_slots_kept(
                [n for n, s in zip(live, cfg.sources, strict=True) if s.is_live],
                os.path.abspath(cfg.changelog),
                self.log.durable_csn,
            )
            if cfg.parquet_dir:
                from csnd.service.parquet import ParquetExport

                self.parquet = ParquetExport(self.log, cfg.parquet_dir, on_failure=self._export_failed)
                self.parquet.start()
            self._starting = "preparing the slots (a new slot waits for the transactions open on its server)"
            self._prepare_slots()
            self._open_incremental()
            self.feed.set_serving()
            pipeline = threading.Thread(target=self._pipeline, name="csnd-pipeline", daemon=True)
            try:  # (from the ready line on, a stop is the clean one, even at once)
                self._say(f"csnd serve: listening on {self.feed.address}")
                if self.http is not None:
                    self._say(f"csnd serve: dashboard on {self.http.url}")
                pipeline.start()
                if self.incremental is not None:
                    self.incremental.start()
                self._starting = ""
                self._wait()
            except KeyboardInterrupt:
                log.info("stopping: making what was written durable and confirming the slots")
            self.stop()
            return self._finish(pipeline)
        finally:
            self._close()

    def _say(self, line: str) -> None:
        print(line, file=self.stdout, flush=True)

    def _wait(self) -> None:
        """Until a stop request (SIGTERM/Ctrl-C arrive as KeyboardInterrupt: `run()` takes them) or a failure."""
        while not self._stop.is_set():
            if not self._done.is_set():
                self._done.wait(0.5)
            elif self._failure is not None:
                return
            else:  # the sources ended: serve what the changelog holds until told to stop
                self._stop.wait(0.5)

    def stop(self) -> None:
        """Stop taking input (any thread); `run()` then makes durable, confirms and returns 0."""
        self._stop.set()
        snapshot = self._snapshot
        if snapshot is not None:
            snapshot.stop()
        runtime = self.runtime
        if runtime is not None:
            runtime.request_stop()
        if self.incremental is not None:  # (after the pipeline's stop: this one waits for its thread)
            self.incremental.stop()

    def _finish(self, pipeline: threading.Thread) -> int:
        ignore_stop_signals()  # while the last durable step and confirmations run
        if pipeline.ident is not None:  # (a stop at the ready line may come before it began)
            pipeline.join(timeout=60)
        if self._failure is not None and not isinstance(self._failure, KeyboardInterrupt):
            raise self._failure
        return 0

    def _export_failed(self, e: BaseException) -> None:
        """The Parquet export stopped (its thread): the service ends with its error line."""
        if self._failure is None:
            self._failure = e
        self.stop()

    def _close(self) -> None:
        if self.parquet is not None:  # (before the changelog closes: it reads it, and writes what is pending)
            self.parquet.stop()
        for w in self.watches.values():
            if w.slot is not None:
                w.slot.stop()
        if self.http is not None:
            self.http.stop()
        if self.feed is not None:
            self.feed.stop()
        if self.log is not None:
            if self.sink is not None:  # (its sync thread first: one sync at a time)
                self.sink.stop()
            with contextlib.suppress(CsndError, OSError):
                self.log.sync()
            self.log.close()


def _feed_settings(cfg: ServeConfig) -> FeedSettings:
    """The changefeed's settings the configuration changes (the rest: FeedSettings' defaults)."""
    if cfg.arrow_files_bytes is None:
        return FeedSettings()
    return FeedSettings(arrow_files_bytes=cfg.arrow_files_bytes)


def _drop_own_slot(source: LiveSource) -> None:
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


def _newest_record(changelog: Changelog) -> tuple[int, bytes] | None:
    """The changelog's newest durable record (csn, line), or None when it is empty."""
    newest = changelog.durable_csn
    if newest == 0:
        return None
    return next(iter(changelog.read(newest - 1)), None)


def _pending_of(runtime: CoordinatorRuntime, node: str) -> Callable[[], int]:
    merge = runtime.merge
    return lambda: merge.pending_batches(node)


def run_serve(config: ServeConfig) -> int:
    service = Service(config)
    status = service.run()
    durable = service.log.durable_csn if service.log is not None else 0
    log.info("stopped: the changelog is durable through csn %d", durable, extra={"csn": durable})
    return status
