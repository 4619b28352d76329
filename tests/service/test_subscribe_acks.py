"""`csnd subscribe`'s acknowledgements on a live stream: batched, never ahead of what it wrote out."""

from __future__ import annotations

import os
import select
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from csnd.changelog import Changelog
from csnd.consumers import subscribe as subscribe_cmd
from csnd.consumers.acking import AckPacer
from csnd.consumers.client import ChangefeedClient
from csnd.service import RunningServer
from tests.service.feedkit import FAST, line, serve, txn_tables, wait_for

LIVE_TXNS = 30


class FlushedLines:
    """The subscriber's output (a buffered pipe), counting the lines it has flushed out (line k: csn k)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.flushed = 0
        self._written = 0

    def write(self, data: bytes) -> int:
        self._written += data.count(b"\n")
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()
        self.flushed = self._written


class CountingClient(ChangefeedClient):
    """The real client; each acknowledgement asked for is also written down, with what was flushed by then."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.acks: list[int] = []
        self.flushed_by_then: list[int] = []
        self.out: FlushedLines | None = None

    def ack(self, csn: int) -> None:
        self.acks.append(csn)
        self.flushed_by_then.append(self.out.flushed if self.out is not None else 0)
        super().ack(csn)


def _read_line(fd: int, rest: bytearray) -> bytes:
    """The next line the subscriber wrote to the pipe (fails rather than hangs after 60 s)."""
    while b"\n" not in rest:
        ready, _, _ = select.select([fd], [], [], 60.0)
        assert ready, "the subscriber wrote no line within 60 s"
        chunk = os.read(fd, 1 << 16)
        assert chunk, "the subscriber closed its output"
        rest += chunk
    cut = rest.index(b"\n") + 1
    got = bytes(rest[:cut])
    del rest[:cut]
    return got


@dataclass
class Live:
    feed: CountingClient
    thread: threading.Thread
    log: Changelog
    srv: RunningServer
    pipe: int  # (the read end of the subscriber's stdout)

    def close(self) -> None:
        self.feed.close()
        self.srv.stop()
        self.log.close()
        self.thread.join(60)
        os.close(self.pipe)


def _live(tmp_path: Path, n: int, limit: int) -> Live:
    """A served changelog and a subscriber (`_print`, the command's loop) on a pipe; n transactions,
    each committed only once the one before reached the pipe: the live regime, one at a time."""
    log = Changelog(str(tmp_path / "log"))
    srv = serve(log, settings=FAST)
    feed = CountingClient(srv.address, name="live")
    feed.connect()
    r, w = os.pipe()
    out = os.fdopen(w, "wb", buffering=1 << 16)
    feed.out = FlushedLines(out)

    def run() -> None:
        with out:
            subscribe_cmd._print(feed, feed.out, limit, None)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    rest = bytearray()
    for csn in range(1, n + 1):
        want = line(csn, txn_tables(csn), gid=f"g-{csn}")
        log.append(csn, want)
        log.sync()
        assert _read_line(r, rest) == want + b"\n"
    return Live(feed, t, log, srv, r)


def test_a_live_stream_is_acknowledged_in_batches_not_per_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No acknowledgement falls due by time within the test: what is acknowledged is by count or at the end.
    monkeypatch.setattr(subscribe_cmd, "ACK_INTERVAL_S", 3600.0, raising=False)
    live = _live(tmp_path, LIVE_TXNS, LIVE_TXNS)
    try:
        live.thread.join(60)
        assert not live.thread.is_alive()
        # One acknowledgement, of the last line, once it was written -- not one per transaction.
        assert live.feed.acks == [LIVE_TXNS]
        live.feed.close()
        status = live.srv.servicer.feed_status()  # (close() waited for the service to store it)
        assert [c.acknowledged_csn for c in status.consumers if c.name == "live"] == [LIVE_TXNS]
    finally:
        live.close()


def test_a_quiet_stream_acknowledges_its_last_line_without_waiting_for_more(tmp_path: Path) -> None:
    # The default interval: acknowledgements come while the stream is quiet, never ahead of the output.
    live = _live(tmp_path, LIVE_TXNS, LIVE_TXNS + 1)
    feed = live.feed
    try:
        wait_for(lambda: feed.acks and feed.acks[-1] == LIVE_TXNS, "the last line's acknowledgement")
        assert live.thread.is_alive()  # (still waiting for its last transaction: acknowledged without it)
        assert all(a <= f for a, f in zip(feed.acks, feed.flushed_by_then, strict=True))
        assert feed.acks == sorted(set(feed.acks))
        live.log.append(LIVE_TXNS + 1, line(LIVE_TXNS + 1, txn_tables(1)))
        live.log.sync()
        live.thread.join(60)
        assert not live.thread.is_alive() and feed.acks[-1] == LIVE_TXNS + 1
    finally:
        live.close()


# --- the pacing itself, against a brute-force oracle ----------------------------------------------

Step = tuple[str, float, int]  # ("flush", dt, lines) or ("look", dt, 0)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["flush", "look"]),
            st.floats(min_value=0.0, max_value=0.3),
            st.integers(min_value=1, max_value=400),
        ),
        max_size=60,
    ),
    st.floats(min_value=0.01, max_value=0.5),
    st.integers(min_value=1, max_value=1000),
)
def test_pacer_acknowledges_only_what_is_written_within_its_bound(
    steps: list[Step], interval: float, every: int
) -> None:
    now = 0.0
    pacer = AckPacer(now, interval, every)
    written = 0  # the newest csn written out
    acked = 0
    last_ack_at = 0.0
    since = 0  # lines written since the last acknowledgement
    for kind, dt, lines in steps:
        now += dt
        if kind == "flush":
            written += lines
            since += lines
            pacer.flushed(written, lines)
        got = pacer.take(now)
        # The oracle: due when something is unacknowledged and the interval or the count is up.
        due = written > acked and (now - last_ack_at >= interval or since >= every)
        assert (got is not None) == due
        if got is not None:
            assert got == written  # (the newest written: never ahead, never an older one)
            acked, last_ack_at, since = got, now, 0
        wait = pacer.due_in(now)
        assert (wait is None) == (written == acked)
        if wait is not None:
            assert 0 < wait <= interval
    assert pacer.take_all(now) == (written if written > acked else None)
