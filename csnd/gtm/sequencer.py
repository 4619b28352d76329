"""The GTM: a global, monotonic commit sequence number (CSN) sequencer.

In a GaussDB-style cluster one global transaction manager hands out the CSNs
that order every commit of every node (docs/design.md section 2, GTM mode).  The
protocol needs only two operations:

- `current()`: the latest CSN handed out.  A writer logs it as the
  *committing* CSN of a transaction entering its commit, and as the value of a
  `tick` watermark; both rely on every later `next()` being strictly larger.
- `next()`: a new CSN, strictly larger than every CSN handed out before.  It is
  a transaction's *commit* CSN.

Two implementations share this interface (`Sequencer`): `Gtm` here, pure (no
clock, no I/O) so the synthetic generator can replay it deterministically and
guarded by a lock so the live writer helper can share it between threads; and
`gtm.pggtm.PgGtm`, a PostgreSQL sequence on a designated server that writer
processes on any machine share.

A sequencer also keeps the writers' *commit log* -- what in-doubt recovery
(`gtm.recovery`) needs to finish a transaction whose writer died mid-commit:
`begin_commit` (the intent: which nodes, from which WAL position, before the
first `committing` marker), `take_csn` (the commit CSN, noted as taken),
`decide_commit` (the commit point: written after
every node prepared, before the first COMMIT PREPARED) and `end_commit` (the
transaction is finished everywhere).  `Gtm` lives in one process and dies with
its writers, so for it they do nothing; `PgGtm` writes them durably.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from csnd.core.ids import Csn


class Sequencer(Protocol):
    """What a writer needs from a GTM (see the module docstring)."""

    def current(self) -> Csn: ...

    def next(self) -> Csn: ...

    def begin_commit(self, gid: str, start_lsns: Mapping[str, int]) -> Csn:
        """Record that `gid` is entering its commit on these nodes; returns `current()`."""
        ...

    def take_csn(self, gid: str) -> Csn:
        """`next()` as `gid`'s commit CSN, noted in its record (for a shared GTM) in the same step."""
        ...

    def decide_commit(self, gid: str, csn: Csn) -> None:
        """Record (durably, for a shared GTM) that `gid` commits with `csn`: the point of no return."""
        ...

    def end_commit(self, gid: str) -> None:
        """`gid` is committed or aborted on every node; its record may go."""
        ...


class Gtm:
    """A thread-safe monotonic CSN sequencer, in process.

    `start` is the value `current()` returns before the first `next()`; the
    first commit CSN is `start + 1`.  CSN 0 is never handed out, so 0 can mean
    "nothing yet" in watermarks.
    """

    __slots__ = ("_csn", "_lock")

    def __init__(self, start: int = 0) -> None:
        if start < 0:
            raise ValueError(f"gtm start CSN must be >= 0, got {start}")
        self._csn = start
        self._lock = threading.Lock()

    def current(self) -> Csn:
        """The latest CSN handed out (the start value if none yet)."""
        with self._lock:
            return Csn(self._csn)

    def next(self) -> Csn:
        """Hand out a new CSN, strictly larger than every earlier one."""
        with self._lock:
            self._csn += 1
            return Csn(self._csn)

    # An in-process GTM dies with its writers: there is nothing to recover.
    def begin_commit(self, gid: str, start_lsns: Mapping[str, int]) -> Csn:
        return self.current()

    def take_csn(self, gid: str) -> Csn:
        return self.next()

    def decide_commit(self, gid: str, csn: Csn) -> None:
        pass

    def end_commit(self, gid: str) -> None:
        pass

    def __repr__(self) -> str:
        return f"Gtm(current={self._csn})"
