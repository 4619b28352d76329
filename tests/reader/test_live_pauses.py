"""A live stream's pauses reach the listener the stream was opened with, in the thread reading it.

The pipeline hands its decoder pool to `LiveSource.events(pauses=...)` so
that a batch gathered downstream goes on when the server has nothing more to
send; the listener is called between two items of the stream, once
everything received has been yielded.
"""

from __future__ import annotations

import threading

from csnd.reader.live import LiveOptions, LiveSource
from csnd.reader.pgoutput.messages import Commit, Keepalive
from csnd.testing import pgworkload as workload
from tests.fixtures.pg import PgDatabase

# Only a safety net, so that a listener never called ends the test instead of hanging it.
GIVE_UP_S = 120.0


class _ClosesAfterCommit:
    """Notes each pause, and whether the transaction's Commit had come out by then; closes the source after it."""

    def __init__(self, source: LiveSource) -> None:
        self.source = source
        self.thread = threading.current_thread()
        self.seen_commit = False  # (set by the loop reading the stream, in this same thread)
        self.pauses: list[bool] = []

    def drained(self) -> None:
        assert threading.current_thread() is self.thread, "a pause is told in the thread reading the stream"
        self.pauses.append(self.seen_commit)
        if self.seen_commit:
            self.source.close()


def test_a_paused_stream_tells_the_listener_it_was_opened_with(pg: PgDatabase) -> None:
    workload.setup(pg.dsn)
    pg.execute("SELECT pg_create_logical_replication_slot('csnd', 'pgoutput')")
    pg.execute("INSERT INTO acct (id, owner, balance) VALUES (1, 'ann', 10)")
    source = LiveSource("dn1", LiveOptions(pg.url, "csnd", "csnd_pub"))
    listener = _ClosesAfterCommit(source)
    safety = threading.Timer(GIVE_UP_S, source.close)
    safety.start()
    try:
        commits = 0
        for _lsn, msg in source.events(pauses=listener):
            # (then only keepalives, until the pause that closes the source)
            assert not listener.seen_commit or isinstance(msg, Keepalive), msg
            if isinstance(msg, Commit):
                commits += 1
                listener.seen_commit = True
    finally:
        safety.cancel()
    assert commits == 1
    assert listener.pauses and listener.pauses[-1], "the pause after the Commit was told"
