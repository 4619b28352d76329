"""What Status says of each node, read from the running pipeline without waiting on it.

    NodeInput (pipeline / agent) ─┐
    ConfirmTracker (runtime)     ─┼─► NodeWatch.state() ─► NodeState ─► Status, /api/status, /metrics
    SlotMonitor (live nodes)     ─┘

`NodeWatch` keeps, per node, the little history a snapshot cannot give: when
the node was last caught up (everything it had received was durable in the
changelog: its lag in seconds is the time since), and when its watermark last
moved (a watermark that stands still for `STUCK_AFTER_S` while the merge holds
transactions back is "stuck": in GTM mode an idle node moves only with `tick`
markers).  Reading is best effort: every figure comes from a plain attribute
read, so a status request never blocks the pipeline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from csnd.core.errors import SlotLost
from csnd.core.ids import lsn_from_str
from csnd.reader.reconnect import invalidated_how, slot_lost_error
from csnd.runtime.stats import NodeStats
from csnd.service.status import NodeState

log = logging.getLogger(__name__)

# A watermark that has not moved for this long while the merge waits on it is reported stuck.
STUCK_AFTER_S: Final = 30.0
# How many looks at a lagging node are kept to date its oldest unconfirmed data: a day of
# once-a-second looks.  Beyond that the oldest are dropped and the lag reads lower than it is.
BEHIND_SAMPLES: Final = 86_400
# How often each live node's slot is read from pg_replication_slots.  The query is
# cheap, but it is a connection per node: every few seconds is enough to see WAL grow.
SLOT_POLL_S: Final = 5.0


class WatchedInput(Protocol):
    """What a watch reads of a run's node input (csnd.runtime.inputs.NodeInput)."""

    @property
    def confirms(self) -> bool:
        """Whether a slot stands behind it: only then can it lag behind what is confirmed."""

    def stats(self) -> NodeStats: ...


class SafePosition(Protocol):
    """A live node's confirmable position (csnd.runtime.confirm.ConfirmTracker)."""

    @property
    def safe(self) -> int: ...


@dataclass
class SlotReading:
    retained_wal_bytes: int = 0
    wal_status: str = ""
    safe_wal_size: int | None = None
    error: str = ""
    standby: bool | None = None  # the server is in recovery (None: not read yet, or unreachable)


# The WAL a slot holds, from the server's own end of WAL.  A standby has no
# pg_current_wal_lsn() (it fails in recovery): its end is what it has
# received, or replayed when that is further (WAL restored from an archive
# is replayed without being received).
_SLOT_SQL: Final = (
    "SELECT coalesce(CASE WHEN pg_is_in_recovery() THEN greatest(pg_last_wal_receive_lsn(), "
    "pg_last_wal_replay_lsn()) ELSE pg_current_wal_lsn() END - restart_lsn, 0)::int8, "
    "coalesce(wal_status, ''), safe_wal_size, pg_is_in_recovery() "
    "FROM pg_replication_slots WHERE slot_name = %s"
)


