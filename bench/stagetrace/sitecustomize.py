"""`python -m bench latency --stages`: when each live transaction passed each stage inside `csnd serve`.

Loaded by the interpreter of every process started with this directory on
PYTHONPATH (the bench puts it there for csnd's processes only); it does
nothing unless CSND_STAGE_TRACE names a file and the process is
`csnd serve`.  It wraps four internal functions of the service, so it
belongs to the bench and breaks loudly (an AttributeError at start) when
they are renamed:

* received -- the reader's commit timestamp check (`checked_commit_times`),
  which every Commit and every scanned run of commits passes as the reader
  thread takes it from the walsender's stream;
* appended -- `SegmentWriter.append_many`, the changelog's append;
* durable, sent -- the service's own histograms' observations
  (`csnd.service.latency`), made after the group commit and as the
  changefeed hands a batch to a stream.

Each is (commit time, seconds since it) with the service's steady clock, so
the bench can cut a rate's window by commit time; the file is written at
exit (`csnd serve` ends on SIGTERM through its stop handlers, which run
atexit).  A sample costs a list append and, for lines, the histogram's own
commit-time parse: well under a microsecond.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

_PG_EPOCH_S = 946_684_800  # 2000-01-01 in Unix seconds: where PostgreSQL's timestamps count from


def _install(path: str) -> None:
    from csnd.changelog import writer
    from csnd.reader import recorded
    from csnd.service import latency

    samples: dict[str, list[tuple[float, float]]] = {
        "received": [],
        "appended": [],
        "durable": [],
        "sent": [],
    }
    now = latency.steady_now
    parse = latency.LatencyHistogram().commit_time
    by_histogram = {id(latency.COMMIT_TO_DURABLE): "durable", id(latency.COMMIT_TO_SENT): "sent"}

    def lines_at(stage: list[tuple[float, float]], lines: Iterable[bytes | str | None]) -> None:
        at = now()
        for line in lines:
            t = parse(line)
            if t is not None:
                stage.append((t, at - t))

    observe_lines = latency.LatencyHistogram.observe_lines

    def traced_observe_lines(self: Any, lines: Iterable[bytes | str | None], at: float | None = None) -> None:
        stage = by_histogram.get(id(self))
        if stage is not None:
            lines = list(lines)
            lines_at(samples[stage], lines)
        observe_lines(self, lines, at)

    latency.LatencyHistogram.observe_lines = traced_observe_lines  # type: ignore[method-assign,assignment]

    append_many = writer.SegmentWriter.append_many

    def traced_append_many(self: Any, csns: Any, lines: Any) -> None:
        lines_at(samples["appended"], lines)
        append_many(self, csns, lines)

    writer.SegmentWriter.append_many = traced_append_many  # type: ignore[method-assign]

    checked = recorded.checked_commit_times
    received = samples["received"]

    def traced_checked(events: Any, node: str, path: str | None = None) -> Iterator[Any]:
        for ev in checked(events, node, path):
            msg: Any = ev[1]
            kind = type(msg).__name__
            if kind == "Commit":
                t = msg.commit_time / 1e6 + _PG_EPOCH_S
                received.append((t, now() - t))
            elif kind == "TxnRun":
                at = now()
                for txn in msg.txns:
                    t = txn.commit_time / 1e6 + _PG_EPOCH_S
                    received.append((t, at - t))
            yield ev

    recorded.checked_commit_times = traced_checked

    def dump() -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(samples, f)

    atexit.register(dump)


_path = os.environ.get("CSND_STAGE_TRACE")
if _path and "serve" in sys.argv[1:2]:
    _install(_path)