class SlotMonitor:
    """Reads a live node's slot (`pg_replication_slots`) every `SLOT_POLL_S` in a thread of its own.

    The thread keeps its connection between reads and makes a new one only
    when it is lost.  A connection a read cost about 35 ms of CPU in this
    process, most of it psycopg's Python holding the GIL, every 5 s: a live
    transaction's hop that wanted the GIL then waited up to the switch
    interval (docs/performance.md, "Live latency").  One query on an open
    connection costs a few milliseconds.
    """

    def __init__(self, conninfo: str, slot: str, interval_s: float = SLOT_POLL_S) -> None:
        self.conninfo = conninfo
        self.slot = slot
        self.interval_s = interval_s
        self.reading = SlotReading()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"csnd-slot-{slot}", daemon=True)
        # The thread's open connection (psycopg's, imported late): None before the first reading or once lost.
        self._conn: Any = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def read_once(self) -> SlotReading:
        """One reading, on a connection of its own (closed after)."""
        try:
            return self.read_kept()
        finally:
            self.close()

    def read_kept(self) -> SlotReading:
        """One reading on the connection kept from the last (a new one if there is none, or it was lost).

        A kept connection that fails (the server restarted, a proxy dropped
        it) is replaced at once, so only a server that cannot be reached
        anew shows an error."""
        import psycopg

        if self._conn is not None:
            try:
                return self._reading(self._conn.execute(_SLOT_SQL, (self.slot,)).fetchone())
            except psycopg.Error:
                self.close()  # (lost: a new one below, within this reading)
        try:
            self._conn = psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5)
            return self._reading(self._conn.execute(_SLOT_SQL, (self.slot,)).fetchone())
        except psycopg.Error as e:
            self.close()
            return SlotReading(error=_first_line(e))

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # (a lost connection may fail to close cleanly)
                conn.close()

    def _reading(self, row: tuple[Any, ...] | None) -> SlotReading:
        if row is None:
            return SlotReading(error=f"slot {self.slot} does not exist")
        return SlotReading(
            int(row[0]), str(row[1]), None if row[2] is None else int(row[2]), "", bool(row[3])
        )

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.reading = self.read_kept()
                self._stop.wait(self.interval_s)
        finally:
            self.close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_slots_kept(slots: Iterable[tuple[str, str, str]], changelog: str, newest_csn: int) -> None:
    """A changelog that holds transactions continues only from slots that still exist, WAL and all.

    `slots` is (node, conninfo, slot) per live source.  When a slot is
    missing, what its node committed after the changelog's last transaction
    from it is gone with the slot's WAL: creating the slot anew
    (`create_slot`) would start at the server's current position and skip
    it silently.  So a missing slot is a `SlotLost` before anything starts.
    A slot the server invalidated (`wal_status` lost) is one too, whatever
    the changelog holds.  A server that cannot be reached is left to the
    slot's own check, which says so.
    """
    import psycopg

    for node, conninfo, slot in slots:
        try:
            with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
                # (invalidation_reason is 17+; through to_jsonb it reads as NULL before)
                row = conn.execute(
                    "SELECT coalesce(wal_status, ''), coalesce(confirmed_flush_lsn::text, ''), "
                    "to_jsonb(s) ->> 'invalidation_reason' "
                    "FROM pg_replication_slots s WHERE slot_name = %s",
                    (slot,),
                ).fetchone()
        except psycopg.Error:
            continue
        if row is not None and row[0] == "lost":
            raise slot_lost_error(
                node,
                slot,
                invalidated_how(str(row[2]) if row[2] is not None else None),
                "wal_status lost",
                lsn_from_str(str(row[1])) if row[1] else 0,
            )
        if row is None and newest_csn > 0:  # (an empty changelog: a new slot misses nothing it held)
            raise SlotLost(
                f"replication slot {slot} does not exist, but changelog {changelog} holds transactions "
                f"up to csn {newest_csn}: the slot was dropped and its WAL is gone, so transactions this node "
                "committed after the changelog's last one from it cannot be delivered (a new slot would skip "
                "them); start with a new changelog directory (or reload the tables from a snapshot) -- or, "
                f"if {node} is new to this changelog, create its slot first: "
                f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')",
                node=node,
            )
        if row is not None and row[1]:  # (where this start picks the node up, for whoever reads the log)
            confirmed = lsn_from_str(str(row[1]))
            after = f"after csn {newest_csn}" if newest_csn > 0 else "into an empty changelog"
            log.info(
                "node %s resumes %s from slot %s at lsn %s",
                node,
                after,
                slot,
                row[1],
                extra={"node": node, "lsn": confirmed, "csn": newest_csn},
            )


class NodeWatch:
    """One node's status over the pipeline runs of a service (a restart keeps the watch)."""

    def __init__(
        self, name: str, mode: str, source: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.mode = mode
        self.source = source
        self.clock = clock
        self.state = "streaming"
        self.error = ""
        self.input: WatchedInput | None = None  # the current run's NodeInput
        self.tracker: SafePosition | None = None  # the current run's ConfirmTracker (nodes that confirm)
        self.slot: SlotMonitor | None = None
        self.waiting_merge: Callable[[], int] = lambda: 0
        self.restarts = 0
        self._caught_up_at = clock()
        # (when, received LSN) since the node was last caught up: where each stretch of the stream not
        # yet confirmed had arrived by.  The lag is the age of the oldest such stretch.
        self._behind: deque[tuple[float, int]] = deque(maxlen=BEHIND_SAMPLES)
        self._watermark = -1
        self._watermark_moved_at = clock()
        self._down_since: float | None = None  # first seen reconnecting or restarting
        # Status is looked at from several threads at once (HTTP, gRPC): one look at a time, so that
        # each look's "now" is no earlier than the times another look stored (re-entrant: a test's
        # clock may look again inside one).
        self._looking = threading.RLock()

    def attach(
        self, node_input: WatchedInput, tracker: SafePosition | None, waiting_merge: Callable[[], int]
    ) -> None:
        self.input, self.tracker, self.waiting_merge = node_input, tracker, waiting_merge
        if self.state != "failed":
            self.state = "streaming"

    def stats(self) -> NodeStats:
        """The current run's statistics of the node (the object every report reads), with the merge's."""
        inp = self.input
        if inp is None:
            return NodeStats(self.name, self.mode)
        own = inp.stats()
        return dataclasses.replace(own, waiting_merge=self.waiting_merge())

    def _lag_since(self, now: float, received: int, confirmed: int) -> float:
        """When the oldest data received but not yet confirmed had arrived (now: none is waiting).

        Not "since the node was last caught up": under a steady flow a few
        hundred bytes are always unconfirmed, and that age grew without end.
        Each look records how far the stream had come; a confirmation past a
        record drops it.  The first record of a stretch takes the moment the
        node was last caught up (the data may be that old), later ones their
        own time, so the figure is at most one look's interval too high.
        """
        behind = self._behind
        if received <= confirmed or self.input is None or not self.input.confirms:
            self._caught_up_at = now
            behind.clear()
            return now
        if not behind:
            behind.append((self._caught_up_at, received))
        elif received > behind[-1][1]:
            behind.append((now, received))
        while len(behind) > 1 and behind[0][1] <= confirmed:
            behind.popleft()
        return behind[0][0]

    def snapshot(self) -> NodeState:
        with self._looking:
            return self._snapshot()

    def _snapshot(self) -> NodeState:
        now = self.clock()
        st = self.stats()
        received = st.received_lsn
        confirmed = int((self.tracker.safe if self.tracker is not None else 0) or st.confirmed_lsn)
        watermark = st.watermark_csn
        if watermark != self._watermark:
            self._watermark, self._watermark_moved_at = watermark, now
        lag_since = self._lag_since(now, received, confirmed)
        slot = self.slot.reading if self.slot is not None else SlotReading()
        waiting = st.waiting_merge
        state = self.state
        if state == "streaming" and st.reconnecting:
            state = "reconnecting"
        if state in ("reconnecting", "restarting"):
            if self._down_since is None:
                self._down_since = now
        else:
            self._down_since = None
        return NodeState(
            name=self.name,
            mode=self.mode,
            state=state,
            received_lsn=received,
            confirmed_lsn=confirmed,
            watermark_csn=watermark,
            lag_bytes=max(received - confirmed, 0),
            lag_seconds=round(max(now - lag_since, 0.0), 3),  # (never negative, whoever looked last)
            stuck=state == "streaming" and waiting > 0 and now - self._watermark_moved_at > STUCK_AFTER_S,
            error=self.error or slot.error,
            transactions=st.released,
            changes=st.decoded_changes,
            retained_wal_bytes=slot.retained_wal_bytes,
            source=self.source,
            queue_depths=tuple(depth for depth, _capacity in st.inboxes),
            decoded_changes=st.decoded_changes,
            restarts=self.restarts,
            waiting_committing=st.waiting_committing,
            waiting_commit=st.waiting_commit,
            waiting_merge=waiting,
            spill_bytes=st.spill_bytes,
            slot_wal_status=slot.wal_status,
            slot_safe_wal_size=-1 if slot.safe_wal_size is None else slot.safe_wal_size,
            down_seconds=0.0 if self._down_since is None else round(now - self._down_since, 3),
            server_role="" if slot.standby is None else ("standby" if slot.standby else "primary"),
        )
